// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// waitAgentsCondition waits for the pool's AgentsReady condition with the status and reason, written for the
// pool's current generation, and returns it.
func waitAgentsCondition(t *testing.T, c client.Client, pool *fxv1.TransferPool, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	return waitPoolCondition(t, c, pool, fxv1.ConditionAgentsReady, status, reason)
}

// agentsKey is where the pool's agent DaemonSet and ServiceAccount live.
func agentsKey(pool *fxv1.TransferPool) client.ObjectKey {
	return client.ObjectKey{Namespace: testAgentNamespace, Name: agentName(pool)}
}

// setDaemonSetStatus writes the status of the pool's agent DaemonSet as the DaemonSet controller (which does
// not run here) would.
func setDaemonSetStatus(t *testing.T, c client.Client, pool *fxv1.TransferPool, set func(ds *appsv1.DaemonSet)) {
	t.Helper()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(context.Background(), agentsKey(pool), ds); err != nil {
			return err
		}
		set(ds)
		return c.Status().Update(context.Background(), ds)
	}); err != nil {
		t.Fatalf("writing the DaemonSet's status: %v", err)
	}
}

// updatePool changes the pool's spec, retrying while the operator writes its status.
func updatePool(t *testing.T, c client.Client, pool *fxv1.TransferPool, change func(p *fxv1.TransferPool)) *fxv1.TransferPool {
	t.Helper()
	var got *fxv1.TransferPool
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if got, err = getPool(c, pool); err != nil {
			return err
		}
		change(got)
		return c.Update(context.Background(), got)
	}); err != nil {
		t.Fatalf("updating pool: %v", err)
	}
	return got
}

