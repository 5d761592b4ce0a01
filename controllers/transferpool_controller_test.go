// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

const settle = 20 * time.Second

func newNamespace(t *testing.T, c client.Client) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "fx-test-"}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	return ns.Name
}

// newNodes creates n Node objects labelled group=<group> and removes them when the test ends.
func newNodes(t *testing.T, c client.Client, group string, n int) []string {
	t.Helper()
	var names []string
	for i := range n {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("%s-node-%d", group, i),
			Labels: map[string]string{"fabricxfer.io/test-group": group},
		}}
		if err := c.Create(context.Background(), node); err != nil {
			t.Fatalf("creating node: %v", err)
		}
		names = append(names, node.Name)
		t.Cleanup(func() { _ = c.Delete(context.Background(), node) })
	}
	return names
}

func newPool(t *testing.T, c client.Client, ns, name, group string) *fxv1.TransferPool {
	t.Helper()
	pool := &fxv1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fxv1.TransferPoolSpec{
			NodeSelector: map[string]string{"fabricxfer.io/test-group": group},
			Tolerations:  []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	if err := c.Create(context.Background(), pool); err != nil {
		t.Fatalf("creating pool: %v", err)
	}
	return pool
}

// report writes a TransferNode for node as the agent does: the status (without a heartbeat of its own) and
// the heartbeat Lease, renewed at the given time.
func report(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string, heartbeat time.Time, gpus []fxv1.GPU, engines ...fxv1.EngineName) {
	t.Helper()
	writeReport(t, c, pool, node, nil, gpus, engines...)
	renewLease(t, c, pool, node, heartbeat)
}

// reportWithoutLease writes a TransferNode as agents that predate heartbeat Leases do: lastHeartbeat in the
// status, no Lease.
func reportWithoutLease(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string, heartbeat time.Time, gpus []fxv1.GPU, engines ...fxv1.EngineName) {
	t.Helper()
	writeReport(t, c, pool, node, &metav1.Time{Time: heartbeat}, gpus, engines...)
}

func writeReport(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string, heartbeat *metav1.Time, gpus []fxv1.GPU, engines ...fxv1.EngineName) {
	t.Helper()
	ctx := context.Background()
	tn := &fxv1.TransferNode{}
	err := c.Get(ctx, client.ObjectKey{Name: node}, tn)
	if apierrors.IsNotFound(err) {
		tn = &fxv1.TransferNode{
			ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec:       fxv1.TransferNodeSpec{NodeName: node, PoolNamespace: pool.Namespace, PoolName: pool.Name},
		}
		if err := c.Create(ctx, tn); err != nil {
			t.Fatalf("creating transfer node %s: %v", node, err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), tn) })
	} else if err != nil {
		t.Fatalf("reading transfer node %s: %v", node, err)
	}
	tn.Status.LastHeartbeat = heartbeat
	tn.Status.GPUs = gpus
	tn.Status.Engines = nil
	for _, e := range fxv1.AllEngines {
		avail := false
		for _, want := range engines {
			avail = avail || want == e
		}
		tn.Status.Engines = append(tn.Status.Engines, fxv1.EngineAvailability{Name: e, Available: avail, Reason: "test"})
	}
	if err := c.Status().Update(ctx, tn); err != nil {
		t.Fatalf("writing status of transfer node %s: %v", node, err)
	}
}

// renewLease creates or renews node's heartbeat Lease for pool, as its agent does, with renewTime at.
func renewLease(t *testing.T, c client.Client, pool *fxv1.TransferPool, node string, at time.Time) *coordinationv1.Lease {
	t.Helper()
	ctx := context.Background()
	lease := &coordinationv1.Lease{}
	key := client.ObjectKey{Namespace: pool.Namespace, Name: pool.Name + "-" + node}
	holder, duration, renew := node, int32(3*heartbeatSecondsOf(pool)), metav1.NewMicroTime(at)
	err := c.Get(ctx, key, lease)
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
			Labels: map[string]string{fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: pool.Namespace}}}
		lease.Spec = coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &duration, RenewTime: &renew}
		if err := c.Create(ctx, lease); err != nil {
			t.Fatalf("creating the heartbeat lease of %s: %v", node, err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), lease) })
		return lease
	} else if err != nil {
		t.Fatalf("reading the heartbeat lease of %s: %v", node, err)
	}
	lease.Spec.RenewTime = &renew
	if err := c.Update(ctx, lease); err != nil {
		t.Fatalf("renewing the heartbeat lease of %s: %v", node, err)
	}
	return lease
}

