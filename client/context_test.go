// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestACallWhoseContextEndedReadsSo: a registration whose context was cancelled, or whose deadline passed, before
// it reached the agent reads Canceled or DeadlineExceeded (not Unknown), leaves nothing registered, and the
// same memory registers under the same segment name afterwards.
func TestACallWhoseContextEndedReadsSo(t *testing.T) {
	srv, stop, err := runLocalAgent()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, srv.SocketPath(), client.WithName("ended-contexts"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	mem, err := client.NewSharedMemory("kv", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()

	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	expired, cancelExpired := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, tc := range []struct {
		ctx  context.Context
		want codes.Code
	}{{cancelled, codes.Canceled}, {expired, codes.DeadlineExceeded}} {
		r, err := c.RegisterHost(tc.ctx, mem.File, 0, 1<<20, client.Segment("kv"))
		if err == nil {
			t.Fatalf("registered with a context that had ended: region %d", r.ID())
		}
		if got := client.Code(err); got != tc.want {
			t.Errorf("Code(%v) = %v, want %v", err, got, tc.want)
		}
	}
	r, err := c.RegisterHost(ctx, mem.File, 0, 1<<20, client.Segment("kv"))
	if err != nil {
		t.Fatalf("the segment name after the ended calls: %v", err)
	}
	if _, err := c.ResolveSegment(ctx, "", "kv"); err != nil {
		t.Fatalf("resolving the registered segment: %v", err)
	}
	if err := c.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
}
