// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestSegmentsBelongToTheirNamespace: a name published by a pod of one namespace is neither readable, writable
// nor squattable by a pod of another, on this node or through the peer channel's lookup, until the owner grants
// that namespace; granted, it is reached as "<namespace>/<name>".
func TestSegmentsBelongToTheirNamespace(t *testing.T) {
	a, proc, podA, podB := twoNamespaces(t)
	ctx := ctxT(t)

	proc.setPod(t, podA)
	ca := dial(t, a)
	secret, shared := shm(t, 4096), shm(t, 4096)
	fill(t, secret.Bytes)
	fill(t, shared.Bytes)
	secretBefore := bytes.Clone(secret.Bytes)
	if _, err := ca.RegisterHost(ctx, secret.File, 0, 4096, client.Segment("kv")); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.RegisterHost(ctx, shared.File, 0, 4096, client.Segment("shared"), client.Grant("team-b")); err != nil {
		t.Fatal(err)
	}

	proc.setPod(t, podB)
	cb := dial(t, a)
	mine := shm(t, 4096)
	fill(t, mine.Bytes)
	rb, err := cb.RegisterHost(ctx, mine.File, 0, 4096, client.Segment("kv")) // the same name in its own namespace
	if err != nil {
		t.Fatalf("a name another namespace uses could not be registered: %v", err)
	}
	for _, ref := range []string{"team-a/kv", "team-c/kv"} {
		if _, err := cb.Write(ctx, rb, 0, client.ToSegment("", ref), 0, 4096); client.Code(err).String() != "NotFound" {
			t.Fatalf("writing %s from team-b: want NotFound, got %v", ref, err)
		}
		if _, err := cb.Read(ctx, rb, 0, client.ToSegment("", ref), 0, 4096); client.Code(err).String() != "NotFound" {
			t.Fatalf("reading %s from team-b: want NotFound, got %v", ref, err)
		}
	}
	if !bytes.Equal(secret.Bytes, secretBefore) {
		t.Fatal("team-a's segment changed")
	}
	// "kv" from team-b is team-b's own region.
	if _, err := cb.Write(ctx, rb, 0, client.ToSegment("", "kv"), 0, 16); err != nil {
		t.Fatalf("writing its own segment by name: %v", err)
	}
	// Granted: reached under the owner's namespace.
	if _, err := cb.Write(ctx, rb, 0, client.ToSegment("", "team-a/shared"), 0, 4096); err != nil {
		t.Fatalf("writing a segment granted to team-b: %v", err)
	}
	if !bytes.Equal(shared.Bytes, mine.Bytes) {
		t.Fatal("the granted segment does not hold what team-b wrote")
	}
	// The owner's agent decides the same way for peers, from the asking pod's namespace.
	if _, err := a.srv.LookupSegment("team-a/kv", "team-b"); client.Code(err).String() != "NotFound" {
		t.Fatalf("peer lookup of an ungranted segment: %v", err)
	}
	if _, err := a.srv.LookupSegment("kv", "team-b"); err != nil {
		t.Fatalf("peer lookup of team-b's own segment: %v", err)
	}
	if _, err := a.srv.LookupSegment("team-a/shared", "team-b"); err != nil {
		t.Fatalf("peer lookup of a granted segment: %v", err)
	}
	// Layouts answer peers by the same rules: team-a's private layout is missing for team-b, the granted one is
	// described region by region. (The fd socket identifies its caller itself: team-a passes the memory.)
	proc.setPod(t, podA)
	ra, err := ca.RegisterHost(ctx, shm(t, 4096).File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.RegisterLayout(ctx, []*client.Region{ra}, 1024, client.PublishLayout("kv-private")); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.RegisterLayout(ctx, []*client.Region{ra}, 512, client.PublishLayout("kv-granted", "team-b")); err != nil {
		t.Fatal(err)
	}
	if _, err := a.srv.LookupLayout("team-a/kv-private", "team-b", ""); client.Code(err).String() != "NotFound" {
		t.Fatalf("peer lookup of an ungranted layout: %v", err)
	}
	if _, err := a.srv.LookupLayout("team-a/kv/x", "team-b", ""); client.Code(err).String() != "InvalidArgument" {
		t.Fatalf("peer lookup of a malformed layout name: %v", err)
	}
	ld, err := a.srv.LookupLayout("team-a/kv-granted", "team-b", "")
	if err != nil || ld.BlockBytes != 512 || ld.Blocks != 8 || len(ld.Regions) != 1 {
		t.Fatalf("peer lookup of a granted layout: %v, %v", ld, err)
	}
	// Grants are checked when publishing.
	if _, err := ca.RegisterHost(ctx, shm(t, 64).File, 0, 64, client.Segment("bad"), client.Grant("Not A Namespace")); client.Code(err).String() != "InvalidArgument" {
		t.Fatalf("a malformed grant: %v", err)
	}
}

// twoNamespaces is an agent admitting pods of namespaces team-a and team-b, one pod each, on a real API server.
func twoNamespaces(t *testing.T) (a *agent, proc *procFixture, podA, podB string) {
	t.Helper()
	kube := startAPIServer(t)
	podA = createPod(t, kube, "team-a", "prefill-0", "node-a")
	podB = createPod(t, kube, "team-b", "decode-0", "node-a")
	proc = newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: &identity.APIPodResolver{Reader: kube, NodeName: "node-a"}}
	opts.Policy = identity.StaticPolicy{"team-a", "team-b"}
	return startAgent(t, opts), proc, podA, podB
}

