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

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/fabricxfer/fabricxfer/internal/heartbeat"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

func gpusIn(domain string, indexes ...int32) []fxv1.GPU {
	kind, _ := fxv1.DomainKind(domain)
	var gpus []fxv1.GPU
	for _, i := range indexes {
		gpus = append(gpus, fxv1.GPU{Index: i, Vendor: fxv1.VendorAMD, PCIBusID: fmt.Sprintf("0000:%02x:00.0", i+1),
			Fabric: &fxv1.FabricMembership{Kind: kind, Domain: domain}})
	}
	return gpus
}

func waitVPod(t *testing.T, c client.Client, key string, check func(*fxv1.VPodTopology) error) {
	t.Helper()
	eventually(t, settle, "vpod "+key, func() error {
		vp := &fxv1.VPodTopology{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: fxv1.DomainObjectName(key)}, vp); err != nil {
			return err
		}
		return check(vp)
	})
}

func memberNodes(vp *fxv1.VPodTopology) []string {
	var names []string
	for _, m := range vp.Status.Members {
		names = append(names, m.Node)
	}
	return names
}

func TestVPodTopologyFollowsReports(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	now := time.Now()
	keyA, keyB := "ualink:7/1", "nvlink:7d3c2a9e-1f00-4c55-a3b2-000000000007.3"

	report(t, c, pool, "vp-a-0", now, gpusIn(keyA, 0, 1, 2, 3))
	report(t, c, pool, "vp-a-1", now, gpusIn(keyA, 0, 1, 2, 3))
	report(t, c, pool, "vp-b-0", now, gpusIn(keyB, 0, 1))

	waitVPod(t, c, keyA, func(vp *fxv1.VPodTopology) error {
		if vp.Spec.Kind != fxv1.FabricUALink || vp.Spec.Domain != keyA || vp.Labels[fxv1.LabelDiscovered] != "true" {
			return fmt.Errorf("spec %+v labels %v", vp.Spec, vp.Labels)
		}
		if !slices.Equal(memberNodes(vp), []string{"vp-a-0", "vp-a-1"}) || vp.Status.GPUs != 8 || vp.Status.Nodes != 2 {
			return fmt.Errorf("members %v gpus %d", memberNodes(vp), vp.Status.GPUs)
		}
		return nil
	})
	waitVPod(t, c, keyB, func(vp *fxv1.VPodTopology) error {
		if vp.Spec.Kind != fxv1.FabricNVLink || vp.Status.GPUs != 2 || !slices.Equal(memberNodes(vp), []string{"vp-b-0"}) {
			return fmt.Errorf("kind %s members %v gpus %d", vp.Spec.Kind, memberNodes(vp), vp.Status.GPUs)
		}
		return nil
	})

	// An agent that stops heartbeating leaves the members and shows as missing.
	report(t, c, pool, "vp-a-1", now.Add(-time.Hour), gpusIn(keyA, 0, 1, 2, 3))
	waitVPod(t, c, keyA, func(vp *fxv1.VPodTopology) error {
		if !slices.Equal(memberNodes(vp), []string{"vp-a-0"}) || !slices.Equal(vp.Status.MissingMembers, []string{"vp-a-1"}) {
			return fmt.Errorf("members %v missing %v", memberNodes(vp), vp.Status.MissingMembers)
		}
		return nil
	})

	// A node leaving (its report deleted) takes it out; the last one leaving deletes the discovered domain.
	if err := c.Delete(ctx, &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "vp-b-0"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "empty discovered domain deleted", func() error {
		err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(keyB)}, &fxv1.VPodTopology{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}

func TestDeclaredVPodTopologyIsKeptAndCompared(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	key := "ualink:8/2"
	declared := &fxv1.VPodTopology{
		ObjectMeta: metav1.ObjectMeta{Name: "rack-8-vpod-2"},
		Spec: fxv1.VPodTopologySpec{Kind: fxv1.FabricUALink, Domain: key, Members: []fxv1.VPodMember{
			{Node: "decl-0"}, {Node: "decl-1"},
		}},
	}
	if err := c.Create(ctx, declared); err != nil {
		t.Fatalf("declaring a domain: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), declared) })

	wait := func(what string, check func(*fxv1.VPodTopology) error) {
		t.Helper()
		eventually(t, settle, what, func() error {
			vp := &fxv1.VPodTopology{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(declared), vp); err != nil {
				return err
			}
			return check(vp)
		})
	}
	wait("declared domain with nobody reporting", func(vp *fxv1.VPodTopology) error {
		if !slices.Equal(vp.Status.MissingMembers, []string{"decl-0", "decl-1"}) || vp.Status.Nodes != 0 {
			return fmt.Errorf("missing %v nodes %d", vp.Status.MissingMembers, vp.Status.Nodes)
		}
		// The operator (as its ServiceAccount) labels each member node, which is what the agents select by.
		if vp.Labels[fxv1.MemberLabel("decl-0")] != "true" || vp.Labels[fxv1.MemberLabel("decl-1")] != "true" {
			return fmt.Errorf("member labels %v", vp.Labels)
		}
		if c := meta.FindStatusCondition(vp.Status.Conditions, fxv1.ConditionDeclared); c == nil || c.Reason != fxv1.ReasonDeclarationPending ||
			c.Message != "members no agent reports for (no TransferNode: is the node name right?): decl-0, decl-1" {
			return fmt.Errorf("Declared condition %+v", c)
		}
		return nil
	})

	report(t, c, pool, "decl-0", time.Now(), gpusIn(key, 0, 1))
	report(t, c, pool, "decl-9", time.Now(), gpusIn(key, 0))
	wait("declared vs discovered members", func(vp *fxv1.VPodTopology) error {
		if !slices.Equal(memberNodes(vp), []string{"decl-0", "decl-9"}) ||
			!slices.Equal(vp.Status.MissingMembers, []string{"decl-1"}) ||
			!slices.Equal(vp.Status.UndeclaredMembers, []string{"decl-9"}) {
			return fmt.Errorf("members %v missing %v undeclared %v", memberNodes(vp), vp.Status.MissingMembers, vp.Status.UndeclaredMembers)
		}
		return nil
	})
	// The operator adopts the declaration instead of creating a discovered twin.
	if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(key)}, &fxv1.VPodTopology{}); !apierrors.IsNotFound(err) {
		t.Errorf("a discovered twin of a declared domain exists: %v", err)
	}

	for _, n := range []string{"decl-0", "decl-9"} {
		if err := c.Delete(ctx, &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	wait("declared domain kept when nobody reports", func(vp *fxv1.VPodTopology) error {
		if vp.Status.Nodes != 0 || len(vp.Status.MissingMembers) != 2 {
			return fmt.Errorf("nodes %d missing %v", vp.Status.Nodes, vp.Status.MissingMembers)
		}
		return nil
	})
}

// TestPassUsesItsOwnWritesBeforeTheCache checks that a pass started before the cache shows the previous pass's
// writes works from what those writes returned, and that the cache wins once it caught up.
func TestPassUsesItsOwnWritesBeforeTheCache(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	vp := func(name, rv string, nodes int32) *fxv1.VPodTopology {
		return &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}, Status: fxv1.VPodTopologyStatus{Nodes: nodes}}
	}
	r := &VPodTopologyReconciler{}
	r.remember(vp("patched", "17", 4), now.Add(-time.Second))
	r.remember(vp("cache-caught-up", "17", 4), now.Add(-time.Second))
	r.remember(vp("created", "18", 2), now.Add(-time.Second))
	r.remember(vp("created-long-ago", "19", 2), now.Add(-trustUncached))
	cached := []fxv1.VPodTopology{*vp("patched", "12", 1), *vp("cache-caught-up", "21", 3), *vp("other", "5", 1)}

	got, uncached := r.withOwnWrites(cached, now)
	byName := map[string]fxv1.VPodTopology{}
	for _, v := range got {
		byName[v.Name] = v
	}
	if !uncached || len(got) != 4 {
		t.Fatalf("uncached %v, %d domains %v; want the three cached plus the one created a second ago", uncached, len(got), byName)
	}
	for name, want := range map[string]int32{"patched": 4, "cache-caught-up": 3, "other": 1, "created": 2} {
		if v, ok := byName[name]; !ok || v.Status.Nodes != want {
			t.Errorf("%s: %+v, want status nodes %d", name, v, want)
		}
	}
	if _, ok := r.written["cache-caught-up"]; ok {
		t.Error("an entry the cache caught up with is kept")
	}
	if _, ok := r.written["created-long-ago"]; ok {
		t.Error("an uncached entry older than trustUncached is kept")
	}
	if newerVersion("9", "10") || !newerVersion("10", "9") || newerVersion("x", "1") {
		t.Error("newerVersion compares revisions numerically and lets anything unparsable lose")
	}
}

// TestSecondDeclarationOfADomainIsIgnored: the API server cannot refuse a second VPodTopology for a domain
// (CEL sees one object), so the operator shows it DuplicateDomain naming the first, leaves the first alone, and
// deletes its own discovered twin once an admin declares the domain.
func TestSecondDeclarationOfADomainIsIgnored(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	key := "ualink:8/3"
	report(t, c, pool, "dup-0", time.Now(), gpusIn(key, 0, 1))
	discovered := client.ObjectKey{Name: fxv1.DomainObjectName(key)}
	eventually(t, settle, "the discovered domain", func() error { return c.Get(ctx, discovered, &fxv1.VPodTopology{}) })

	declare := func(name string) *fxv1.VPodTopology {
		vp := &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: fxv1.VPodTopologySpec{Kind: fxv1.FabricUALink, Domain: key, Members: []fxv1.VPodMember{{Node: "dup-0"}}}}
		if err := c.Create(ctx, vp); err != nil {
			t.Fatalf("declaring %s: %v", name, err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), vp) })
		return vp
	}
	first := declare("rack-8-vpod-3")
	eventually(t, settle, "the discovered twin deleted once the domain is declared", func() error {
		if err := c.Get(ctx, discovered, &fxv1.VPodTopology{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	time.Sleep(1100 * time.Millisecond) // creation times have a resolution of one second
	second := declare("rack-8-vpod-3-again")
	eventually(t, settle, "the second declaration marked a duplicate", func() error {
		vp := &fxv1.VPodTopology{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(second), vp); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(vp.Status.Conditions, fxv1.ConditionReady)
		if cond == nil || cond.Reason != fxv1.ReasonDuplicateDomain || !strings.Contains(cond.Message, first.Name) || vp.Status.Nodes != 0 {
			return fmt.Errorf("Ready %+v nodes %d, want DuplicateDomain naming %s", cond, vp.Status.Nodes, first.Name)
		}
		return nil
	})
	got := &fxv1.VPodTopology{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(first), got); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, fxv1.ConditionReady); cond == nil || cond.Reason != fxv1.ReasonMembersComplete ||
		!slices.Equal(memberNodes(got), []string{"dup-0"}) {
		t.Errorf("the first declaration: Ready %+v members %v, want it to describe the domain undisturbed", cond, memberNodes(got))
	}
	if err := c.Delete(ctx, &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: "dup-0"}}); err != nil {
		t.Fatal(err)
	}
}