func TestPoolOwnsAgentDaemonSetAndRBAC(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "owns")
	name := AgentObjectName(ns, "kv")
	inAgents := client.ObjectKey{Namespace: testAgentNamespace, Name: name}

	// The agents, their identity and their certificates live in the operator's namespace, never the tenant's.
	ds := &appsv1.DaemonSet{}
	eventually(t, settle, "agent DaemonSet", func() error { return c.Get(ctx, inAgents, ds) })
	if got := ds.Spec.Template.Spec.NodeSelector["fabricxfer.io/test-group"]; got != "owns" {
		t.Errorf("DaemonSet node selector = %v, want the pool's", ds.Spec.Template.Spec.NodeSelector)
	}
	if len(ds.Spec.Template.Spec.Tolerations) != 1 || ds.Spec.Template.Spec.Tolerations[0].Key != "nvidia.com/gpu" {
		t.Errorf("DaemonSet tolerations = %v, want the pool's", ds.Spec.Template.Spec.Tolerations)
	}
	if ds.Spec.Template.Spec.ServiceAccountName != name {
		t.Errorf("agents run as %q, want the pool's own ServiceAccount %q", ds.Spec.Template.Spec.ServiceAccountName, name)
	}
	for _, obj := range []client.Object{&corev1.ServiceAccount{}, &rbacv1.ClusterRoleBinding{}} {
		key := inAgents
		if _, cluster := obj.(*rbacv1.ClusterRoleBinding); cluster {
			key = client.ObjectKey{Name: name}
		}
		eventually(t, settle, fmt.Sprintf("%T of the pool", obj), func() error {
			if err := c.Get(ctx, key, obj); err != nil {
				return err
			}
			if l := obj.GetLabels(); l[fxv1.LabelPoolName] != "kv" || l[fxv1.LabelPoolNamespace] != ns {
				return fmt.Errorf("labels %v do not name the pool", l)
			}
			return nil
		})
	}
	crb := &rbacv1.ClusterRoleBinding{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, crb); err != nil {
		t.Fatal(err)
	}
	if crb.RoleRef.Name != AgentClusterRole || len(crb.Subjects) != 1 || crb.Subjects[0].Namespace != testAgentNamespace {
		t.Errorf("ClusterRoleBinding binds %s to %v, want %s to the agents' ServiceAccount", crb.RoleRef.Name, crb.Subjects, AgentClusterRole)
	}
	// In the pool's namespace only what lets agents read the pool and renew Leases, owned by the pool.
	for _, obj := range []client.Object{&rbacv1.Role{}, &rbacv1.RoleBinding{}} {
		key := client.ObjectKey{Namespace: ns, Name: name}
		eventually(t, settle, fmt.Sprintf("%T owned by the pool", obj), func() error {
			if err := c.Get(ctx, key, obj); err != nil {
				return err
			}
			refs := obj.GetOwnerReferences()
			if len(refs) != 1 || refs[0].Kind != "TransferPool" || refs[0].Name != "kv" || refs[0].Controller == nil || !*refs[0].Controller {
				return fmt.Errorf("owner references %v", refs)
			}
			return nil
		})
	}
	// The agents' Secret holds the CA bundle and no key: each agent's key stays on its node.
	eventually(t, settle, "agent certificates", func() error {
		s := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: name + "-tls"}, s); err != nil {
			return err
		}
		if len(s.Data["ca.crt"]) == 0 || len(s.Data) != 1 {
			return fmt.Errorf("secret holds %d keys, want only ca.crt", len(s.Data))
		}
		return nil
	})
	for _, list := range []client.ObjectList{&appsv1.DaemonSetList{}, &corev1.SecretList{}, &corev1.ServiceAccountList{}} {
		if err := c.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{fxv1.LabelPoolName: "kv"}); err != nil {
			t.Fatal(err)
		}
		if n := meta.LenList(list); n != 0 {
			t.Errorf("%d %T of the pool in the tenant's namespace %s, want none", n, list, ns)
		}
	}

	// A changed pool changes the DaemonSet (retrying while the operator writes status).
	var got *fxv1.TransferPool
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if got, err = getPool(c, pool); err != nil {
			return err
		}
		got.Spec.NodeSelector = map[string]string{"fabricxfer.io/test-group": "owns-2"}
		got.Spec.Agent.HeartbeatSeconds = 5
		return c.Update(ctx, got)
	}); err != nil {
		t.Fatalf("updating pool: %v", err)
	}
	eventually(t, settle, "DaemonSet follows the pool", func() error {
		if err := c.Get(ctx, inAgents, ds); err != nil {
			return err
		}
		if ds.Spec.Template.Spec.NodeSelector["fabricxfer.io/test-group"] != "owns-2" {
			return fmt.Errorf("node selector %v", ds.Spec.Template.Spec.NodeSelector)
		}
		if !strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), "--heartbeat=5s") {
			return fmt.Errorf("args %v", ds.Spec.Template.Spec.Containers[0].Args)
		}
		return nil
	})

	// Deleting the pool removes what it owns outside its namespace (finalizer, by owner labels).
	if err := c.Delete(ctx, got); err != nil {
		t.Fatalf("deleting pool: %v", err)
	}
	eventually(t, settle, "pool and what it owned outside its namespace gone", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &fxv1.TransferPool{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pool still there: %v", err)
		}
		for _, obj := range []struct {
			key client.ObjectKey
			o   client.Object
		}{
			{inAgents, &appsv1.DaemonSet{}}, {inAgents, &corev1.ServiceAccount{}},
			{client.ObjectKey{Namespace: testAgentNamespace, Name: name + "-tls"}, &corev1.Secret{}},
			{client.ObjectKey{Namespace: testAgentNamespace, Name: name + "-tls-ca"}, &corev1.Secret{}},
			{client.ObjectKey{Name: name}, &rbacv1.ClusterRoleBinding{}},
		} {
			if err := c.Get(ctx, obj.key, obj.o); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%T %s still there: %v", obj.o, obj.key, err)
			}
		}
		return nil
	})
}