func heartbeatSecondsOf(pool *fxv1.TransferPool) int {
	if pool.Spec.Agent.HeartbeatSeconds > 0 {
		return int(pool.Spec.Agent.HeartbeatSeconds)
	}
	return 10
}

func getPool(c client.Client, pool *fxv1.TransferPool) (*fxv1.TransferPool, error) {
	got := &fxv1.TransferPool{}
	return got, c.Get(context.Background(), client.ObjectKeyFromObject(pool), got)
}

// poolCondition waits for the pool's Ready condition to have the given status and reason and the node counts.
func waitPool(t *testing.T, c client.Client, pool *fxv1.TransferPool, ready metav1.ConditionStatus, reason string, nodes string) *fxv1.TransferPool {
	t.Helper()
	var got *fxv1.TransferPool
	eventually(t, settle, fmt.Sprintf("pool %s Ready=%s/%s nodes %s", pool.Name, ready, reason, nodes), func() error {
		var err error
		if got, err = getPool(c, pool); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
		if cond == nil {
			return fmt.Errorf("no Ready condition yet")
		}
		if cond.Status != ready || cond.Reason != reason || got.Status.Nodes != nodes {
			return fmt.Errorf("Ready=%s/%s nodes=%s (%s)", cond.Status, cond.Reason, got.Status.Nodes, cond.Message)
		}
		if cond.ObservedGeneration != got.Generation || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
		}
		return nil
	})
	return got
}

func TestPoolStatusCountsReportingNodes(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "status", 3)
	pool := newPool(t, c, ns, "kv", "status")

	got := waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/3")
	if p := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionProgressing); p == nil || p.Status != metav1.ConditionTrue {
		t.Errorf("Progressing = %+v, want True while no agent reported", p)
	}

	now := time.Now()
	domain := &fxv1.FabricMembership{Kind: fxv1.FabricUALink, Domain: "ualink:90/1"}
	report(t, c, pool, nodes[0], now, []fxv1.GPU{{Index: 0, Vendor: fxv1.VendorAMD, PCIBusID: "0000:0c:00.0", Fabric: domain}},
		fxv1.EngineXGMI, fxv1.EngineFabric, fxv1.EngineTCP)
	waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/3")

	report(t, c, pool, nodes[1], now, nil, fxv1.EngineRDMA, fxv1.EngineTCP)
	report(t, c, pool, nodes[2], now, nil, fxv1.EngineTCP)
	got = waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "3/3")
	if got.Status.EngineSummary != "xgmi=1 fabric=1 rdma=1 tcp=3" {
		t.Errorf("engine summary = %q", got.Status.EngineSummary)
	}
	if len(got.Status.VPods) != 1 || got.Status.VPods[0] != fxv1.DomainObjectName("ualink:90/1") {
		t.Errorf("vpods = %v", got.Status.VPods)
	}

	// A node whose agent stopped heartbeating is not ready and degrades the pool.
	report(t, c, pool, nodes[2], now.Add(-time.Hour), nil, fxv1.EngineTCP)
	got = waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "2/3")
	if d := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue {
		t.Errorf("Degraded = %+v, want True for a node that went quiet", d)
	}
	if len(got.Status.NotReadyNodes) != 1 || got.Status.NotReadyNodes[0] != nodes[2] {
		t.Errorf("notReadyNodes = %v", got.Status.NotReadyNodes)
	}
}

