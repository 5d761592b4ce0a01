// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// hostLayout registers n regions of blocks*bs bytes of fresh shared memory, filled with random bytes.
func hostLayout(t *testing.T, c *client.Client, rng *rand.Rand, n, blocks int, bs uint64, opts ...client.LayoutOption) (*client.Layout, []*client.SharedMemory) {
	t.Helper()
	regions, mems := hostRegions(t, c, rng, n, uint64(blocks)*bs)
	l, err := c.RegisterLayout(ctxT(t), regions, bs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, mems
}

// hostRegions registers n regions of size bytes of fresh shared memory, filled with random bytes.
func hostRegions(t *testing.T, c *client.Client, rng *rand.Rand, n int, size uint64) ([]*client.Region, []*client.SharedMemory) {
	t.Helper()
	var regions []*client.Region
	var mems []*client.SharedMemory
	for range n {
		m := shm(t, size)
		fillRandom(rng, m.Bytes)
		r, err := c.RegisterHost(ctxT(t), m.File, 0, m.Size())
		if err != nil {
			t.Fatal(err)
		}
		regions, mems = append(regions, r), append(mems, m)
	}
	return regions, mems
}

// fillRandom fills b with bytes of rng.
func fillRandom(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

func snapshot(mems []*client.SharedMemory) [][]byte {
	out := make([][]byte, len(mems))
	for i, m := range mems {
		out[i] = bytes.Clone(m.Bytes)
	}
	return out
}

// TestBlockTransfersMoveExactlyTheNamedBlocks writes and reads blocks between two layouts of two regions, one
// published by another connection, and checks every byte of every region, moved or not.
func TestBlockTransfersMoveExactlyTheNamedBlocks(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	rng := rand.New(rand.NewPCG(11, 12))
	const bs, blocks = 720, 32
	owner := dial(t, a)
	_, pubMem := hostLayout(t, owner, rng, 2, blocks, bs, client.PublishLayout("kv-decode"))
	c := dial(t, a)
	l, mem := hostLayout(t, c, rng, 2, blocks, bs)

	local, remote := []uint32{3, 0, 31, 17}, []uint32{30, 1, 2, 16}
	before := snapshot(pubMem)
	if _, err := c.TransferBlocks(ctxT(t), client.Write, l, local, client.ToLayoutSegment("", "kv-decode"), remote, client.TransferOptions{}); err != nil {
		t.Fatalf("write blocks: %v", err)
	}
	for k := range 2 {
		want := before[k]
		for i := range local {
			copy(want[uint64(remote[i])*bs:][:bs], mem[k].Bytes[uint64(local[i])*bs:][:bs])
		}
		if !bytes.Equal(pubMem[k].Bytes, want) {
			t.Fatalf("region %d of the published layout differs from the blocks written", k)
		}
	}
	// Read other blocks back into the caller's layout, over gRPC this time.
	before = snapshot(mem)
	req := &agentv1.TransferBlocksRequest{Op: agentv1.Op_OP_READ, LayoutId: l.ID(), Wait: true, IdBytes: 8,
		Remote:   &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: "kv-decode"}},
		LocalIds: int64s(5, 6), RemoteIds: int64s(9, 10)}
	resp, err := c.API().TransferBlocks(ctxT(t), req)
	if err != nil || resp.Status.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("read blocks over gRPC: %v %v", resp, err)
	}
	if resp.Items != 4 || resp.Bytes != 4*bs {
		t.Fatalf("response counts %d items, %d bytes; want 4 and %d", resp.Items, resp.Bytes, 4*bs)
	}
	for k := range 2 {
		want := before[k]
		copy(want[5*bs:][:bs], pubMem[k].Bytes[9*bs:][:bs])
		copy(want[6*bs:][:bs], pubMem[k].Bytes[10*bs:][:bs])
		if !bytes.Equal(mem[k].Bytes, want) {
			t.Fatalf("region %d of the reader differs from the blocks read", k)
		}
	}
}

func int64s(v ...int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		for j := range 8 {
			b[8*i+j] = byte(uint64(x) >> (8 * j))
		}
	}
	return b
}

