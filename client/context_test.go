// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestACallWhoseContextEndedReadsSo: a registration whose context was cancelled, or whose deadline passed, before
// it reached the agent reads Canceled or DeadlineExceeded (not Unknown), leaves nothing registered, and the
// same memory registers under the same segment name afterwards.
func TestACallWhoseContextEndedReadsSo(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "ended-contexts")
	mem := sharedMemory(t, "kv", 1<<20)

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

// startLocal runs an agent with its sockets in a fresh folder until the test ends.
func startLocal(t *testing.T) *server.Server {
	t.Helper()
	srv, stop, err := runLocalAgent()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return srv
}

// dialLocal dials srv as name with opts; the client closes, and the context (of 20 s) ends, with the test.
func dialLocal(t *testing.T, srv *server.Server, name string, opts ...client.Option) (*client.Client, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := client.Dial(ctx, srv.SocketPath(), append(opts, client.WithName(name))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ctx
}

// sharedMemory is size bytes of fresh shared memory, closed when the test ends.
func sharedMemory(t *testing.T, name string, size uint64) *client.SharedMemory {
	t.Helper()
	m, err := client.NewSharedMemory(name, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}
