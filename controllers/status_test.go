// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

func TestComputePoolStatus(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	node := func(name string, labels map[string]string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	gpuLabel := map[string]string{"gpu": "yes"}
	nodes := []corev1.Node{node("a", gpuLabel), node("b", gpuLabel), node("cpu", nil)}
	tn := func(name string, age time.Duration, engines ...fxv1.EngineName) *fxv1.TransferNode {
		r := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		r.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-age)}
		for _, e := range engines {
			r.Status.Engines = append(r.Status.Engines, fxv1.EngineAvailability{Name: e, Available: true})
		}
		return r
	}
	noBeat := func(r *fxv1.TransferNode) *fxv1.TransferNode {
		r.Status.LastHeartbeat = nil
		return r
	}
	ofPool := func(r *fxv1.TransferNode, namespace, name string) *fxv1.TransferNode {
		r.Spec.PoolNamespace, r.Spec.PoolName = namespace, name
		return r
	}
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p", Generation: 4, CreationTimestamp: metav1.NewTime(now)}}
	pool.Spec.NodeSelector = gpuLabel
	pool.Spec.Engines = []fxv1.EngineName{fxv1.EngineRDMA, fxv1.EngineTCP}

	cases := []struct {
		name        string
		reports     map[string]*fxv1.TransferNode
		others      []fxv1.TransferPool
		wantReady   metav1.ConditionStatus
		wantReason  string
		wantNodes   string
		wantEngines string
		wantDegrade metav1.ConditionStatus
	}{
		{"nobody reported", nil, nil, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/2", "rdma=0 tcp=0", metav1.ConditionFalse},
		{"one fresh", map[string]*fxv1.TransferNode{"a": tn("a", time.Second, fxv1.EngineRDMA, fxv1.EngineTCP, fxv1.EngineXGMI)},
			nil, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/2", "rdma=1 tcp=1", metav1.ConditionFalse},
		{"all fresh", map[string]*fxv1.TransferNode{"a": tn("a", time.Second, fxv1.EngineTCP), "b": tn("b", 29*time.Second, fxv1.EngineTCP)},
			nil, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2", "rdma=0 tcp=2", metav1.ConditionFalse},
		{"one stale", map[string]*fxv1.TransferNode{"a": tn("a", time.Second, fxv1.EngineTCP), "b": tn("b", 31*time.Second, fxv1.EngineTCP)},
			nil, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/2", "rdma=0 tcp=1", metav1.ConditionTrue},
		{"conflict with an older pool", nil, []fxv1.TransferPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "other", UID: "o",
			CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))}, Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{}}}},
			metav1.ConditionFalse, fxv1.ReasonConflict, "0/2", "rdma=0 tcp=0", metav1.ConditionTrue},
		{"a newer overlapping pool changes nothing", nil, []fxv1.TransferPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "other", UID: "o",
			CreationTimestamp: metav1.NewTime(now.Add(time.Hour))}, Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{}}}},
			metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/2", "rdma=0 tcp=0", metav1.ConditionFalse},
		{"a report that never beat is starting, not stale", map[string]*fxv1.TransferNode{"a": noBeat(tn("a", 0, fxv1.EngineTCP)), "b": tn("b", time.Second, fxv1.EngineTCP)},
			nil, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/2", "rdma=0 tcp=1", metav1.ConditionFalse},
		{"another pool's agents count nothing", map[string]*fxv1.TransferNode{"a": ofPool(tn("a", time.Second, fxv1.EngineTCP), "x", "old"),
			"b": ofPool(tn("b", time.Second, fxv1.EngineTCP), "x", "old")},
			nil, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/2", "rdma=0 tcp=0", metav1.ConditionFalse},
		{"its own agents count", map[string]*fxv1.TransferNode{"a": ofPool(tn("a", time.Second, fxv1.EngineTCP), "ns", "p"),
			"b": ofPool(tn("b", time.Second, fxv1.EngineTCP), "ns", "p")},
			nil, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2", "rdma=0 tcp=2", metav1.ConditionFalse},
		{"no conflict with a disjoint pool", nil, []fxv1.TransferPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "cpu", UID: "c"},
			Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{"cpu-only": "yes"}}}},
			metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "0/2", "rdma=0 tcp=0", metav1.ConditionFalse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := ComputePoolStatus(pool, PoolObservation{Nodes: nodes, TransferNodes: tc.reports, OtherPools: tc.others, Now: now})
			ready := meta.FindStatusCondition(st.Conditions, fxv1.ConditionReady)
			degraded := meta.FindStatusCondition(st.Conditions, fxv1.ConditionDegraded)
			if ready.Status != tc.wantReady || ready.Reason != tc.wantReason {
				t.Errorf("Ready = %s/%s (%s), want %s/%s", ready.Status, ready.Reason, ready.Message, tc.wantReady, tc.wantReason)
			}
			if degraded.Status != tc.wantDegrade {
				t.Errorf("Degraded = %s (%s), want %s", degraded.Status, degraded.Message, tc.wantDegrade)
			}
			if st.Nodes != tc.wantNodes || st.EngineSummary != tc.wantEngines {
				t.Errorf("nodes %s engines %q, want %s %q", st.Nodes, st.EngineSummary, tc.wantNodes, tc.wantEngines)
			}
			if st.ObservedGeneration != 4 || ready.ObservedGeneration != 4 {
				t.Errorf("observedGeneration %d / %d, want 4", st.ObservedGeneration, ready.ObservedGeneration)
			}
		})
	}
}

