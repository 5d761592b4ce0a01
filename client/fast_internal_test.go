// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// BenchmarkOneBlockRequestAndReply is the Go client's own work around a waited one-block call, without the round
// trip: the request checked, built and encoded as sendBlocks and fastBlocks build it ("plain") or a prepared
// run's frame ("prepared"), and a success reply decoded.
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
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			req, err := blocksRequest(ctx, Write, l, ids, ToLayout(other), remoteIDs, TransferOptions{}, true)
			if err != nil {
				b.Fatal(err)
			}
			req.LocalIds, req.RemoteIds = packIDs(ids), packIDs(remoteIDs)
			if _, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: req}}); err != nil {
				b.Fatal(err)
			}
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
			if len(p.payload(boundedTimeout(ctx, p.opts.Timeout, true))) == 0 {
				b.Fatal("an empty frame")
			}
			answer()
		}
	})
}

// TestPreparedPayloadIsTheRequestTransferBlocksSends: whatever the context leaves, a prepared run's frame decodes
// to the FastRequest the plain call builds for the same arguments and context (the timeout TransferBlocks would
// give the agent included, and none where it gives none).
func TestPreparedPayloadIsTheRequestTransferBlocksSends(t *testing.T) {
	c := &Client{}
	l, other := &Layout{c: c, id: 7}, &Layout{c: c, id: 1 << 40}
	ids, remoteIDs := []uint32{3, 1 << 31, 0}, []uint32{9, 8, 7}
	for _, tc := range []struct {
		name   string
		remote RemoteLayout
		opts   TransferOptions
		ctx    func() (context.Context, context.CancelFunc)
	}{
		{"no deadline, no timeout", ToLayout(other), TransferOptions{}, background},
		{"no deadline, a timeout", ToLayout(other), TransferOptions{Timeout: 1500 * time.Millisecond}, background},
		{"whole seconds", ToLayoutSegment("node-b", "kv"), TransferOptions{Timeout: 3 * time.Second}, background},
		{"a deadline sooner than the timeout", ToLayout(other), TransferOptions{Timeout: time.Hour}, within(2 * time.Second)},
		{"a deadline and the agent's default", ToLayoutSegment("", "kv"), TransferOptions{}, within(5 * time.Second)},
		{"a deadline past the timeout", ToLayout(other), TransferOptions{Timeout: 250 * time.Microsecond}, within(time.Minute)},
		{"a deadline already passed", ToLayout(other), TransferOptions{}, within(-time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.PrepareBlocks(Read, l, ids, tc.remote, remoteIDs, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := tc.ctx()
			defer cancel()
			want, err := blocksRequest(ctx, Read, l, ids, tc.remote, remoteIDs, tc.opts, true)
			if err != nil {
				t.Fatal(err)
			}
			got := &agentv1.FastRequest{}
			if err := proto.Unmarshal(p.payload(boundedTimeout(ctx, tc.opts.Timeout, true)), got); err != nil {
				t.Fatal(err)
			}
			want.LocalIds, want.RemoteIds = packIDs(ids), packIDs(remoteIDs)
			// The two timeouts were read from the clock a moment apart: equal to the millisecond.
			gt, wt := got.GetBlocks().GetTimeout(), want.GetTimeout()
			if (gt == nil) != (wt == nil) || gt != nil && (gt.AsDuration()-wt.AsDuration()).Abs() > time.Millisecond {
				t.Fatalf("timeout %v, want %v", gt, wt)
			}
			got.GetBlocks().Timeout, want.Timeout = nil, nil
			if !proto.Equal(got, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: want}}) {
				t.Fatalf("prepared frame decodes to %v, want %v", got, want)
			}
		})
	}
	ids[0] = 5 // the caller's slices are copied when prepared
	p, err := c.PrepareBlocks(Write, l, ids[:1], ToLayout(other), remoteIDs[:1], TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids[0] = 6
	got := &agentv1.FastRequest{}
	if err := proto.Unmarshal(p.payload(0), got); err != nil || !slices.Equal(got.GetBlocks().LocalIds, packIDs([]uint32{5})) {
		t.Fatalf("prepared ids %x (%v), want those of the prepare", got.GetBlocks().GetLocalIds(), err)
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