func TestPoolsSelectingTheSameNodesConflict(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns, other := newNamespace(t, c), newNamespace(t, c)
	newNodes(t, c, "conflict", 1)
	a := newPool(t, c, ns, "a", "conflict")
	waitPool(t, c, a, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/1")
	eventually(t, settle, "the first pool's agents", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(ns, "a")}, &appsv1.DaemonSet{})
	})
	// The certificate controller's condition follows the agents; read the first pool once it and the agents
	// controller's condition are there.
	waitCertCondition(t, c, a, metav1.ConditionTrue, fxv1.ReasonCertificatesIssued)
	waitAgentsCondition(t, c, a, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut)
	gotA, err := getPool(c, a)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // creation times have a resolution of one second

	// A later pool in another namespace selecting every node (nodeSelector {}) cannot take the node, nor
	// change the first pool's conditions: it shows Conflict naming the first and runs no agent.
	b := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: "b"}, Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{}}}
	if err := c.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	// b selects every node: it must be gone before the next test's pools come, or it would be theirs' first.
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), b)
		eventually(t, settle, "pool b deleted", func() error {
			if err := c.Get(context.Background(), client.ObjectKeyFromObject(b), &fxv1.TransferPool{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
	})
	eventually(t, settle, "pool b in Conflict", func() error {
		got, err := getPool(c, b)
		if err != nil {
			return err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
		if cond == nil || cond.Reason != fxv1.ReasonConflict || !strings.Contains(cond.Message, ns+"/a") {
			return fmt.Errorf("Ready %+v, want Conflict naming %s/a", cond, ns)
		}
		if len(got.Status.ConflictingPools) != 1 || got.Status.ConflictingPools[0] != ns+"/a" {
			return fmt.Errorf("conflicting pools %v", got.Status.ConflictingPools)
		}
		return nil
	})
	// The agents controller says the same in its own condition, and ran no agent for b.
	if cond := waitAgentsCondition(t, c, b, metav1.ConditionFalse, fxv1.ReasonConflict); !strings.Contains(cond.Message, ns+"/a") {
		t.Errorf("AgentsReady of the later pool %q does not name the first", cond.Message)
	}
	time.Sleep(time.Second) // the first pool's reconciles that b's creation caused
	after, err := getPool(c, a)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(after.Status.Conditions, gotA.Status.Conditions) || len(after.Status.ConflictingPools) != 0 {
		t.Errorf("the later pool changed the first one's status: conditions %v, conflicting %v", after.Status.Conditions, after.Status.ConflictingPools)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(other, "b")}, &appsv1.DaemonSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("the later pool got an agent DaemonSet: %v", err)
	}
	// The first pool goes: the later one takes the node.
	if err := c.Delete(ctx, after); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, b, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/1")
	eventually(t, settle, "the later pool's agents once it is alone", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(other, "b")}, &appsv1.DaemonSet{})
	})
}

func TestPoolWithoutMatchingNodes(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "empty", "nobody-has-this-label")
	got := waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, "0/0")
	cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady)
	if !strings.Contains(cond.Message, "nodeSelector") {
		t.Errorf("message %q should point at the selector", cond.Message)
	}
}

// newPoolWithHeartbeat is newPool with the agents' heartbeat period set.
func newPoolWithHeartbeat(t *testing.T, c client.Client, ns, name, group string, seconds int32) *fxv1.TransferPool {
	t.Helper()
	pool := &fxv1.TransferPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: fxv1.TransferPoolSpec{
			NodeSelector: map[string]string{"fabricxfer.io/test-group": group},
			Agent:        fxv1.AgentSpec{HeartbeatSeconds: seconds},
		},
	}
	if err := c.Create(context.Background(), pool); err != nil {
		t.Fatalf("creating pool: %v", err)
	}
	return pool
}