// A pool counts the engines its agents run, not what detection found: an agent without libibverbs on an RDMA
// node runs no rdma, and explain, DRA and the pool's summary must not offer it. An agent older than the running
// field counts what is available; a node without GPUs runs the same-node engine on host memory.
func TestPoolCountsTheEnginesItsAgentsRun(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	yes, no := ptr(true), ptr(false)
	report := func(name string, engines ...fxv1.EngineAvailability) *fxv1.TransferNode {
		r := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		r.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-time.Second)}
		r.Status.Engines = engines
		return r
	}
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p", CreationTimestamp: metav1.NewTime(now)}}
	pool.Spec.Engines = []fxv1.EngineName{fxv1.EngineXGMI, fxv1.EngineRDMA, fxv1.EngineTCP}
	nodes := []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "no-verbs"}}, {ObjectMeta: metav1.ObjectMeta{Name: "older-agent"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "cpu-only"}}}
	reports := map[string]*fxv1.TransferNode{
		"no-verbs": report("no-verbs", fxv1.EngineAvailability{Name: fxv1.EngineXGMI, Available: true, Running: yes},
			fxv1.EngineAvailability{Name: fxv1.EngineRDMA, Available: true, Running: no, RunningReason: "libibverbs did not load"},
			fxv1.EngineAvailability{Name: fxv1.EngineTCP, Available: true, Running: yes}),
		"older-agent": report("older-agent", fxv1.EngineAvailability{Name: fxv1.EngineRDMA, Available: true},
			fxv1.EngineAvailability{Name: fxv1.EngineTCP, Available: true}),
		"cpu-only": report("cpu-only", fxv1.EngineAvailability{Name: fxv1.EngineXGMI, Available: false, Running: yes},
			fxv1.EngineAvailability{Name: fxv1.EngineTCP, Available: true, Running: no}),
	}
	st := ComputePoolStatus(pool, PoolObservation{Nodes: nodes, TransferNodes: reports, Now: now})
	want := []fxv1.EngineCount{{Name: fxv1.EngineXGMI, Nodes: 2, Available: 1}, {Name: fxv1.EngineRDMA, Nodes: 1, Available: 2},
		{Name: fxv1.EngineTCP, Nodes: 2, Available: 3}}
	if !reflect.DeepEqual(st.Engines, want) || st.EngineSummary != "xgmi=2 rdma=1 tcp=2" {
		t.Fatalf("engines %+v %q, want %+v \"xgmi=2 rdma=1 tcp=2\"", st.Engines, st.EngineSummary, want)
	}
}

func TestDomainObjectNamesStayDistinctAndValid(t *testing.T) {
	keys := []string{"ualink:1/2", "ualink:12/", "ualink:1/20", "nvlink:7d3c2a9e-1f00-4c55-a3b2-8e1f0c6d5b4a.3", "nvlink:7D3C2A9E-1F00-4C55-A3B2-8E1F0C6D5B4A.3"}
	seen := map[string]string{}
	for _, k := range keys {
		n := fxv1.DomainObjectName(k)
		if prev, dup := seen[n]; dup {
			t.Errorf("keys %q and %q share the name %q", prev, k, n)
		}
		seen[n] = k
		if len(n) > 63 {
			t.Errorf("name %q is longer than 63", n)
		}
		for _, r := range n {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				t.Errorf("name %q holds %q", n, r)
			}
		}
	}
}