// AgentsReady is the agents controller's own condition: True for the pool's generation once the DaemonSet is
// applied, AgentsRolledOut once the DaemonSet controller says so, back to rolling out (with a Warning) when an
// agent stops being available; Events only on transitions; the other controllers' conditions stand beside it.
func TestAgentsReadyFollowsTheDaemonSet(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "agents-ready") // no node carries the group: agents are applied all the same
	cond := waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
	if !strings.Contains(cond.Message, testAgentNamespace+"/"+agentName(pool)) {
		t.Errorf("the condition does not name the DaemonSet: %q", cond.Message)
	}
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventAgentsCreated, agentName(pool), "generation 1")
	eventually(t, settle, "every controller's conditions side by side", func() error {
		p, err := getPool(c, pool)
		if err != nil {
			return err
		}
		for _, typ := range []string{fxv1.ConditionReady, fxv1.ConditionProgressing, fxv1.ConditionDegraded, fxv1.ConditionAgentsReady, fxv1.ConditionCertificatesReady} {
			if meta.FindStatusCondition(p.Status.Conditions, typ) == nil {
				return fmt.Errorf("no %s in %+v", typ, p.Status.Conditions)
			}
		}
		return nil
	})

	// The DaemonSet controller reports the rollout done.
	setDaemonSetStatus(t, c, pool, func(ds *appsv1.DaemonSet) {
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: 2, CurrentNumberScheduled: 2,
			UpdatedNumberScheduled: 2, NumberReady: 2, NumberAvailable: 2}
	})
	cond = waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRolledOut)
	if !strings.Contains(cond.Message, "every node it schedules to (2)") {
		t.Errorf("rolled out condition %q", cond.Message)
	}
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventAgentsRolledOut, "every node it schedules to (2)")

	// An agent stops being available.
	setDaemonSetStatus(t, c, pool, func(ds *appsv1.DaemonSet) { ds.Status.NumberAvailable, ds.Status.NumberReady = 1, 1 })
	waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeWarning, EventAgentsUnavailable, "2/2 agents updated, 1/2 available")

	// A status change that moves no condition records nothing more.
	setDaemonSetStatus(t, c, pool, func(ds *appsv1.DaemonSet) { ds.Status.NumberReady = 0 })
	time.Sleep(2 * time.Second)
	for reason, want := range map[string]int{EventAgentsCreated: 1, EventAgentsRolledOut: 1, EventAgentsUnavailable: 1, EventAgentsRestored: 0, EventAgentsRecreated: 0} {
		if n := countEvents(t, c, ns, "TransferPool", "kv", reason); n != want {
			t.Errorf("%d %s Events, want %d", n, reason, want)
		}
	}

	// A new generation is applied and announced; the condition follows it.
	updatePool(t, c, pool, func(p *fxv1.TransferPool) { p.Spec.Agent.HeartbeatSeconds = 5 })
	cond = waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
	if cond.ObservedGeneration != 2 {
		t.Errorf("condition of generation %d, want 2", cond.ObservedGeneration)
	}
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventAgentsUpdated, "generation 2")
	ds := &appsv1.DaemonSet{}
	if err := c.Get(context.Background(), agentsKey(pool), ds); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--heartbeat=5s") {
		t.Errorf("the DaemonSet does not run generation 2: %v", ds.Spec.Template.Spec.Containers[0].Args)
	}
}

// Whoever edits or deletes a pool's agent DaemonSet sees it restored, and a Warning on the pool says which.
func TestEditedOrDeletedDaemonSetIsRestored(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "agents-restore")
	waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)

	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, agentsKey(pool), ds); err != nil {
			return err
		}
		ds.Spec.Template.Spec.Containers[0].Image = "attacker.example/agent:v1"
		ds.Spec.Template.Spec.NodeSelector = map[string]string{"fabricxfer.io/test-group": "elsewhere"}
		return c.Update(ctx, ds)
	}); err != nil {
		t.Fatalf("editing the DaemonSet: %v", err)
	}
	var uid string
	eventually(t, settle, "the edited DaemonSet restored", func() error {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, agentsKey(pool), ds); err != nil {
			return err
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != testAgentSettings.Image {
			return fmt.Errorf("image %q", img)
		}
		if sel := ds.Spec.Template.Spec.NodeSelector["fabricxfer.io/test-group"]; sel != "agents-restore" {
			return fmt.Errorf("node selector %v", ds.Spec.Template.Spec.NodeSelector)
		}
		uid = string(ds.UID)
		return nil
	})
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeWarning, EventAgentsRestored, "differed from what generation 1")

	if err := c.Delete(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNamespace, Name: agentName(pool)}}); err != nil {
		t.Fatalf("deleting the DaemonSet: %v", err)
	}
	eventually(t, settle, "the deleted DaemonSet created again", func() error {
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, agentsKey(pool), ds); err != nil {
			return err
		}
		if string(ds.UID) == uid {
			return fmt.Errorf("still the old DaemonSet")
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != testAgentSettings.Image {
			return fmt.Errorf("image %q", img)
		}
		return nil
	})
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeWarning, EventAgentsRecreated, "deleted outside the operator")
	waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
}