func TestNodeTurnsNotReadyWhenItsLeaseExpires(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "lease-expiry", 2)
	pool := newPoolWithHeartbeat(t, c, ns, "kv", "lease-expiry", 1) // timeout 3 s
	const timeout = 3 * time.Second

	// The reports are written once; only the Leases move.
	report(t, c, pool, nodes[0], time.Now(), nil, fxv1.EngineTCP)
	report(t, c, pool, nodes[1], time.Now(), nil, fxv1.EngineTCP)
	waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2")

	// Both agents renew every period for longer than the timeout: the pool stays ready.
	var last time.Time
	for range 5 {
		last = time.Now()
		renewLease(t, c, pool, nodes[0], last)
		renewLease(t, c, pool, nodes[1], last)
		time.Sleep(time.Second)
		got, err := getPool(c, pool)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Nodes != "2/2" {
			t.Fatalf("pool %s while both Leases are renewed every second, want 2/2", got.Status.Nodes)
		}
	}

	// nodes[1]'s agent stops: no event arrives, yet it must turn not ready once its Lease is older than the
	// timeout (plus the reconcile and the status write).
	stopped := last
	renewLease(t, c, pool, nodes[0], time.Now())
	var took time.Duration
	eventually(t, timeout+5*time.Second, "nodes[1] not ready after its lease expired", func() error {
		got, err := getPool(c, pool)
		if err != nil {
			return err
		}
		if got.Status.Nodes != "1/2" {
			return fmt.Errorf("nodes %s", got.Status.Nodes)
		}
		took = time.Since(stopped)
		if len(got.Status.NotReadyNodes) != 1 || got.Status.NotReadyNodes[0] != nodes[1] {
			return fmt.Errorf("notReadyNodes %v", got.Status.NotReadyNodes)
		}
		return nil
	})
	t.Logf("not ready %s after its last renewal (timeout %s)", took.Round(10*time.Millisecond), timeout)
	if took < timeout {
		t.Errorf("not ready after %s, before the %s timeout", took, timeout)
	}
	if took > timeout+2*time.Second {
		t.Errorf("not ready only after %s; want within the %s timeout plus 2 s", took, timeout)
	}

	// The agent returns: one renewal makes it ready again (the renewal of an expired Lease is an event).
	renewLease(t, c, pool, nodes[0], time.Now())
	renewLease(t, c, pool, nodes[1], time.Now())
	waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2")
}

// reconcileCount is the operator's reconcile count of one controller, from the controller-runtime metrics.
func reconcileCount(t *testing.T, controller string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func TestLeaseRenewalWritesNothing(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "lease-renewal", 1)
	pool := newPool(t, c, ns, "kv", "lease-renewal") // 10 s heartbeat: nothing expires during the test
	report(t, c, pool, nodes[0], time.Now(), nil, fxv1.EngineTCP)
	waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "1/1")
	// The certificate controller writes the pool too (its finalizer, CertificatesReady): the baseline is taken
	// once it has, and the reconciles the report caused have finished.
	waitCertCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonCertificatesIssued)
	time.Sleep(time.Second)
	before, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}

	pools0, vpods0 := reconcileCount(t, "transferpool"), reconcileCount(t, "vpodtopology")
	const renewals = 20
	for range renewals {
		renewLease(t, c, pool, nodes[0], time.Now())
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second)
	after, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion || after.Status.Nodes != "1/1" {
		t.Errorf("pool rewritten by lease renewals: resourceVersion %s -> %s, nodes %s", before.ResourceVersion, after.ResourceVersion, after.Status.Nodes)
	}
	// Other tests' pools may reconcile meanwhile (their heartbeats expire), but far fewer than one per renewal.
	pools, vpods := reconcileCount(t, "transferpool")-pools0, reconcileCount(t, "vpodtopology")-vpods0
	t.Logf("%d renewals: %.0f pool reconciles, %.0f vPOD reconciles", renewals, pools, vpods)
	if pools >= renewals/2 || vpods >= renewals/2 {
		t.Errorf("%d renewals caused %.0f pool and %.0f vPOD reconciles; renewals that change nothing must be filtered", renewals, pools, vpods)
	}
}

func TestPoolCountsAgentsWithoutLease(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "no-lease", 2)
	pool := newPool(t, c, ns, "kv", "no-lease")
	// An agent that predates Leases heartbeats through lastHeartbeat; one with a Lease counts by the Lease even
	// though its report's lastHeartbeat is old.
	reportWithoutLease(t, c, pool, nodes[0], time.Now(), nil, fxv1.EngineTCP)
	writeReport(t, c, pool, nodes[1], &metav1.Time{Time: time.Now().Add(-time.Hour)}, nil, fxv1.EngineTCP)
	renewLease(t, c, pool, nodes[1], time.Now())
	waitPool(t, c, pool, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2")

	reportWithoutLease(t, c, pool, nodes[0], time.Now().Add(-time.Hour), nil, fxv1.EngineTCP)
	got := waitPool(t, c, pool, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/2")
	if len(got.Status.NotReadyNodes) != 1 || got.Status.NotReadyNodes[0] != nodes[0] {
		t.Errorf("notReadyNodes = %v", got.Status.NotReadyNodes)
	}
}
