// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// BenchmarkOneBlockRequestAndReply is the Go client's own work around a waited one-block call, without the round
// trip: the request checked and written as sendBlocks and fastBlocks write it ("plain"), a prepared run's frame
// ("prepared"), and, for comparison, the request built and marshalled as messages ("messages", how frames were
// written before); each with a success reply decoded.
func BenchmarkOneBlockRequestAndReply(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := &Client{}
	l, other := &Layout{c: c, id: 7}, &Layout{c: c, id: 9}
	ids, remoteIDs := []uint32{3}, []uint32{9}
	reply, err := proto.Marshal(&agentv1.FastReply{Response: &agentv1.TransferResponse{Status: &agentv1.TransferStatus{
		TransferId: 1 << 40, State: agentv1.TransferState_TRANSFER_STATE_SUCCEEDED, Bytes: 4096,
		Elapsed: durationpb.New(20 * time.Microsecond)}}})
	if err != nil {
		b.Fatal(err)
	}
	answer := func() {
		r, err := decodeReply(reply)
		if err != nil {
			b.Fatal(err)
		}
		if err := statusErr(r.GetResponse().GetStatus()); err != nil {
			b.Fatal(err)
		}
	}
	var frame []byte
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := newBlockRequest(ctx, Write, l, ids, ToLayout(other), remoteIDs, TransferOptions{}, true)
			if err != nil {
				b.Fatal(err)
			}
			frame = r.appendFast(frame[:0], ids, remoteIDs, 0)
			answer()
		}
	})
	b.Run("prepared", func(b *testing.B) {
		p, err := c.PrepareBlocks(Write, l, ids, ToLayout(other), remoteIDs, TransferOptions{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			r := p.req
			r.timeout = boundedTimeout(ctx, p.opts.Timeout, true)
			frame = r.appendFast(frame[:0], p.ids, p.remoteIDs, 0)
			answer()
		}
	})
	b.Run("messages", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			r, err := newBlockRequest(ctx, Write, l, ids, ToLayout(other), remoteIDs, TransferOptions{}, true)
			if err != nil {
				b.Fatal(err)
			}
			req := r.message()
			req.LocalIds, req.RemoteIds = packIDs(ids), packIDs(remoteIDs)
			if _, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: req}}); err != nil {
				b.Fatal(err)
			}
			answer()
		}
	})
}

