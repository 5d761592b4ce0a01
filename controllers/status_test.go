package controllers

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
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
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "p", Generation: 4}}
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
		{"conflict", nil, []fxv1.TransferPool{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "other", UID: "o"},
			Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{}}}},
			metav1.ConditionFalse, fxv1.ReasonConflict, "0/2", "rdma=0 tcp=0", metav1.ConditionTrue},
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