// TestPreparedBlockTransfersRunAsTransferBlocks: a transfer prepared once moves the blocks named when it was
// prepared at every run, on the fast socket, through the id arena (long lists) and through gRPC (no fast
// path); one the agent refuses is refused at every run and moves nothing, as is one whose layout went away.
func TestPreparedBlockTransfersRunAsTransferBlocks(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	rng := rand.New(rand.NewPCG(21, 22))
	const bs, blocks = 64, 4096
	for _, c := range []*client.Client{dial(t, a), dialNoFast(t, a)} {
		src, srcMem := hostLayout(t, c, rng, 2, blocks, bs)
		dst, dstMem := hostLayout(t, c, rng, 2, blocks, bs)
		for _, n := range []int{1, 7, 1500} {
			local, remote := make([]uint32, n), make([]uint32, n)
			for i, v := range rng.Perm(blocks)[:n] {
				local[i] = uint32(v)
			}
			for i, v := range rng.Perm(blocks)[:n] {
				remote[i] = uint32(v)
			}
			named := slices.Clone(local)
			p, err := c.PrepareBlocks(client.Write, src, local, client.ToLayout(dst), remote, client.TransferOptions{Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			local[0] = (local[0] + 1) % blocks // the prepared transfer keeps its own copy
			for run := range 3 {
				for _, m := range srcMem {
					fillRandom(rng, m.Bytes)
				}
				before := snapshot(dstMem)
				st, err := p.Run(ctxT(t))
				if err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
					t.Fatalf("%d ids, run %d: %v %v", n, run, st, err)
				}
				for k := range dstMem {
					want := before[k]
					for i := range named {
						copy(want[uint64(remote[i])*bs:][:bs], srcMem[k].Bytes[uint64(named[i])*bs:][:bs])
					}
					if !bytes.Equal(dstMem[k].Bytes, want) {
						t.Fatalf("%d ids, run %d: region %d differs from the blocks prepared", n, run, k)
					}
				}
			}
		}
		// Refused at every run, nothing moved.
		before := snapshot(dstMem)
		bad, err := c.PrepareBlocks(client.Write, src, []uint32{1, blocks}, client.ToLayout(dst), []uint32{2, 3}, client.TransferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if _, err := bad.Run(ctxT(t)); client.Code(err).String() != "InvalidArgument" || !strings.Contains(err.Error(), "outside") {
				t.Fatalf("a prepared id out of range: %v", err)
			}
		}
		if err := c.DeregisterLayout(ctxT(t), src); err != nil {
			t.Fatal(err)
		}
		gone, err := c.PrepareBlocks(client.Write, dst, []uint32{1}, client.ToLayout(src), []uint32{1}, client.TransferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gone.Run(ctxT(t)); client.Code(err).String() != "NotFound" {
			t.Fatalf("a prepared transfer to a deregistered layout: %v", err)
		}
		for k := range dstMem {
			if !bytes.Equal(dstMem[k].Bytes, before[k]) {
				t.Fatalf("region %d changed although every run was refused", k)
			}
		}
	}
}

// TestBlockTransferRefusals: out-of-range, negative and duplicate ids, unequal counts, other geometries,
// unknown layouts and layouts of other nodes are refused with a clear error and move nothing.
func TestBlockTransferRefusals(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	rng := rand.New(rand.NewPCG(13, 14))
	const bs, blocks = 64, 16
	c := dial(t, a)
	l, mem := hostLayout(t, c, rng, 2, blocks, bs)
	l2, mem2 := hostLayout(t, c, rng, 2, blocks, bs)
	wide, wideMem := hostLayout(t, c, rng, 2, blocks/2, 2*bs)
	three, threeMem := hostLayout(t, c, rng, 3, blocks, bs)
	all := [][]*client.SharedMemory{mem, mem2, wideMem, threeMem}
	var before [][][]byte
	for _, m := range all {
		before = append(before, snapshot(m))
	}
	u32 := func(v ...uint32) []uint32 { return v }
	for name, tc := range map[string]struct {
		local, remote []uint32
		to            client.RemoteLayout
		code          string
		says          string
	}{
		"id out of range":        {u32(16), u32(0), client.ToLayout(l2), "InvalidArgument", "local block id 16 (entry 0) is outside the layout's 16 blocks"},
		"remote id out of range": {u32(1), u32(1 << 31), client.ToLayout(l2), "InvalidArgument", "remote block id 2147483648 (-2147483648 as int32) (entry 0) is outside"},
		"duplicate destinations": {u32(1, 2), u32(4, 4), client.ToLayout(l2), "InvalidArgument", "named twice"},
		"other block size":       {u32(1), u32(1), client.ToLayout(wide), "InvalidArgument", "geometry"},
		"other region count":     {u32(1), u32(1), client.ToLayout(three), "InvalidArgument", "geometry"},
		"unknown segment":        {u32(1), u32(1), client.ToLayoutSegment("", "nope"), "NotFound", "no layout segment"},
		"other node, no peers":   {u32(1), u32(1), client.ToLayoutSegment("node-z", "kv"), "Unavailable", "no peer channel"},
		// Past 4 MiB of ids the agent cannot read the request: the client refuses it with the limit.
		"more ids than a call moves":    {make([]uint32, 600000), make([]uint32, 600000), client.ToLayout(l2), "InvalidArgument", "at most 65536 blocks a call"},
		"one id more than a call moves": {make([]uint32, 65537), make([]uint32, 65537), client.ToLayout(l2), "InvalidArgument", "at most 65536 blocks"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.TransferBlocks(ctxT(t), client.Write, l, tc.local, tc.to, tc.remote, client.TransferOptions{})
			if client.Code(err).String() != tc.code || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("want %s saying %q, got %v", tc.code, tc.says, err)
			}
			// Prepared, the same transfer is refused as it is prepared (a count past the agent's limit) or run.
			p, err := c.PrepareBlocks(client.Write, l, tc.local, tc.to, tc.remote, client.TransferOptions{})
			if err == nil {
				_, err = p.Run(ctxT(t))
			}
			if client.Code(err).String() != tc.code || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("prepared: want %s saying %q, got %v", tc.code, tc.says, err)
			}
		})
	}
	raw := func(req *agentv1.TransferBlocksRequest) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req.Op, req.Wait = agentv1.Op_OP_WRITE, true
		_, err := c.API().TransferBlocks(ctx, req)
		return err
	}
	toL2 := &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: l2.ID()}}
	for name, tc := range map[string]struct {
		req  *agentv1.TransferBlocksRequest
		code string
	}{
		"unequal counts":    {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2, LocalIds: int64s(1, 2), RemoteIds: int64s(1), IdBytes: 8}, "InvalidArgument"},
		"negative int64 id": {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2, LocalIds: int64s(-1), RemoteIds: int64s(1), IdBytes: 8}, "InvalidArgument"},
		"ragged id bytes":   {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2, LocalIds: []byte{1, 2, 3}, RemoteIds: []byte{1, 2, 3}}, "InvalidArgument"},
		"id width 3":        {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2, LocalIds: []byte{1, 2, 3}, RemoteIds: []byte{1, 2, 3}, IdBytes: 3}, "InvalidArgument"},
		"no ids":            {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2}, "InvalidArgument"},
		"unknown layout":    {&agentv1.TransferBlocksRequest{LayoutId: 12345, Remote: toL2, LocalIds: int64s(1), RemoteIds: int64s(1), IdBytes: 8}, "NotFound"},
		"no remote":         {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), LocalIds: int64s(1), RemoteIds: int64s(1), IdBytes: 8}, "InvalidArgument"},
		"too many ids":      {&agentv1.TransferBlocksRequest{LayoutId: l.ID(), Remote: toL2, LocalIds: make([]byte, 4*70000), RemoteIds: make([]byte, 4*70000)}, "InvalidArgument"},
	} {
		t.Run(name, func(t *testing.T) {
			if err := raw(tc.req); client.Code(err).String() != tc.code {
				t.Fatalf("want %s, got %v", tc.code, err)
			}
		})
	}
	for i, m := range all {
		for k := range m {
			if !bytes.Equal(m[k].Bytes, before[i][k]) {
				t.Fatalf("memory %d/%d changed although every transfer was refused", i, k)
			}
		}
	}
	// Registration refusals.
	if _, err := c.RegisterLayout(ctxT(t), nil, bs); client.Code(err).String() != "InvalidArgument" {
		t.Fatalf("empty layout: %v", err)
	}
	r1, err := c.RegisterHost(ctxT(t), mem[0].File, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterLayout(ctxT(t), []*client.Region{r1}, bs); client.Code(err).String() != "InvalidArgument" {
		t.Fatalf("100 bytes in 64-byte blocks: %v", err)
	}
}

