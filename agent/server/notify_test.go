// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestANotifiedTransferIsOneNotificationPerListener: a block transfer with notify over a layout of several
// regions reaches a listener as one notification naming every region of the listener's it touched (ascending;
// region_id the first), not one a region (which filled a listener's buffer of 1,024 within 16 transfers over a
// 64-region layout); a read with notify is reported on the reader's regions, where its bytes landed; a listener
// of some of the regions hears only of those.
func TestANotifiedTransferIsOneNotificationPerListener(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(31, 32))
	const regions, blocks, bs = 4, 16, 256
	srcRegions, _ := hostRegions(t, c, rng, regions, blocks*bs)
	dstRegions, _ := hostRegions(t, c, rng, regions, blocks*bs)
	src, err := c.RegisterLayout(ctx, srcRegions, bs)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := c.RegisterLayout(ctx, dstRegions, bs)
	if err != nil {
		t.Fatal(err)
	}
	listen := func(rs []*client.Region) agentv1.Agent_NotificationsClient {
		t.Helper()
		req := &agentv1.NotificationsRequest{}
		for _, r := range rs {
			req.RegionIds = append(req.RegionIds, r.ID())
		}
		stream, err := c.API().Notifications(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Header(); err != nil {
			t.Fatal(err)
		}
		return stream
	}
	all, some := listen(nil), listen(dstRegions[1:3])
	ids := func(rs []*client.Region) []uint64 {
		var out []uint64
		for _, r := range rs {
			out = append(out, r.ID())
		}
		slices.Sort(out)
		return out
	}
	next := func(stream agentv1.Agent_NotificationsClient, what string) *agentv1.Notification {
		t.Helper()
		got := make(chan *agentv1.Notification, 1)
		go func() {
			n, err := stream.Recv()
			if err != nil {
				t.Error(err)
			}
			got <- n
		}()
		select {
		case n := <-got:
			if n == nil {
				t.FailNow()
			}
			return n
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no notification within 5 s", what)
		}
		return nil
	}
	check := func(n *agentv1.Notification, what string, want []uint64, op agentv1.Op, payload string) {
		t.Helper()
		if !slices.Equal(n.RegionIds, want) || n.RegionId != want[0] || n.Op != op || string(n.Payload) != payload {
			t.Fatalf("%s: %v, want regions %v (first %d), %v, payload %q", what, n, want, want[0], op, payload)
		}
	}

	if _, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1, 2}, client.ToLayout(dst), []uint32{3, 4},
		client.TransferOptions{Notify: []byte("written")}); err != nil {
		t.Fatal(err)
	}
	check(next(all, "a write, every region"), "a write, every region", ids(dstRegions), agentv1.Op_OP_WRITE, "written")
	check(next(some, "a write, two regions"), "a write, two regions", ids(dstRegions[1:3]), agentv1.Op_OP_WRITE, "written")
	// A read lands in the reader's own layout (src here): notified there.
	if _, err := c.TransferBlocks(ctx, client.Read, src, []uint32{5}, client.ToLayout(dst), []uint32{6},
		client.TransferOptions{Notify: []byte("read")}); err != nil {
		t.Fatal(err)
	}
	check(next(all, "a read"), "a read", ids(srcRegions), agentv1.Op_OP_WRITE, "read")
	// Nothing more came: one message a transfer and listener.
	if _, err := c.TransferBlocks(ctx, client.Write, src, []uint32{7}, client.ToLayout(dst), []uint32{8},
		client.TransferOptions{Notify: []byte("last")}); err != nil {
		t.Fatal(err)
	}
	check(next(all, "the last write"), "the last write", ids(dstRegions), agentv1.Op_OP_WRITE, "last")
	check(next(some, "the last write, two regions"), "the last write, two regions", ids(dstRegions[1:3]), agentv1.Op_OP_WRITE, "last")
}