// TestLayoutsBelongToTheirNamespace: a published layout is reachable from another namespace only when granted.
func TestLayoutsBelongToTheirNamespace(t *testing.T) {
	a, proc, podA, podB := twoNamespaces(t)
	rng := rand.New(rand.NewPCG(17, 18))
	const bs, blocks = 256, 8
	proc.setPod(t, podA)
	ca := dial(t, a)
	_, privMem := hostLayout(t, ca, rng, 1, blocks, bs, client.PublishLayout("kv"))
	_, grantedMem := hostLayout(t, ca, rng, 1, blocks, bs, client.PublishLayout("kv-shared", "team-b"))
	before := snapshot(privMem)
	proc.setPod(t, podB)
	cb := dial(t, a)
	lb, lbMem := hostLayout(t, cb, rng, 1, blocks, bs)
	for _, ref := range []string{"kv", "team-a/kv"} {
		_, err := cb.TransferBlocks(ctxT(t), client.Write, lb, []uint32{1}, client.ToLayoutSegment("", ref), []uint32{2}, client.TransferOptions{})
		if client.Code(err).String() != "NotFound" {
			t.Fatalf("writing layout %s from team-b: want NotFound, got %v", ref, err)
		}
	}
	if !bytes.Equal(privMem[0].Bytes, before[0]) {
		t.Fatal("team-a's private layout changed")
	}
	if _, err := cb.TransferBlocks(ctxT(t), client.Write, lb, []uint32{1}, client.ToLayoutSegment("", "team-a/kv-shared"), []uint32{2}, client.TransferOptions{}); err != nil {
		t.Fatalf("writing a layout granted to team-b: %v", err)
	}
	if !bytes.Equal(grantedMem[0].Bytes[2*bs:3*bs], lbMem[0].Bytes[bs:2*bs]) {
		t.Fatal("the granted layout's block 2 is not team-b's block 1")
	}
}