// TestBlockLayoutsAcrossPods: a pod's private layout is invisible to another pod (NotFound, by id, as either
// side), while the layout it published is reachable; refusals leave the owner's bytes alone.
func TestBlockLayoutsAcrossPods(t *testing.T) {
	kube := startAPIServer(t)
	podA := createPod(t, kube, "infer", "prefill-0", "node-a")
	podB := createPod(t, kube, "infer", "decode-0", "node-a")
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: &identity.APIPodResolver{Reader: kube, NodeName: "node-a"}}
	opts.Policy = identity.StaticPolicy{"infer"}
	a := startAgent(t, opts)
	rng := rand.New(rand.NewPCG(15, 16))
	const bs, blocks = 128, 8
	proc.setPod(t, podA)
	ca := dial(t, a)
	private, privMem := hostLayout(t, ca, rng, 1, blocks, bs)
	_, pubMem := hostLayout(t, ca, rng, 1, blocks, bs, client.PublishLayout("decode-kv"))
	proc.setPod(t, podB)
	cb := dial(t, a)
	lb, lbMem := hostLayout(t, cb, rng, 1, blocks, bs)
	before := snapshot(privMem)
	ref := &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: private.ID()}}
	for name, req := range map[string]*agentv1.TransferBlocksRequest{
		"another pod's layout as local":  {Op: agentv1.Op_OP_WRITE, LayoutId: private.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: lb.ID()}}, LocalIds: int64s(1), RemoteIds: int64s(1), IdBytes: 8, Wait: true},
		"another pod's layout as remote": {Op: agentv1.Op_OP_WRITE, LayoutId: lb.ID(), Remote: ref, LocalIds: int64s(1), RemoteIds: int64s(1), IdBytes: 8, Wait: true},
	} {
		if _, err := cb.API().TransferBlocks(ctxT(t), req); client.Code(err).String() != "NotFound" {
			t.Fatalf("%s: want NotFound, got %v", name, err)
		}
	}
	if !bytes.Equal(privMem[0].Bytes, before[0]) {
		t.Fatal("another pod's private layout changed")
	}
	if _, err := cb.TransferBlocks(ctxT(t), client.Write, lb, []uint32{2}, client.ToLayoutSegment("", "decode-kv"), []uint32{3}, client.TransferOptions{}); err != nil {
		t.Fatalf("writing into the published layout: %v", err)
	}
	if !bytes.Equal(pubMem[0].Bytes[3*bs:4*bs], lbMem[0].Bytes[2*bs:3*bs]) {
		t.Fatal("the published layout's block 3 is not the writer's block 2")
	}
}