// A pool's deletion removes its agents' objects everywhere, then the agents controller's finalizer, and says
// so once. Another finalizer holds the pool here, so what the operator's controllers left is visible.
func TestPoolDeletionRemovesAgentObjectsAndFinalizer(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	const hold = "example.com/hold"
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv", Finalizers: []string{hold}},
		Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{"fabricxfer.io/test-group": "agents-delete"}}}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	const perPool = 7 // DaemonSet, ServiceAccount, two Secrets, Role, RoleBinding, ClusterRoleBinding
	eventually(t, settle, "every object of the pool and both operator finalizers", func() error {
		if n := ownedObjects(t, c, pool); n != perPool {
			return fmt.Errorf("%d objects, want %d", n, perPool)
		}
		p, err := getPool(c, pool)
		if err != nil {
			return err
		}
		if !slices.Contains(p.Finalizers, poolFinalizer) || !slices.Contains(p.Finalizers, certFinalizer) {
			return fmt.Errorf("finalizers %v", p.Finalizers)
		}
		return nil
	})

	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "the agents' objects and the operator's finalizers gone", func() error {
		p, err := getPool(c, pool)
		if err != nil {
			return err
		}
		if !slices.Equal(p.Finalizers, []string{hold}) {
			return fmt.Errorf("finalizers %v, want only %s", p.Finalizers, hold)
		}
		if n := ownedObjects(t, c, pool); n != 0 {
			return fmt.Errorf("%d objects left", n)
		}
		return nil
	})
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventAgentsCleanedUp, "DaemonSet, ServiceAccount and RBAC are gone")
	time.Sleep(time.Second)
	if n := countEvents(t, c, ns, "TransferPool", "kv", EventAgentsCleanedUp); n != 1 {
		t.Errorf("%d AgentsCleanedUp Events, want 1", n)
	}

	p, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	p.Finalizers = nil
	if err := c.Update(ctx, p); err != nil {
		t.Fatalf("releasing the pool: %v", err)
	}
	eventually(t, settle, "the pool gone", func() error {
		if _, err := getPool(c, pool); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}

// Spec values the agents depend on that the operator or the API server refuses end in an AgentsReady
// condition that says which value and why, never in a crash: the operator keeps serving the pool and
// follows the next generation.
func TestHostileAgentValuesAnsweredByAgentsReady(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	// Pools of this test select no node, so they never contest the nodes of another test's pools.
	nobody := map[string]string{"fabricxfer.io/test-group": "agents-hostile"}
	for _, tc := range refusedAgentSpecs(nobody) {
		t.Run(tc.name, func(t *testing.T) {
			pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tc.name}, Spec: tc.spec}
			if err := c.Create(ctx, pool); err != nil {
				t.Fatalf("the CRD refused a pool only the operator should refuse: %v", err)
			}
			cond := waitAgentsCondition(t, c, pool, metav1.ConditionFalse, tc.reason)
			if !strings.Contains(cond.Message, tc.want) || !strings.Contains(cond.Message, "runs no agent") {
				t.Errorf("AgentsReady message %q, want it to say %q and that no agent runs", cond.Message, tc.want)
			}
			eventually(t, settle, "the pool's refusal", func() error {
				got, err := getPool(c, pool)
				if err != nil {
					return err
				}
				cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
				if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != tc.reason || !strings.Contains(cond.Message, tc.want) {
					return fmt.Errorf("Ready %+v, want False/%s saying %q", cond, tc.reason, tc.want)
				}
				return nil
			})
			if n := ownedObjects(t, c, pool); n != 0 {
				t.Errorf("%d objects made for a refused pool, want none", n)
			}
			if err := c.Delete(ctx, pool); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A toleration key the operator passes on and the API server refuses in a DaemonSet: the apply error is
	// the condition (and the pool's Ready), the pool is retried, and a corrected spec runs.
	t.Run("toleration-the-api-server-refuses", func(t *testing.T) {
		pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad-toleration"},
			Spec: fxv1.TransferPoolSpec{NodeSelector: nobody,
				Tolerations: []corev1.Toleration{{Key: "bad key!", Operator: corev1.TolerationOpExists}}}}
		if err := c.Create(ctx, pool); err != nil {
			t.Fatalf("the CRD refused the toleration: %v", err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
		cond := waitAgentsCondition(t, c, pool, metav1.ConditionFalse, fxv1.ReasonReconcileError)
		if !strings.Contains(cond.Message, "DaemonSet") || !strings.Contains(cond.Message, "tolerations[0].key") {
			t.Errorf("AgentsReady message %q should name the DaemonSet and the refused field", cond.Message)
		}
		waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonReconcileError, "0/0")
		if err := c.Get(ctx, agentsKey(pool), &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
			t.Errorf("a DaemonSet exists for the refused spec: %v", err)
		}
		updatePool(t, c, pool, func(p *fxv1.TransferPool) { p.Spec.Tolerations[0].Key = "nvidia.com/gpu" })
		waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
		waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, "0/0")
	})

	// A running pool turned hostile keeps the agents of its last valid generation as they were.
	t.Run("valid-pool-turned-hostile", func(t *testing.T) {
		pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "turned"}, Spec: fxv1.TransferPoolSpec{NodeSelector: nobody}}
		if err := c.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
		waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
		updatePool(t, c, pool, func(p *fxv1.TransferPool) { p.Spec.Agent.Image = "attacker.example/agent:v2" })
		cond := waitAgentsCondition(t, c, pool, metav1.ConditionFalse, fxv1.ReasonImageNotAllowed)
		if cond.ObservedGeneration != 2 || !strings.Contains(cond.Message, "attacker.example/agent:v2") {
			t.Errorf("condition %+v, want generation 2 naming the image", cond)
		}
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, agentsKey(pool), ds); err != nil {
			t.Fatalf("the last valid generation's DaemonSet: %v", err)
		}
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != testAgentSettings.Image {
			t.Errorf("the DaemonSet runs %q after a refused generation", img)
		}
		updatePool(t, c, pool, func(p *fxv1.TransferPool) { p.Spec.Agent.Image = "" })
		waitAgentsCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
	})
}