func TestPoolStatusFromLeases(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p"}}
	pool.Spec.Agent.HeartbeatSeconds = 10 // timeout 30 s
	var nodes []corev1.Node
	reports := map[string]*fxv1.TransferNode{}
	for _, name := range []string{"lease-fresh", "lease-stale", "legacy-fresh", "no-report"} {
		nodes = append(nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		if name == "no-report" {
			continue
		}
		tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: fxv1.TransferNodeSpec{NodeName: name, PoolNamespace: "ns", PoolName: "p"}}
		// Agents with a Lease wrote their report long ago.
		tn.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-time.Hour)}
		reports[name] = tn
	}
	reports["legacy-fresh"].Status.LastHeartbeat = &metav1.Time{Time: now.Add(-20 * time.Second)}
	beats := heartbeat.Beats{
		{PoolNamespace: "ns", PoolName: "p", Node: "lease-fresh"}: now.Add(-5 * time.Second),
		{PoolNamespace: "ns", PoolName: "p", Node: "lease-stale"}: now.Add(-31 * time.Second),
		// A Lease of another pool does not make a report of this one fresh.
		{PoolNamespace: "ns", PoolName: "other", Node: "lease-stale"}: now,
		// A Lease without a report counts for nothing.
		{PoolNamespace: "ns", PoolName: "p", Node: "no-report"}: now,
	}
	obs := PoolObservation{Nodes: nodes, TransferNodes: reports, Heartbeats: beats, Now: now}
	st := ComputePoolStatus(pool, obs)
	if st.Nodes != "2/4" || !slices.Equal(st.NotReadyNodes, []string{"lease-stale", "no-report"}) {
		t.Errorf("nodes %s not ready %v, want 2/4 with lease-stale and no-report not ready", st.Nodes, st.NotReadyNodes)
	}
	if d := meta.FindStatusCondition(st.Conditions, fxv1.ConditionDegraded); d == nil || d.Status != metav1.ConditionTrue {
		t.Errorf("Degraded = %+v, want True for the node whose Lease expired", d)
	}
	// legacy-fresh expires first (in 10 s); the margin puts the reconcile just after the expiry.
	if got := PoolRequeueAfter(pool, obs); got != 10*time.Second+expiryMargin {
		t.Errorf("requeue after %s, want 10 s (legacy-fresh's expiry) plus %s", got, expiryMargin)
	}
	// With only stale reports, look again within one timeout; with no report at all, never on a timer.
	delete(obs.TransferNodes, "lease-fresh")
	delete(obs.TransferNodes, "legacy-fresh")
	if got := PoolRequeueAfter(pool, obs); got != 30*time.Second {
		t.Errorf("requeue after %s with only a stale report, want the 30 s timeout", got)
	}
	if got := PoolRequeueAfter(pool, PoolObservation{Nodes: nodes, Now: now}); got != 0 {
		t.Errorf("requeue after %s with no report, want none", got)
	}
}

// The operator's Lease filter passes agents' Leases being created, and only those (what a renewal changes is
// package heartbeat's rule, tested there).
func TestHeartbeatPredicate(t *testing.T) {
	now := time.Now()
	holder, seconds := "n", int32(30)
	renew := metav1.NewMicroTime(now)
	agent := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: holder, Labels: map[string]string{fxv1.LabelPoolName: "p"}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew, LeaseDurationSeconds: &seconds},
	}
	pred := heartbeatPredicate(clock.RealClock{})
	other := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-node-lease", Name: "n"}}
	if pred.Create(event.CreateEvent{Object: other}) || !pred.Create(event.CreateEvent{Object: agent}) {
		t.Error("the predicate must pass agents' Leases being created and only those")
	}
	renewed := agent.DeepCopy()
	later := metav1.NewMicroTime(now.Add(time.Second))
	renewed.Spec.RenewTime = &later
	if pred.Update(event.UpdateEvent{ObjectOld: agent, ObjectNew: renewed}) {
		t.Error("the renewal of a valid Lease must be filtered out")
	}
}

