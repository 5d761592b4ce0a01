// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package vpoddra

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestPublisherInAManagerFollowsVPodTopologies: run as the operator runs it (a manager's runnable and a
// reconciler of VPodTopology through the manager's cache), the publisher gives each declared VPodTopology its
// pool within the rebuild window, follows a change of its members, and removes the pool with the object.
func TestPublisherInAManagerFollowsVPodTopologies(t *testing.T) {
	kube, meta, cfg := startAPIServerWithCRDs(t, filepath.Join(repoRoot, "config", "crd", "bases"))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, Logger: testr.New(t)})
	if err != nil {
		t.Fatal(err)
	}
	logger := testr.New(t)
	if err := (&Publisher{Kube: kube, Metadata: meta, Client: mgr.GetClient(), Devices: 2, Log: &logger}).SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mgrCtx, stopMgr := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	defer func() {
		stopMgr()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	c := mgr.GetClient()
	declared := func(name, domain string, nodes ...string) *v1alpha1.VPodTopology {
		v := &v1alpha1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.VPodTopologySpec{Kind: "ualink", Domain: domain}}
		for _, n := range nodes {
			v.Spec.Members = append(v.Spec.Members, v1alpha1.VPodMember{Node: n})
		}
		return v
	}
	a, b := declared("rack-1-vpod-1", "ualink:1/1", "node-a", "node-b"), declared("rack-1-vpod-2", "ualink:1/2", "node-c")
	for _, v := range []*v1alpha1.VPodTopology{a, b} {
		if err := c.Create(ctx, v); err != nil {
			t.Fatalf("creating VPodTopology %s: %v", v.Name, err)
		}
	}
	eventually(t, "both declared vPODs published", func() error {
		now := slicesByName(t, kube)
		for _, v := range []*v1alpha1.VPodTopology{a, b} {
			if err := published(now[SliceName(v.Name)], *v, 2); err != nil {
				return err
			}
		}
		return nil
	})

	if err := c.Get(ctx, client.ObjectKeyFromObject(a), a); err != nil {
		t.Fatal(err)
	}
	a.Spec.Members = append(a.Spec.Members, v1alpha1.VPodMember{Node: "node-d"})
	if err := c.Update(ctx, a); err != nil {
		t.Fatalf("adding a member: %v", err)
	}
	eventually(t, "the added member in a's node selector", func() error { return published(slicesByName(t, kube)[SliceName(a.Name)], *a, 2) })

	if err := c.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b's pool gone with its VPodTopology", func() error {
		if _, ok := slicesByName(t, kube)[SliceName(b.Name)]; ok {
			return fmt.Errorf("slice of deleted vPOD %s still there", b.Name)
		}
		return nil
	})
}