// TestNotificationsNotReadAreBounded: a pod whose listeners never read cannot make the agent hold its
// notifications without bound. Its listeners together hold at most 32 MiB (payloads and region ids), and each at
// most 1,024 notifications; past that the listener furthest behind loses its stream with ResourceExhausted saying
// why, while the same pod's listener that reads, and another pod's, miss nothing.
func TestNotificationsNotReadAreBounded(t *testing.T) {
	opts, proc := podOptions(t)
	a := startAgent(t, opts)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(41, 42))
	type pod struct {
		c        *client.Client
		src, dst *client.Layout
	}
	newPod := func(uid string) pod {
		proc.setPod(t, uid)
		c := dial(t, a)
		src, _ := hostLayout(t, c, rng, 2, 4, 256)
		dst, _ := hostLayout(t, c, rng, 2, 4, 256)
		return pod{c, src, dst}
	}
	const floodUID = "0b6f4a2e-1111-4c1e-9d8a-000000000001"
	flood, quiet := newPod(floodUID), newPod("0b6f4a2e-2222-4c1e-9d8a-000000000002")
	listen := func(c *client.Client) agentv1.Agent_NotificationsClient {
		t.Helper()
		stream, err := c.API().Notifications(ctx, &agentv1.NotificationsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Header(); err != nil {
			t.Fatal(err)
		}
		return stream
	}
	// reader is a listener that reads, checking the payloads come in the order sent; got counts what it received.
	type reader struct {
		got  atomic.Int64
		done chan error
	}
	read := func(stream agentv1.Agent_NotificationsClient, want int) *reader {
		r := &reader{done: make(chan error, 1)}
		go func() {
			for i := range want {
				n, err := stream.Recv()
				if err != nil {
					r.done <- fmt.Errorf("after %d of %d notifications: %w", i, want, err)
					return
				}
				if got := binary.LittleEndian.Uint32(n.Payload); got != uint32(i) {
					r.done <- fmt.Errorf("notification %d carries %d", i, got)
					return
				}
				r.got.Add(1)
			}
			r.done <- nil
		}()
		return r
	}
	// keepUp waits until r is at most lag notifications behind sent: a listener that reads keeps up within a few,
	// however the scheduler of a loaded machine runs its goroutine (one that stopped for 63 writes was, rightly,
	// the furthest behind).
	keepUp := func(r *reader, sent int, lag int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); r.got.Load() < int64(sent)-lag; time.Sleep(50 * time.Microsecond) {
			select {
			case err := <-r.done: // it stopped reading: why, rather than a count 10 s later
				t.Fatalf("a listener that reads stopped after %d of %d notifications: %v", r.got.Load(), sent, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("a listener that reads got %d of %d notifications in 10 s", r.got.Load(), sent)
			}
		}
	}
	write := func(p pod, seq, size int) {
		t.Helper()
		payload := make([]byte, size)
		binary.LittleEndian.PutUint32(payload, uint32(seq))
		if _, err := p.c.TransferBlocks(ctx, client.Write, p.src, []uint32{1}, client.ToLayout(p.dst), []uint32{2},
			client.TransferOptions{Notify: payload}); err != nil {
			t.Fatal(err)
		}
	}
	// lostFor drains a listener that did not read and says why its stream ended.
	lostFor := func(stream agentv1.Agent_NotificationsClient) error {
		for {
			if _, err := stream.Recv(); err != nil {
				return err
			}
		}
	}

	// Eight listeners of the flooding pod never read, one does; the quiet pod's one reads.
	var idle []agentv1.Agent_NotificationsClient
	for range 8 {
		idle = append(idle, listen(flood.c))
	}
	// 62.5 MiB of notifications: even the last idle listener passes 32 MiB alone, beside what gRPC's flow control
	// window (at most 16 MiB a stream) lets through to its client.
	const transfers = 1000
	// The flooding pod's reader has a connection of its own, as another process of the pod would: on the idle
	// listeners' connection, gRPC's flow control and writer are shared with them.
	proc.setPod(t, floodUID)
	floodRead, quietRead := read(listen(dial(t, a)), transfers), read(listen(quiet.c), transfers)
	most := 0
	for i := range transfers {
		keepUp(floodRead, i, 8)
		keepUp(quietRead, i, 8)
		write(flood, i, 64<<10)
		write(quiet, i, 16)
		most = max(most, a.srv.QueuedNotificationBytes())
	}
	if most > 32<<20 {
		t.Errorf("the agent held %d bytes of notifications, want at most 32 MiB for the flooding pod", most)
	}
	for name, r := range map[string]*reader{"the flooding pod's listener that reads": floodRead, "the quiet pod's listener": quietRead} {
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not every notification within 10 s", name)
		}
	}
	for i, stream := range idle {
		if err := lostFor(stream); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "furthest behind") {
			t.Errorf("idle listener %d ended with %v, want ResourceExhausted saying it was furthest behind", i, err)
		}
	}
	if n := a.srv.QueuedNotificationBytes(); n != 0 {
		t.Errorf("%d bytes of notifications still held after every listener read or lost its stream", n)
	}

	// A listener 1,024 notifications behind loses its stream too, however small they are: 4 MiB of 4 KiB ones
	// here, sent past what the client's flow control window takes in (at most 16 MiB).
	behind := listen(quiet.c)
	for i := range 1024 + 4096 + 100 {
		write(quiet, i, 4<<10)
	}
	if err := lostFor(behind); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "1024 notifications behind") {
		t.Errorf("a listener that never read ended with %v, want ResourceExhausted saying it fell 1,024 behind", err)
	}
	if _, err := flood.c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); err != nil {
		t.Errorf("the agent after the flood: %v", err)
	}
}