// TestBlockFrameIsTheRequestOfTheArguments: whatever the arguments and the context, the frame a block call
// writes decodes to the FastRequest of the TransferBlocksRequest those arguments make (the timeout TransferBlocks
// gives the agent included, none where it gives none; ids in the frame or counted in the arena), and gRPC's
// message is the same request.
func TestBlockFrameIsTheRequestOfTheArguments(t *testing.T) {
	c := &Client{}
	l, other := &Layout{c: c, id: 7}, &Layout{c: c, id: 1 << 40}
	zero := &Layout{c: c} // a layout id of 0 is still named (a oneof member is written when zero)
	ids, remoteIDs := []uint32{3, 1 << 31, 0}, []uint32{9, 8, 7}
	byID := func(id uint64) *agentv1.LayoutRef {
		return &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: id}}
	}
	bySegment := func(node, segment string) *agentv1.LayoutRef {
		return &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: segment}, Node: node}
	}
	for _, tc := range []struct {
		name   string
		op     Op
		remote RemoteLayout
		ref    *agentv1.LayoutRef
		opts   TransferOptions
		ctx    func() (context.Context, context.CancelFunc)
		wait   bool
		arena  uint32
	}{
		{"no deadline, no timeout", Read, ToLayout(other), byID(1 << 40), TransferOptions{}, background, true, 0},
		{"no deadline, a timeout", Write, ToLayout(other), byID(1 << 40), TransferOptions{Timeout: 1500 * time.Millisecond}, background, true, 0},
		{"whole seconds", Read, ToLayoutSegment("node-b", "kv"), bySegment("node-b", "kv"), TransferOptions{Timeout: 3 * time.Second}, background, true, 0},
		{"under a second", Read, ToLayout(zero), byID(0), TransferOptions{Timeout: 250 * time.Millisecond}, background, false, 0},
		{"a deadline sooner than the timeout", Read, ToLayout(other), byID(1 << 40), TransferOptions{Timeout: time.Hour}, within(2 * time.Second), true, 0},
		{"a deadline and the agent's default", Write, ToLayoutSegment("", "kv"), bySegment("", "kv"), TransferOptions{}, within(5 * time.Second), true, 0},
		{"a deadline past the timeout", Read, ToLayout(other), byID(1 << 40), TransferOptions{Timeout: 250 * time.Microsecond}, within(time.Minute), true, 0},
		{"a deadline already passed", Read, ToLayout(other), byID(1 << 40), TransferOptions{}, within(-time.Second), true, 0},
		{"a notification, not waited", Write, ToLayoutSegment("node-c", "prefill/kv"), bySegment("node-c", "prefill/kv"), TransferOptions{Notify: []byte("layer 3 done")}, background, false, 0},
		{"ids in the arena", Read, ToLayout(other), byID(1 << 40), TransferOptions{Timeout: time.Second}, background, true, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := tc.ctx()
			defer cancel()
			r, err := newBlockRequest(ctx, tc.op, l, ids, tc.remote, remoteIDs, tc.opts, tc.wait)
			if err != nil {
				t.Fatal(err)
			}
			// The request the arguments make, built here from them.
			op := agentv1.Op_OP_READ
			if tc.op == Write {
				op = agentv1.Op_OP_WRITE
			}
			want := &agentv1.TransferBlocksRequest{Op: op, LayoutId: 7, Remote: tc.ref, IdBytes: 4, Notify: tc.opts.Notify,
				Wait: tc.wait}
			if d := boundedTimeout(ctx, tc.opts.Timeout, tc.wait); d > 0 {
				want.Timeout = durationpb.New(d)
			}
			got := &agentv1.FastRequest{}
			if err := proto.Unmarshal(r.appendFast([]byte{0xee}, ids, remoteIDs, tc.arena)[1:], got); err != nil {
				t.Fatal(err)
			}
			msg := r.message()
			if tc.arena > 0 {
				want.ArenaIds, msg.ArenaIds = tc.arena, tc.arena
			} else {
				want.LocalIds, want.RemoteIds = packIDs(ids), packIDs(remoteIDs)
				msg.LocalIds, msg.RemoteIds = packIDs(ids), packIDs(remoteIDs)
			}
			if !proto.Equal(got.GetBlocks(), msg) {
				t.Fatalf("the frame decodes to %v, gRPC's message is %v", got.GetBlocks(), msg)
			}
			// The two timeouts were read from the clock a moment apart: equal to the millisecond.
			gt, wt := got.GetBlocks().GetTimeout(), want.GetTimeout()
			if (gt == nil) != (wt == nil) || gt != nil && (gt.AsDuration()-wt.AsDuration()).Abs() > time.Millisecond {
				t.Fatalf("timeout %v, want %v", gt, wt)
			}
			got.GetBlocks().Timeout, want.Timeout = nil, nil
			if !proto.Equal(got, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: want}}) {
				t.Fatalf("the frame decodes to %v, want %v", got, want)
			}
			// The frame fastBlocks sends also says when the agent must answer: what the call waits for its reply
			// (the context's deadline, else fastDefaultDeadline), less the answer's way back.
			sent := &agentv1.FastRequest{}
			if err := proto.Unmarshal(appendCallTimeout(ctx, r.appendFast(nil, ids, remoteIDs, tc.arena)), sent); err != nil {
				t.Fatal(err)
			}
			left := time.Until(callDeadline(ctx))
			if ct := sent.GetCallTimeout(); ct == nil {
				t.Fatal("no call_timeout")
			} else if d := ct.AsDuration(); (d > left && d > time.Millisecond) || d < left-60*time.Millisecond {
				t.Fatalf("call_timeout %v for a call that waits %v: want less than that, by at most 50 ms", d, left)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		op     Op
		remote RemoteLayout
		ids    []uint32
		want   string
	}{
		{"unequal counts", Write, ToLayout(other), ids[:1], "3 local ids and 1 remote ids"},
		{"no remote", Write, RemoteLayout{}, remoteIDs, "names neither a layout nor a segment"},
		{"an unknown op", Op(9), ToLayout(other), remoteIDs, "unknown op 9"},
		{"a segment name that is not UTF-8", Write, ToLayoutSegment("", "kv\xff"), remoteIDs, "not valid UTF-8"},
		{"a node name that is not UTF-8", Write, ToLayoutSegment("node\xc3", "kv"), remoteIDs, "not valid UTF-8"},
	} {
		if _, err := newBlockRequest(context.Background(), tc.op, l, ids, tc.remote, tc.ids, TransferOptions{}, true); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// Random block requests, frames and messages alike: every frame decodes to its request's gRPC message with its ids
// (or the arena's count), whatever the ids, names, notification and timeout.
func TestBlockFramesOfRandomRequestsDecodeToTheirMessage(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var frame []byte
	for i := range 3000 {
		r := blockRequest{op: agentv1.Op(1 + rng.IntN(2)), layoutID: rng.Uint64() >> rng.IntN(64), wait: rng.IntN(2) == 0,
			timeout: time.Duration(rng.Int64N(int64(48*time.Hour))) >> rng.IntN(48)}
		if rng.IntN(2) == 0 {
			r.byID, r.remoteID = true, rng.Uint64()>>rng.IntN(64)
		} else {
			r.segment, r.node = "kv-"+strings.Repeat("s", rng.IntN(300)), strings.Repeat("n", rng.IntN(3)*70)
		}
		if rng.IntN(3) == 0 {
			r.notify = make([]byte, rng.IntN(2000))
			for k := range r.notify {
				r.notify[k] = byte(rng.Uint32())
			}
		}
		n := rng.IntN(1500)
		ids, remoteIDs := make([]uint32, n), make([]uint32, n)
		for k := range ids {
			ids[k], remoteIDs[k] = rng.Uint32(), rng.Uint32()
		}
		var arena uint32
		if rng.IntN(4) == 0 {
			arena = uint32(n)
		}
		frame = r.appendFast(frame[:0], ids, remoteIDs, arena)
		got := &agentv1.FastRequest{}
		if err := proto.Unmarshal(frame, got); err != nil {
			t.Fatalf("request %d: the frame does not decode: %v", i, err)
		}
		want := r.message()
		if arena > 0 {
			want.ArenaIds = arena
		} else {
			want.LocalIds, want.RemoteIds = packIDs(ids), packIDs(remoteIDs)
		}
		if !proto.Equal(got, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: want}}) {
			t.Fatalf("request %d (%+v): the frame decodes to %v, want %v", i, r, got.GetBlocks(), want)
		}
		if size := proto.Size(got); size != len(frame) {
			t.Fatalf("request %d: a frame of %d bytes for a message of %d", i, len(frame), size)
		}
	}
}

