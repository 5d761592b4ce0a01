// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// TestAssemblyHoldLeft: a status write waits only while members join a discovered domain short of its
// reported size, nobody stale or missing, within the hold of the last write.
func TestAssemblyHoldLeft(t *testing.T) {
	now := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC)
	cur := fxv1.VPodTopologyStatus{Nodes: 1, GPUs: 1}
	grown := fxv1.VPodTopologyStatus{Nodes: 2, GPUs: 2}
	obs := &DomainObservation{Size: 4}
	for _, tc := range []struct {
		name     string
		cur      fxv1.VPodTopologyStatus
		want     fxv1.VPodTopologyStatus
		obs      *DomainObservation
		declared bool
		last     time.Time
		left     time.Duration
	}{
		{"a member joins, 2 s after the last write", cur, grown, obs, false, now.Add(-2 * time.Second), 3 * time.Second},
		{"the hold has passed", cur, grown, obs, false, now.Add(-vpodAssemblyHold), 0},
		{"the member that completes the domain", cur, fxv1.VPodTopologyStatus{Nodes: 4, GPUs: 4}, obs, false, now, 0},
		{"no size reported", cur, grown, &DomainObservation{}, false, now, 0},
		{"not written since the operator started", cur, grown, obs, false, time.Time{}, 0},
		{"a member leaves", grown, cur, obs, false, now, 0},
		{"a member goes stale", cur, grown, &DomainObservation{Size: 4, Stale: []string{"n"}}, false, now, 0},
		{"a declared member missing", cur, fxv1.VPodTopologyStatus{Nodes: 2, GPUs: 2, MissingMembers: []string{"n"}}, obs, false, now, 0},
		{"a declared domain", cur, grown, obs, true, now, 0},
		{"no observation", cur, grown, nil, false, now, 0},
	} {
		if got := assemblyHoldLeft(tc.cur, tc.want, tc.obs, tc.declared, tc.last, now); got != tc.left {
			t.Errorf("%s: hold %v, want %v", tc.name, got, tc.left)
		}
	}
}

// TestAssemblingDomainWrittenWhenComplete drives the reconciler over a fake client with a fake clock: a domain
// of four one-GPU members that report one by one is created at once, its status written when the hold after the
// create ends and again when the member that completes it reports, nothing in between; a domain complete at its
// create is written at once. A member that claims a size the domain never reaches (65,536) delays the status by
// one hold at most, and other domains not at all.
func TestAssemblingDomainWrittenWhenComplete(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	writes := map[string]int{}
	c := fakeVPodClient(t, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if vp, ok := obj.(*fxv1.VPodTopology); ok && sub == "status" {
				writes[vp.Spec.Domain]++
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	r := &VPodTopologyReconciler{Client: c, Clock: clk, indexed: true}
	report := func(node, key string, size int32) {
		t.Helper()
		beat := metav1.NewTime(clk.Now())
		gpus := gpusIn(key, 0)
		gpus[0].Fabric.DomainSize = size
		if err := c.Create(ctx, &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: fxv1.TransferNodeSpec{NodeName: node},
			Status: fxv1.TransferNodeStatus{GPUs: gpus, LastHeartbeat: &beat}}); err != nil {
			t.Fatal(err)
		}
	}
	reconcile := func(key string) time.Duration {
		t.Helper()
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Name: key}})
		if err != nil {
			t.Fatal(err)
		}
		return res.RequeueAfter
	}
	expect := func(key string, wantWrites, wantNodes int) {
		t.Helper()
		vp := &fxv1.VPodTopology{}
		if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(key)}, vp); err != nil {
			t.Fatal(err)
		}
		if writes[key] != wantWrites || int(vp.Status.Nodes) != wantNodes {
			t.Fatalf("%s: %d status writes, %d nodes in the status; want %d and %d", key, writes[key], vp.Status.Nodes, wantWrites, wantNodes)
		}
	}

	const key, liar, single = "ualink:9/4", "ualink:9/5", "ualink:9/6"
	report("a-0", key, 4)
	if after := reconcile(key); after <= 0 || after > vpodAssemblyHold {
		t.Fatalf("a created domain's held status requeued after %v, want within %v", after, vpodAssemblyHold)
	}
	expect(key, 0, 0) // created; its first status waits while it assembles
	clk.Step(time.Second)
	report("a-1", key, 4)
	reconcile(key)
	expect(key, 0, 0)
	clk.Step(vpodAssemblyHold)
	reconcile(key) // the requeue after the hold
	expect(key, 1, 2)
	clk.Step(time.Second)
	report("a-2", key, 4)
	reconcile(key)
	expect(key, 1, 2) // held again
	report("a-3", key, 4)
	reconcile(key)
	expect(key, 2, 4) // complete: written at once, inside the hold

	// A domain complete when created is written at once.
	report("c-0", single, 1)
	reconcile(single)
	expect(single, 1, 1)

	// A member claiming more GPUs than will ever report: each write waits one hold at most.
	report("b-0", liar, fxv1MaxDomainSize)
	reconcile(liar)
	report("b-1", liar, fxv1MaxDomainSize)
	reconcile(liar)
	expect(liar, 0, 0)
	clk.Step(vpodAssemblyHold)
	reconcile(liar)
	expect(liar, 1, 2)
	expect(key, 2, 4) // the other domains untouched
	expect(single, 1, 1)
}

// fxv1MaxDomainSize is the API's bound on a reported domain size.
const fxv1MaxDomainSize = 65536
