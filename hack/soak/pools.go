// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
)

// churnNamespace holds the pools that come and go; they select no node, so the agents under test never serve
// them and the main pool's status is never contested.
const churnNamespace = "soak"

// ownedPrefix starts the name of every object the operator makes for a pool.
const ownedPrefix = "fabricxfer-agent-"

func kubeClient(kubeconfig string) (client.Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return c, nil
}

// poolChurn creates a pool, waits until every object it owns exists, deletes it and waits until it and they
// are gone, over and over until stop closes; it always finishes the cycle it is in.
type poolChurn struct {
	kube   client.Client
	cycles atomic.Int64
	// slowest create → all objects, and delete → all gone.
	maxUp, maxDown time.Duration
}

func (p *poolChurn) run(ctx context.Context, stop <-chan struct{}, every time.Duration) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: churnNamespace}}
	if err := p.kube.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", churnNamespace, err)
	}
	for i := 1; ; i++ {
		if err := p.cycle(ctx, fmt.Sprintf("churn-%d", i)); err != nil {
			return fmt.Errorf("pool churn cycle %d: %w", i, err)
		}
		p.cycles.Add(1)
		t := time.NewTimer(every)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

func (p *poolChurn) cycle(ctx context.Context, name string) error {
	pool := &v1alpha1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: churnNamespace},
		Spec: v1alpha1.TransferPoolSpec{
			NodeSelector:      map[string]string{"fabricxfer.io/soak-pool": name},
			Engines:           []v1alpha1.EngineName{"tcp"},
			AllowedNamespaces: []string{churnNamespace},
			Agent:             v1alpha1.AgentSpec{HeartbeatSeconds: 2},
		},
	}
	t0 := time.Now()
	if err := p.kube.Create(ctx, pool); err != nil {
		return fmt.Errorf("creating pool %s: %w", name, err)
	}
	want := ownedNames(churnNamespace, name)
	if err := poll(ctx, 60*time.Second, fmt.Sprintf("pool %s's objects to exist", name), func() (bool, string, error) {
		have, err := ownedObjects(ctx, p.kube)
		if err != nil {
			return false, "", err
		}
		var missing []string
		for _, w := range want {
			if !have[w] {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0, "missing " + strings.Join(missing, ", "), nil
	}); err != nil {
		return err
	}
	p.maxUp = max(p.maxUp, time.Since(t0))
	t1 := time.Now()
	if err := p.kube.Delete(ctx, pool); err != nil {
		return fmt.Errorf("deleting pool %s: %w", name, err)
	}
	if err := poll(ctx, 90*time.Second, fmt.Sprintf("pool %s and its objects to be gone", name), func() (bool, string, error) {
		err := p.kube.Get(ctx, client.ObjectKeyFromObject(pool), &v1alpha1.TransferPool{})
		if err == nil {
			return false, "the pool still exists", nil
		}
		if !apierrors.IsNotFound(err) {
			return false, "", err
		}
		have, err := ownedObjects(ctx, p.kube)
		if err != nil {
			return false, "", err
		}
		var left []string
		for _, w := range want {
			if have[w] {
				left = append(left, w)
			}
		}
		return len(left) == 0, "left: " + strings.Join(left, ", "), nil
	}); err != nil {
		return err
	}
	p.maxDown = max(p.maxDown, time.Since(t1))
	return nil
}

// ownedNames are the objects the operator makes for pool ns/name, as ownedObjects names them: the agents,
// their ServiceAccount and certificates in the agents' namespace, their Role and RoleBinding in the pool's,
// and a ClusterRoleBinding.
func ownedNames(ns, name string) []string {
	n, agents := controllers.AgentObjectName(ns, name), controllers.DefaultAgentNamespace
	return []string{
		"DaemonSet " + agents + "/" + n, "ServiceAccount " + agents + "/" + n,
		"Secret " + agents + "/" + n + "-tls", "Secret " + agents + "/" + n + "-tls-ca",
		"Role " + ns + "/" + n, "RoleBinding " + ns + "/" + n, "ClusterRoleBinding " + n,
	}
}

// ownedObjects lists every object in the cluster whose name has the operator's prefix, as "Kind ns/name" (or
// "Kind name" for cluster-scoped ones).
func ownedObjects(ctx context.Context, c client.Client) (map[string]bool, error) {
	out := map[string]bool{}
	add := func(kind string, m metav1.Object) {
		if !strings.HasPrefix(m.GetName(), ownedPrefix) {
			return
		}
		if m.GetNamespace() == "" {
			out[kind+" "+m.GetName()] = true
		} else {
			out[kind+" "+m.GetNamespace()+"/"+m.GetName()] = true
		}
	}
	var (
		ds  appsv1.DaemonSetList
		sa  corev1.ServiceAccountList
		sec corev1.SecretList
		r   rbacv1.RoleList
		rb  rbacv1.RoleBindingList
		cr  rbacv1.ClusterRoleList
		crb rbacv1.ClusterRoleBindingList
	)
	for _, l := range []client.ObjectList{&ds, &sa, &sec, &r, &rb, &cr, &crb} {
		if err := c.List(ctx, l); err != nil {
			return nil, fmt.Errorf("listing %T: %w", l, err)
		}
	}
	for i := range ds.Items {
		add("DaemonSet", &ds.Items[i])
	}
	for i := range sa.Items {
		add("ServiceAccount", &sa.Items[i])
	}
	for i := range sec.Items {
		add("Secret", &sec.Items[i])
	}
	for i := range r.Items {
		add("Role", &r.Items[i])
	}
	for i := range rb.Items {
		add("RoleBinding", &rb.Items[i])
	}
	for i := range cr.Items {
		add("ClusterRole", &cr.Items[i])
	}
	for i := range crb.Items {
		add("ClusterRoleBinding", &crb.Items[i])
	}
	return out, nil
}

// orphans lists owned objects that belong to no pool in keep, and pools left in the churn namespace.
func orphans(ctx context.Context, c client.Client, keep [][2]string) ([]string, error) {
	have, err := ownedObjects(ctx, c)
	if err != nil {
		return nil, err
	}
	for _, k := range keep {
		for _, n := range ownedNames(k[0], k[1]) {
			delete(have, n)
		}
	}
	var left []string
	for k := range have {
		left = append(left, k)
	}
	var pools v1alpha1.TransferPoolList
	if err := c.List(ctx, &pools, client.InNamespace(churnNamespace)); err != nil {
		return nil, fmt.Errorf("listing pools in %s: %w", churnNamespace, err)
	}
	for _, p := range pools.Items {
		left = append(left, "TransferPool "+p.Namespace+"/"+p.Name)
	}
	sort.Strings(left)
	return left, nil
}

// poll calls cond every 250 ms until it holds, it errs, or limit passes; the error then says what was last seen.
func poll(ctx context.Context, limit time.Duration, what string, cond func() (bool, string, error)) error {
	deadline := time.Now().Add(limit)
	for {
		ok, seen, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not within %s (%s)", what, limit, seen)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}