// TestANameOfTheOtherKindIsNamedSo: a region's segment asked for as a layout, or a layout's asked for as a
// region, is NotFound saying what the name is and which call moves it; a caller the owner did not grant the
// name hears only that it is missing, as for any name it may not use.
func TestANameOfTheOtherKindIsNamedSo(t *testing.T) {
	a, proc, podA, podB := twoNamespaces(t)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(19, 20))
	const bs, blocks = 256, 8
	proc.setPod(t, podA)
	ca := dial(t, a)
	la, _ := hostLayout(t, ca, rng, 1, blocks, bs, client.PublishLayout("kv-layout", "team-b"))
	ra, err := ca.RegisterHost(ctx, shm(t, 4096).File, 0, 4096, client.Segment("kv-region"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.RegisterHost(ctx, shm(t, 4096).File, 0, 4096, client.Segment("shared-region"), client.Grant("team-b")); err != nil {
		t.Fatal(err)
	}
	notFound := func(who string, err error, hint string) {
		t.Helper()
		if client.Code(err).String() != "NotFound" {
			t.Fatalf("%s: want NotFound, got %v", who, err)
		}
		if hint == "" && strings.Contains(err.Error(), "segment, ") {
			t.Errorf("%s: a caller without a grant was told what the name is: %v", who, err)
		}
		if hint != "" && !strings.Contains(err.Error(), hint) {
			t.Errorf("%s: %v, want it to say %q", who, err, hint)
		}
	}
	const isLayout, isRegion = "is a layout's segment, whose blocks move with transfer_blocks", "is a region's segment, which items move to"
	_, err = ca.ResolveSegment(ctx, "", "kv-layout")
	notFound("resolving a layout's name as a region", err, isLayout)
	_, err = ca.Write(ctx, ra, 0, client.ToSegment("", "kv-layout"), 0, 64)
	notFound("writing items to a layout's name", err, isLayout)
	_, err = ca.TransferBlocks(ctx, client.Write, la, []uint32{1}, client.ToLayoutSegment("", "kv-region"), []uint32{2}, client.TransferOptions{})
	notFound("writing blocks to a region's name", err, isRegion)
	_, err = a.srv.LookupLayout("kv-region", "team-a", "")
	notFound("a peer asking for a region's name as a layout", err, isRegion)

	proc.setPod(t, podB)
	cb := dial(t, a)
	lb, _ := hostLayout(t, cb, rng, 1, blocks, bs)
	_, err = cb.TransferBlocks(ctx, client.Write, lb, []uint32{1}, client.ToLayoutSegment("", "team-a/kv-region"), []uint32{2}, client.TransferOptions{})
	notFound("team-b writing blocks to team-a's private region name", err, "")
	_, err = cb.TransferBlocks(ctx, client.Write, lb, []uint32{1}, client.ToLayoutSegment("", "team-a/shared-region"), []uint32{2}, client.TransferOptions{})
	notFound("team-b writing blocks to a region name granted to it", err, isRegion)
	_, err = cb.ResolveSegment(ctx, "", "team-a/kv-layout")
	notFound("team-b resolving a layout name granted to it", err, isLayout)
}

// TestPublishedLayoutsResolveToTheirGeometry: ResolveSegment with layout set answers a published layout's block
// size, block count and region count, as a block transfer to the name would find it, and refuses as that
// transfer would: a name nobody published, a region's name (saying so), another namespace's ungranted name
// (saying nothing more), a malformed name. Nothing moves, and the layouts stay as they were.
func TestPublishedLayoutsResolveToTheirGeometry(t *testing.T) {
	a, proc, podA, podB := twoNamespaces(t)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(23, 24))
	proc.setPod(t, podA)
	ca := dial(t, a)
	_, privMem := hostLayout(t, ca, rng, 1, 8, 256, client.PublishLayout("kv"))
	hostLayout(t, ca, rng, 3, 5, 512, client.PublishLayout("kv-shared", "team-b"))
	if _, err := ca.RegisterHost(ctx, shm(t, 4096).File, 0, 4096, client.Segment("kv-region")); err != nil {
		t.Fatal(err)
	}
	before := snapshot(privMem)
	geometry := func(c *client.Client, name string, blockBytes, blocks uint64, regions uint32) {
		t.Helper()
		g, err := c.ResolveLayoutSegment(ctx, "", name)
		if err != nil {
			t.Fatalf("resolving layout %s: %v", name, err)
		}
		if g.GetBlockBytes() != blockBytes || g.GetBlocks() != blocks || g.GetRegions() != regions {
			t.Fatalf("layout %s resolved to %v, want %d blocks of %d bytes in %d regions", name, g, blocks, blockBytes, regions)
		}
	}
	refused := func(c *client.Client, name, code, hint string) {
		t.Helper()
		_, err := c.ResolveLayoutSegment(ctx, "", name)
		if client.Code(err).String() != code || !strings.Contains(err.Error(), hint) {
			t.Fatalf("resolving layout %q: %v, want %s saying %q", name, err, code, hint)
		}
		if hint == "" && strings.Contains(err.Error(), "segment, ") {
			t.Errorf("resolving layout %q: a caller without a grant was told what the name is: %v", name, err)
		}
	}
	geometry(ca, "kv", 256, 8, 1)
	geometry(ca, "kv-shared", 512, 5, 3)
	refused(ca, "kv-nobody", "NotFound", "no layout segment")
	refused(ca, "kv-region", "NotFound", "is a region's segment")
	for _, bad := range []string{"", "a/b/c", strings.Repeat("x", 300), "bad name"} {
		refused(ca, bad, "InvalidArgument", "")
	}
	proc.setPod(t, podB)
	cb := dial(t, a)
	geometry(cb, "team-a/kv-shared", 512, 5, 3)
	refused(cb, "team-a/kv", "NotFound", "")
	refused(cb, "kv", "NotFound", "")
	if !bytes.Equal(privMem[0].Bytes, before[0]) {
		t.Fatal("team-a's layout changed")
	}
	proc.setPod(t, podA)
	geometry(ca, "kv", 256, 8, 1)
}