// The field numbers the block frame is written with are agent.proto's.
func TestBlockWireFieldNumbers(t *testing.T) {
	num := func(m proto.Message, field string) protowire.Number {
		f := m.ProtoReflect().Descriptor().Fields().ByName(protoreflect.Name(field))
		if f == nil {
			t.Fatalf("%T has no field %s", m, field)
		}
		return f.Number()
	}
	for _, f := range []struct {
		m     proto.Message
		field string
		want  protowire.Number
	}{
		{&agentv1.FastRequest{}, "blocks", fastRequestBlocks},
		{&agentv1.FastRequest{}, "call_timeout", fastRequestCallTimeout},
		{&agentv1.TransferBlocksRequest{}, "op", blocksOp},
		{&agentv1.TransferBlocksRequest{}, "layout_id", blocksLayoutID},
		{&agentv1.TransferBlocksRequest{}, "remote", blocksRemote},
		{&agentv1.TransferBlocksRequest{}, "local_ids", blocksLocalIDs},
		{&agentv1.TransferBlocksRequest{}, "remote_ids", blocksRemoteIDs},
		{&agentv1.TransferBlocksRequest{}, "id_bytes", blocksIDBytes},
		{&agentv1.TransferBlocksRequest{}, "timeout", blocksTimeout},
		{&agentv1.TransferBlocksRequest{}, "notify", blocksNotify},
		{&agentv1.TransferBlocksRequest{}, "wait", blocksWait},
		{&agentv1.TransferBlocksRequest{}, "arena_ids", blocksArenaIDs},
		{&agentv1.LayoutRef{}, "layout_id", layoutRefLayoutID},
		{&agentv1.LayoutRef{}, "segment", layoutRefSegment},
		{&agentv1.LayoutRef{}, "node", layoutRefNode},
	} {
		if got := num(f.m, f.field); got != f.want {
			t.Errorf("%T.%s is field %d, the frame writes it as %d", f.m, f.field, got, f.want)
		}
	}
	// Every field of the request is written: a field added to agent.proto needs a line here and in appendFast.
	if n := (&agentv1.TransferBlocksRequest{}).ProtoReflect().Descriptor().Fields().Len(); n != 10 {
		t.Errorf("TransferBlocksRequest has %d fields, the frame writes 10", n)
	}
}

