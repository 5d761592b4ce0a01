// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

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