// TestReportTouchesOnlyItsDomains: each domain is reconciled from the reports that name it, so a report that
// changes rewrites its own domains (the one it left and the one it joined) and no other domain's object.
func TestReportTouchesOnlyItsDomains(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	now := time.Now()
	keyA, keyB, keyC := "ualink:19/1", "ualink:19/2", "ualink:19/3"
	report(t, c, pool, "only-a-0", now, gpusIn(keyA, 0, 1))
	report(t, c, pool, "only-b-0", now, gpusIn(keyB, 0, 1))
	report(t, c, pool, "only-c-0", now, gpusIn(keyC, 0, 1))
	report(t, c, pool, "only-c-1", now, gpusIn(keyC, 0, 1))
	for key, members := range map[string][]string{keyA: {"only-a-0"}, keyB: {"only-b-0"}, keyC: {"only-c-0", "only-c-1"}} {
		waitVPod(t, c, key, func(vp *fxv1.VPodTopology) error {
			if !slices.Equal(memberNodes(vp), members) || !meta.IsStatusConditionTrue(vp.Status.Conditions, fxv1.ConditionReady) {
				return fmt.Errorf("members %v conditions %v", memberNodes(vp), vp.Status.Conditions)
			}
			return nil
		})
	}
	untouched := &fxv1.VPodTopology{}
	if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(keyC)}, untouched); err != nil {
		t.Fatal(err)
	}

	// only-a-0 moves from domain A to domain B: A goes (nobody reports it), B gains a member, C is not written.
	writeReport(t, c, pool, "only-a-0", nil, gpusIn(keyB, 2, 3))
	waitVPod(t, c, keyB, func(vp *fxv1.VPodTopology) error {
		if !slices.Equal(memberNodes(vp), []string{"only-a-0", "only-b-0"}) || vp.Status.GPUs != 4 {
			return fmt.Errorf("members %v gpus %d", memberNodes(vp), vp.Status.GPUs)
		}
		return nil
	})
	eventually(t, settle, "domain A deleted", func() error {
		if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(keyA)}, &fxv1.VPodTopology{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	after := &fxv1.VPodTopology{}
	if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(keyC)}, after); err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != untouched.ResourceVersion {
		t.Errorf("domain C rewritten by a report of other domains: resourceVersion %s -> %s", untouched.ResourceVersion, after.ResourceVersion)
	}
}