// TestSubmittedBlockTransfersOverlapAndSettle: block transfers submitted without waiting (SubmitBlocks) are
// waited for afterwards and move exactly their blocks; ids the agent refuses come back from the submission.
func TestSubmittedBlockTransfersOverlapAndSettle(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	rng := rand.New(rand.NewPCG(13, 14))
	const bs, blocks = 64, 64
	c := dial(t, a)
	src, srcMem := hostLayout(t, c, rng, 2, blocks, bs)
	dst, dstMem := hostLayout(t, c, rng, 2, blocks, bs)
	before := snapshot(dstMem)
	ctx := ctxT(t)
	var xs []*client.Transfer
	var local, remote []uint32
	for k := range 4 {
		l, r := []uint32{uint32(k), uint32(40 + k)}, []uint32{uint32(2 * k), uint32(63 - k)}
		x, err := c.SubmitBlocks(ctx, client.Write, src, l, client.ToLayout(dst), r, client.TransferOptions{})
		if err != nil {
			t.Fatalf("submitting blocks %d: %v", k, err)
		}
		xs, local, remote = append(xs, x), append(local, l...), append(remote, r...)
	}
	for _, x := range xs {
		if _, err := x.Wait(ctx); err != nil {
			t.Fatalf("waiting for transfer %d: %v", x.ID, err)
		}
	}
	for k := range 2 {
		want := before[k]
		for i := range local {
			copy(want[uint64(remote[i])*bs:][:bs], srcMem[k].Bytes[uint64(local[i])*bs:][:bs])
		}
		if !bytes.Equal(dstMem[k].Bytes, want) {
			t.Fatalf("region %d differs from the blocks the submitted transfers wrote", k)
		}
	}
	if _, err := c.SubmitBlocks(ctx, client.Write, src, []uint32{0, 1}, client.ToLayout(dst), []uint32{5, 5}, client.TransferOptions{}); client.Code(err).String() != "InvalidArgument" {
		t.Fatalf("a repeated destination id: %v, want InvalidArgument from the submission", err)
	}
}

