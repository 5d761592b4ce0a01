// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/h2stall"
)

// TestHostilePeerNotificationsAreBounded: another agent of the pool notifies through the peer channel with more
// regions than a transfer has items, refused before any is looked up under the receiving agent's lock, and with one
// region repeated tens of thousands of times, which reaches its listener once; a block transfer's many tags pass.
// The receiving node's listener keeps working.
func TestHostilePeerNotificationsAreBounded(t *testing.T) {
	a, b := startTwoNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cb := dialNode(t, b)
	mem := randomShm(t, 4096)
	rb, err := cb.RegisterHost(ctx, mem.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	notes, _, err := cb.Notifications(ctx, rb)
	if err != nil {
		t.Fatal(err)
	}
	_, md := describedMemory(t, rb.Descriptor())

	many := make([]engines.MemoryID, engines.MaxNotifyEntries+1)
	for i := range many {
		many[i] = engines.MemoryID(fmt.Sprintf("node-b/%x", i))
	}
	many[0] = md.ID
	err = a.peers.SendNotification(ctx, "node-b", engines.Notification{From: "node-a", Regions: many})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 65536") {
		t.Fatalf("a notification of %d regions: %v, want INVALID_ARGUMENT naming the bound", len(many), err)
	}
	select {
	case n := <-notes:
		t.Fatalf("a refused notification reached the listener: %v", n)
	default:
	}
	// Tags are not bounded by it: a block transfer planned item by item has one a block and region pair (here
	// 600 blocks of a 128-region layout).
	if err := a.peers.SendNotification(ctx, "node-b", engines.Notification{From: "node-a", Regions: []engines.MemoryID{md.ID},
		Tags: make([]engines.Tag, 600*128), Payload: []byte("blocks")}); err != nil {
		t.Fatalf("a block transfer's notification of %d tags: %v", 600*128, err)
	}
	select {
	case n := <-notes:
		if string(n.Payload) != "blocks" {
			t.Fatalf("the block transfer's notification: %v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listener got no notification of the block transfer")
	}

	repeated := make([]engines.MemoryID, 50_000)
	for i := range repeated {
		repeated[i] = md.ID
	}
	if err := a.peers.SendNotification(ctx, "node-b", engines.Notification{From: "node-a", Regions: repeated, Payload: []byte("once")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notes:
		if len(n.RegionIds) != 1 || n.RegionIds[0] != rb.ID() || string(n.Payload) != "once" {
			t.Fatalf("a region repeated 50,000 times reached the listener as %d region ids (%v)", len(n.RegionIds), n.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listener got no notification")
	}
}

// TestHostilePeerLookupsAreNames: another agent of the pool asks for a segment or a layout in the name of a
// "namespace" that no namespace can be called (megabytes, capitals), or for a reference of megabytes: INVALID_ARGUMENT
// with a short message, nothing recorded (a layout keeps its askers, to tell them when it goes), and the owner's
// published names still resolve for a real namespace.
func TestHostilePeerLookupsAreNames(t *testing.T) {
	a, b := startTwoNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cb := dialNode(t, b)
	mem := randomShm(t, 8192)
	rb, err := cb.RegisterHost(ctx, mem.File, 0, 8192, client.Segment("kv-b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.RegisterLayout(ctx, []*client.Region{rb}, 4096, client.PublishLayout("kv-layout")); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("a", 1<<20)
	for name, tc := range map[string]struct{ segment, asker string }{
		"a namespace of a megabyte":   {"kv-b", huge},
		"a namespace with capitals":   {"kv-b", "Infer"},
		"a namespace with a slash":    {"kv-b", "infer/x"},
		"a reference of a megabyte":   {huge, ""},
		"a namespace of 64 bytes":     {"kv-b", strings.Repeat("n", 64)},
		"a scoped reference too long": {strings.Repeat("n", 70) + "/kv-b", ""},
	} {
		for kind, ask := range map[string]func() error{
			"segment": func() error { _, err := a.peers.ResolveSegment(ctx, "node-b", tc.segment, tc.asker); return err },
			"layout":  func() error { _, err := a.peers.ResolveLayout(ctx, "node-b", tc.segment, tc.asker); return err },
		} {
			err := ask()
			if status.Code(err) != codes.InvalidArgument || len(err.Error()) > 512 {
				t.Fatalf("%s for a %s: %.200v (%d bytes), want a short INVALID_ARGUMENT", name, kind, err, len(fmt.Sprint(err)))
			}
		}
	}
	if _, err := a.peers.ResolveSegment(ctx, "node-b", "kv-b", ""); err != nil {
		t.Fatalf("the published segment for a local process of node-a: %v", err)
	}
	if _, err := a.peers.ResolveLayout(ctx, "node-b", "kv-layout", ""); err != nil {
		t.Fatalf("the published layout for a local process of node-a: %v", err)
	}
}

// TestHostilePeerStalledCallsEnd: an agent of the pool opens calls on the peer channel whose requests announce
// 4 MiB and stall, which gRPC buffers before any handler runs. One connection holds at most 128 at once (the 129th
// stream is refused), each ends within the serving agent's call limit, and the agent serves the pool meanwhile.
func TestHostilePeerStalledCallsEnd(t *testing.T) {
	a, b := startTwoNodes(t, func(_, b *node) { b.callLimit = 500 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cb := dialNode(t, b)
	mem := randomShm(t, 4096)
	if _, err := cb.RegisterHost(ctx, mem.File, 0, 4096, client.Segment("kv-b")); err != nil {
		t.Fatal(err)
	}

	cfg := a.tls.Config().Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", b.peerLn.Addr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	ended, err := h2stall.Calls(conn, agentv1.Peer_Notify_FullMethodName, 129, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ended[257] != "reset REFUSED_STREAM" {
		t.Fatalf("the 129th stalled call on one connection: %q, want the stream refused", ended[257])
	}
	for i := range 128 {
		if s := ended[uint32(2*i+1)]; s == "" {
			t.Fatalf("stalled call %d of 128 was still open %s after it started (call limit 500 ms): %d ended", i+1, time.Since(start), len(ended))
		}
	}
	if _, err := a.peers.ResolveSegment(ctx, "node-b", "kv-b", ""); err != nil {
		t.Fatalf("node-b's segment after the stalled calls: %v", err)
	}
}