// A prepared transfer keeps copies of the caller's ids and notification, and checks its arguments when prepared.
func TestPreparedBlocksKeepTheirIDs(t *testing.T) {
	c := &Client{}
	l, other := &Layout{c: c, id: 7}, &Layout{c: c, id: 9}
	ids, remoteIDs, note := []uint32{5, 1}, []uint32{9, 8}, []byte("step 1")
	p, err := c.PrepareBlocks(Write, l, ids[:1], ToLayout(other), remoteIDs[:1], TransferOptions{Notify: note})
	if err != nil {
		t.Fatal(err)
	}
	ids[0], note[5] = 6, '2'
	got := &agentv1.FastRequest{}
	if err := proto.Unmarshal(p.req.appendFast(nil, p.ids, p.remoteIDs, 0), got); err != nil || !slices.Equal(got.GetBlocks().LocalIds, packIDs([]uint32{5})) {
		t.Fatalf("prepared ids %x (%v), want those of the prepare", got.GetBlocks().GetLocalIds(), err)
	}
	if n := string(got.GetBlocks().GetNotify()); n != "step 1" {
		t.Fatalf("prepared notification %q, want the prepare's %q", n, "step 1")
	}
	if n := string(p.opts.Notify); n != "step 1" { // what Run sends through TransferBlocks, without the fast path
		t.Fatalf("the notification a prepared transfer sends without the fast path is %q, want the prepare's %q", n, "step 1")
	}
	if _, err := c.PrepareBlocks(Write, l, ids, ToLayout(other), remoteIDs[:1], TransferOptions{}); err == nil {
		t.Fatal("unequal id counts were prepared")
	}
}

func background() (context.Context, context.CancelFunc) { return context.Background(), func() {} }

func within(d time.Duration) func() (context.Context, context.CancelFunc) {
	return func() (context.Context, context.CancelFunc) { return context.WithTimeout(context.Background(), d) }
}

// A waited transfer polls for its reply for the client's spin plus its bytes' time at waitedSpinRate, within
// maxWaitedSpin (or a longer spin of the caller's); a submission, a wait and a client that never polls keep
// their spin.
func TestWaitedTransfersPollForTheirBytes(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name  string
		spin  time.Duration
		wait  bool
		bytes uint64
		want  time.Duration
	}{
		{"a 4 KiB call", DefaultSpin, true, 4096, DefaultSpin + 4096*time.Nanosecond/1000},
		{"a waited 64 MiB copy", DefaultSpin, true, 64 * mib, DefaultSpin + 67108864*time.Nanosecond/1000},
		{"a 64 MiB submission", DefaultSpin, false, 64 * mib, DefaultSpin},
		{"a waited 16 GiB copy", DefaultSpin, true, 16 << 30, maxWaitedSpin},
		{"a client that never polls", 0, true, 64 * mib, 0},
		{"a caller's spin past the bound", 5 * time.Millisecond, true, 16 << 30, 5 * time.Millisecond},
	} {
		c := &Client{spin: tc.spin}
		if got := c.spinFor(tc.wait, tc.bytes); got != tc.want {
			t.Errorf("%s: polls %v, want %v", tc.name, got, tc.want)
		}
	}
	// What a layout's call moves: every region's blocks.
	l := &Layout{blockBytes: 16 << 10, regions: make([]*Region, 64)}
	if got := l.bytesOf(1024); got != 1<<30 {
		t.Errorf("1,024 blocks of 64 regions of 16 KiB: %d bytes, want 1 GiB", got)
	}
	if got := itemBytes([]Item{{Length: 3}, {Length: 5 << 20}}); got != 3+5<<20 {
		t.Errorf("items of 3 B and 5 MiB: %d bytes", got)
	}
}

// Ids are written as little-endian 32-bit integers whatever their count, as the agent reads them.
func TestBlockIDsAreLittleEndian(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	for _, n := range []int{0, 1, 3, 1023, 15360} {
		ids := make([]uint32, n)
		want := make([]byte, 4*n)
		for i := range ids {
			ids[i] = r.Uint32()
			want[4*i], want[4*i+1], want[4*i+2], want[4*i+3] = byte(ids[i]), byte(ids[i]>>8), byte(ids[i]>>16), byte(ids[i]>>24)
		}
		if got := packIDs(ids); !bytes.Equal(got, want) {
			t.Fatalf("%d ids packed as %x, want %x", n, got[:min(len(got), 16)], want[:min(len(want), 16)])
		}
		arena := bytes.Repeat([]byte{0xee}, 4*n+8)
		putIDs(arena, ids)
		if !bytes.Equal(arena[:4*n], want) || !bytes.Equal(arena[4*n:], bytes.Repeat([]byte{0xee}, 8)) {
			t.Fatalf("%d ids written into an arena: wrong bytes, or past their own", n)
		}
	}
}

// BenchmarkPackIDs packs the ids of a 15,360-block transfer (one side).
func BenchmarkPackIDs(b *testing.B) {
	ids := make([]uint32, 15360)
	for i := range ids {
		ids[i] = uint32(i * 7)
	}
	arena := make([]byte, 4*len(ids))
	for b.Loop() {
		putIDs(arena, ids)
	}
}