// TestLayoutWithADeregisteredRegionIsRefused: once one region of a layout is deregistered, a block transfer
// naming that layout on either side is refused (NotFound, naming the region) and moves nothing, even after the
// same memory is registered again (a new region: a layout names the regions it was made of), and a layout of
// the new region moves its blocks. The agent keeps a layout's regions' memory; this is what must not go stale.
func TestLayoutWithADeregisteredRegionIsRefused(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	rng := rand.New(rand.NewPCG(15, 16))
	const bs, blocks = 64, 16
	c := dial(t, a)
	regions, mems := hostRegions(t, c, rng, 2, blocks*bs)
	gone, err := c.RegisterLayout(ctxT(t), regions, bs)
	if err != nil {
		t.Fatal(err)
	}
	other, otherMem := hostLayout(t, c, rng, 2, blocks, bs)
	ids := []uint32{3}
	if _, err := c.TransferBlocks(ctxT(t), client.Write, other, ids, client.ToLayout(gone), ids, client.TransferOptions{}); err != nil {
		t.Fatalf("before the deregistration: %v", err)
	}
	if err := c.Deregister(ctxT(t), regions[1]); err != nil {
		t.Fatal(err)
	}
	again, err := c.RegisterHost(ctxT(t), mems[1].File, 0, mems[1].Size())
	if err != nil {
		t.Fatal(err)
	}
	before := [][][]byte{snapshot(mems), snapshot(otherMem)}
	for name, call := range map[string]func() error{
		"as the remote side": func() error {
			_, err := c.TransferBlocks(ctxT(t), client.Write, other, ids, client.ToLayout(gone), ids, client.TransferOptions{})
			return err
		},
		"as the local side": func() error {
			_, err := c.TransferBlocks(ctxT(t), client.Write, gone, ids, client.ToLayout(other), ids, client.TransferOptions{})
			return err
		},
	} {
		if err := call(); client.Code(err).String() != "NotFound" || !strings.Contains(err.Error(), "no longer registered: deregister the layout") {
			t.Fatalf("%s: want NotFound saying the region is no longer registered, got %v", name, err)
		}
	}
	if after := [][][]byte{snapshot(mems), snapshot(otherMem)}; !reflect.DeepEqual(before, after) {
		t.Fatal("a refused transfer changed memory")
	}
	renewed, err := c.RegisterLayout(ctxT(t), []*client.Region{regions[0], again}, bs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TransferBlocks(ctxT(t), client.Write, other, []uint32{5}, client.ToLayout(renewed), []uint32{6}, client.TransferOptions{}); err != nil {
		t.Fatalf("a layout of the region registered again: %v", err)
	}
	for k := range 2 {
		if got, want := mems[k].Bytes[6*bs:7*bs], otherMem[k].Bytes[5*bs:6*bs]; !bytes.Equal(got, want) {
			t.Fatalf("region %d: block 6 is not block 5 of the other layout", k)
		}
	}
}