// The rollout's reason and message from the DaemonSet as last seen.
func TestRolloutCondition(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "kv", Generation: 3}}
	if reason, msg, _ := rollout(pool, testAgentSettings, nil); reason != fxv1.ReasonAgentsRollingOut || !strings.Contains(msg, "generation 3") {
		t.Errorf("no DaemonSet seen yet: %s %q", reason, msg)
	}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 2}}
	if reason, _, _ := rollout(pool, testAgentSettings, ds); reason != fxv1.ReasonAgentsRollingOut {
		t.Errorf("a DaemonSet its controller has not seen: %s", reason)
	}
	ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: 2, DesiredNumberScheduled: 3, UpdatedNumberScheduled: 3, NumberAvailable: 2}
	if reason, _, progress := rollout(pool, testAgentSettings, ds); reason != fxv1.ReasonAgentsRollingOut || progress != "3/3 agents updated, 2/3 available" {
		t.Errorf("an agent not available: %s %q", reason, progress)
	}
	ds.Status.NumberAvailable = 3
	if reason, msg, _ := rollout(pool, testAgentSettings, ds); reason != fxv1.ReasonAgentsRolledOut || !strings.Contains(msg, "(3)") {
		t.Errorf("rolled out: %s %q", reason, msg)
	}
	ds.Status.UpdatedNumberScheduled = 1
	if reason, _, _ := rollout(pool, testAgentSettings, ds); reason != fxv1.ReasonAgentsRollingOut {
		t.Errorf("two agents on the old spec: %s", reason)
	}
}