// TestNewDomainsFirstStatusHasMembersThatReportedDuringItsCreate: a domain is created from the reports its
// reconcile read; a member whose report arrives while the create is on its way is in the first status too,
// rather than costing a second status write.
// fakeVPodClient is a fake client with the indexes the vPOD reconciler reads through, holding objs, with funcs
// around its calls.
func fakeVPodClient(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := fxv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).
		WithStatusSubresource(&fxv1.VPodTopology{}).
		WithObjects(objs...).
		WithIndex(&fxv1.TransferNode{}, indexTransferNodeDomains, func(o client.Object) []string {
			return reportedDomains(o.(*fxv1.TransferNode))
		}).
		WithIndex(&fxv1.VPodTopology{}, indexVPodDomain, func(o client.Object) []string {
			return []string{o.(*fxv1.VPodTopology).Spec.Domain}
		}).
		WithIndex(&coordinationv1.Lease{}, indexLeaseHeartbeat, func(o client.Object) []string {
			if k, _, ok := heartbeat.FromLease(o.(*coordinationv1.Lease)); ok {
				return []string{k.String()}
			}
			return nil
		}).
		WithInterceptorFuncs(funcs).Build()
}

func TestNewDomainsFirstStatusHasMembersThatReportedDuringItsCreate(t *testing.T) {
	ctx := context.Background()
	key := "ualink:9/2"
	beat := metav1.NewTime(time.Now())
	reportOf := func(node string) *fxv1.TransferNode {
		return &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Spec: fxv1.TransferNodeSpec{NodeName: node},
			Status: fxv1.TransferNodeStatus{GPUs: gpusIn(key, 0, 1), LastHeartbeat: &beat}}
	}
	statusWrites := 0
	c := fakeVPodClient(t, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*fxv1.VPodTopology); ok {
				if err := c.Create(ctx, reportOf("late-1")); err != nil {
					return err
				}
			}
			return c.Create(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if _, ok := obj.(*fxv1.VPodTopology); ok && sub == "status" {
				statusWrites++
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}, reportOf("early-0"))
	r := &VPodTopologyReconciler{Client: c, Clock: clock.RealClock{}, indexed: true}
	req := ctrl.Request{NamespacedName: client.ObjectKey{Name: key}}
	for range 2 { // the second reconcile is the one the late report's own event brings
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	vp := &fxv1.VPodTopology{}
	if err := c.Get(ctx, client.ObjectKey{Name: fxv1.DomainObjectName(key)}, vp); err != nil {
		t.Fatal(err)
	}
	if got := memberNodes(vp); !slices.Equal(got, []string{"early-0", "late-1"}) || statusWrites != 1 {
		t.Errorf("members %v after %d status writes; want both members in the one first status", got, statusWrites)
	}
}