// TestPoolStatusListsFewVPods: a pool spanning thousands of domains lists the first 64 by name and counts all.
func TestPoolStatusListsFewVPods(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p"}}
	obs := PoolObservation{Now: now, TransferNodes: map[string]*fxv1.TransferNode{}}
	for i := range 100 {
		name := fmt.Sprintf("n%03d", i)
		obs.Nodes = append(obs.Nodes, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		tn := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		tn.Status.LastHeartbeat = &metav1.Time{Time: now}
		tn.Status.GPUs = []fxv1.GPU{{Index: 0, Fabric: &fxv1.FabricMembership{Kind: fxv1.FabricUALink, Domain: fmt.Sprintf("ualink:%d/0", i)}}}
		obs.TransferNodes[name] = tn
	}
	status := ComputePoolStatus(pool, obs)
	if status.VPodCount != 100 || len(status.VPods) != maxListedVPods || !slices.IsSorted(status.VPods) {
		t.Errorf("vpodCount %d, %d listed (sorted %v); want 100 counted, %d listed in order", status.VPodCount, len(status.VPods),
			slices.IsSorted(status.VPods), maxListedVPods)
	}
	// A domain with a VPodTopology (a declared one, of any name) is listed by that object's name, which kubectl
	// finds; before, every domain was listed by its derived name, which names no object for a declared one.
	obs.VPodNames = map[string]string{"ualink:0/0": "a-declared-rack"}
	status = ComputePoolStatus(pool, obs)
	if status.VPods[0] != "a-declared-rack" || slices.Contains(status.VPods, fxv1.DomainObjectName("ualink:0/0")) {
		t.Errorf("the declared vPOD of ualink:0/0 is not listed by its object's name: %v", status.VPods[:3])
	}
}

// TestProgressingFollowsTheAgentsRollout: with every node reporting, a pool whose agents are still rolling out
// a spec change (the agents controller's AgentsReady reason) is Progressing, not rolled out; once they rolled
// out it is not, and the predicate passes the change of reason so the status is computed again.
func TestProgressingFollowsTheAgentsRollout(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	report := &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	report.Status.LastHeartbeat = &metav1.Time{Time: now.Add(-time.Second)}
	pool := func(reason string) *fxv1.TransferPool {
		p := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p", Generation: 5}}
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: fxv1.ConditionAgentsReady, Status: metav1.ConditionTrue,
			Reason: reason, Message: "the agents are rolling out", ObservedGeneration: 5})
		return p
	}
	for _, tc := range []struct {
		reason string
		want   metav1.ConditionStatus
	}{{fxv1.ReasonAgentsRollingOut, metav1.ConditionTrue}, {fxv1.ReasonAgentsRolledOut, metav1.ConditionFalse}} {
		st := ComputePoolStatus(pool(tc.reason), PoolObservation{Nodes: []corev1.Node{node},
			TransferNodes: map[string]*fxv1.TransferNode{"a": report}, Now: now})
		ready := meta.FindStatusCondition(st.Conditions, fxv1.ConditionReady)
		progressing := meta.FindStatusCondition(st.Conditions, fxv1.ConditionProgressing)
		if ready.Status != metav1.ConditionTrue || progressing.Status != tc.want {
			t.Errorf("agents %s: Ready %s, Progressing %s (%s), want Ready True, Progressing %s", tc.reason, ready.Status,
				progressing.Status, progressing.Reason, tc.want)
		}
	}
	// The agents controller has not answered the pool's new generation yet (it applies first): still progressing.
	older := pool(fxv1.ReasonAgentsRolledOut)
	older.Generation = 6
	st := ComputePoolStatus(older, PoolObservation{Nodes: []corev1.Node{node}, TransferNodes: map[string]*fxv1.TransferNode{"a": report}, Now: now})
	if p := meta.FindStatusCondition(st.Conditions, fxv1.ConditionProgressing); p.Status != metav1.ConditionTrue {
		t.Errorf("generation 6 with the agents' condition of generation 5: Progressing %s (%s), want True", p.Status, p.Reason)
	}
	newer := pool(fxv1.ReasonAgentsRolledOut)
	meta.SetStatusCondition(&newer.Status.Conditions, metav1.Condition{Type: fxv1.ConditionAgentsReady, Status: metav1.ConditionTrue,
		Reason: fxv1.ReasonAgentsRolledOut, Message: "rolled out", ObservedGeneration: 6})
	if !agentsRolloutChanged().Update(event.UpdateEvent{ObjectOld: pool(fxv1.ReasonAgentsRolledOut), ObjectNew: newer}) {
		t.Error("the predicate did not pass the agents' condition of a new generation")
	}
	changed := agentsRolloutChanged().Update(event.UpdateEvent{ObjectOld: pool(fxv1.ReasonAgentsRollingOut), ObjectNew: pool(fxv1.ReasonAgentsRolledOut)})
	same := agentsRolloutChanged().Update(event.UpdateEvent{ObjectOld: pool(fxv1.ReasonAgentsRolledOut), ObjectNew: pool(fxv1.ReasonAgentsRolledOut)})
	if !changed || same {
		t.Errorf("the predicate passed a change of the agents' reason: %t, an unchanged one: %t; want true, false", changed, same)
	}
}

// TestDeclaredMembersWithoutAReportAreNamedApart: a member whose report does not mention the declared domain
// yet (its agent is taking the declaration) is pending; one with no report at all is named apart, as a node
// name no agent reports for.
func TestDeclaredMembersWithoutAReportAreNamedApart(t *testing.T) {
	vp := &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: "rack-1", Generation: 2},
		Spec: fxv1.VPodTopologySpec{Kind: fxv1.FabricUALink, Domain: "ualink:p/1",
			Members: []fxv1.VPodMember{{Node: "gpu-a", GPUs: []int32{0}}, {Node: "gpu-typo", GPUs: []int32{0}}}}}
	c := DeclaredCondition(vp, map[string]*fxv1.TransferNode{}, func(node string) bool { return node == "gpu-a" })
	want := "members whose agents have not reported this declaration yet: gpu-a; members no agent reports for (no TransferNode: is the node name right?): gpu-typo"
	if c.Reason != fxv1.ReasonDeclarationPending || c.Message != want {
		t.Errorf("Declared %s: %q, want %s: %q", c.Reason, c.Message, fxv1.ReasonDeclarationPending, want)
	}
}