// The agents' Events: what an apply did, and the rollout's transitions, once each.
func TestAgentsEventsOnlyOnTransitions(t *testing.T) {
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "kv", Generation: 2}}
	cond := func(s metav1.ConditionStatus, reason string, gen int64) *metav1.Condition {
		return &metav1.Condition{Type: fxv1.ConditionAgentsReady, Status: s, Reason: reason, ObservedGeneration: gen, Message: reason}
	}
	ds := func(gen int64) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: gen, UID: "ds-1"}}
	}
	// recreated is the DaemonSet an apply created after someone deleted the cached one.
	recreated := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 1, UID: "ds-2"}}
	reasons := func(evs []pendingEvent) []string {
		var out []string
		for _, e := range evs {
			out = append(out, e.typ+"/"+e.reason)
		}
		return out
	}
	rolling, rolled := cond(metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut, 2), cond(metav1.ConditionTrue, fxv1.ReasonAgentsRolledOut, 2)
	for _, tc := range []struct {
		name         string
		was          *metav1.Condition
		prior, after *appsv1.DaemonSet
		want         []string
	}{
		{"first apply", nil, nil, ds(1), []string{"Normal/" + EventAgentsCreated}},
		{"after a conflict", cond(metav1.ConditionFalse, fxv1.ReasonConflict, 2), nil, ds(1), []string{"Normal/" + EventAgentsCreated}},
		{"deleted by someone", rolled, nil, ds(1), []string{"Warning/" + EventAgentsRecreated}},
		{"deleted, the cache not told yet", rolling, ds(4), recreated, []string{"Warning/" + EventAgentsRecreated}},
		{"never made, the cache not told of a deletion", nil, ds(4), recreated, []string{"Normal/" + EventAgentsCreated}},
		{"nothing changed", rolled, ds(4), ds(4), nil},
		{"a new generation", cond(metav1.ConditionTrue, fxv1.ReasonAgentsRolledOut, 1), ds(4), ds(5), []string{"Normal/" + EventAgentsUpdated}},
		{"edited by someone", rolling, ds(4), ds(5), []string{"Warning/" + EventAgentsRestored}},
	} {
		if got := reasons(applyEvents(pool, testAgentSettings, tc.was, tc.prior, tc.after)); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name     string
		was, now *metav1.Condition
		want     []string
	}{
		{"rolled out", rolling, rolled, []string{"Normal/" + EventAgentsRolledOut}},
		{"rolled out at first sight", nil, rolled, []string{"Normal/" + EventAgentsRolledOut}},
		{"still rolled out", rolled, rolled, nil},
		{"an agent unavailable", rolled, rolling, []string{"Warning/" + EventAgentsUnavailable}},
		{"a new generation rolling out", cond(metav1.ConditionTrue, fxv1.ReasonAgentsRolledOut, 1), rolling, nil},
		{"still rolling out", rolling, rolling, nil},
		{"refused", rolled, cond(metav1.ConditionFalse, fxv1.ReasonImageNotAllowed, 3), nil},
	} {
		if got := reasons(agentsEvents(tc.was, tc.now, "1/2 available")); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Only what may differ from the applied objects makes the controller apply them again: not a DaemonSet's
// status, which changes all through a rollout.
func TestOnlyObjectChangesReapply(t *testing.T) {
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 3, ResourceVersion: "10", Labels: map[string]string{"a": "b"}}}
	status := ds.DeepCopy()
	status.ResourceVersion, status.Status.NumberReady = "11", 4
	if objectChanged(ds, status) {
		t.Error("a status update counts as a change")
	}
	spec := status.DeepCopy()
	spec.Generation = 4
	if !objectChanged(ds, spec) {
		t.Error("a spec edit does not count")
	}
	labels := status.DeepCopy()
	labels.Labels = nil
	if !objectChanged(ds, labels) {
		t.Error("removed labels do not count")
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "5"}}
	edited := rb.DeepCopy()
	edited.ResourceVersion, edited.Subjects = "6", []rbacv1.Subject{{Kind: "User", Name: "mallory"}}
	if !objectChanged(rb, edited) {
		t.Error("an edited RoleBinding does not count")
	}
}
