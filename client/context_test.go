// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
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

// TestEndedContextsAreTheirErrors: a call of every kind whose context ended before it was made fails with an
// error errors.Is finds the context's error in (not only its code), saying nothing was sent, and moves nothing;
// a negative transfer timeout and a pool slice the client did not allocate are refused with an error, not
// taken for the default or a panic.
func TestEndedContextsAreTheirErrors(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "ended-contexts")
	src, dst := sharedMemory(t, "src", 1<<16), sharedMemory(t, "dst", 1<<16)
	for i := range src.Bytes {
		src.Bytes[i] = byte(i)
	}
	rs, err := c.RegisterHost(ctx, src.File, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := c.RegisterLayout(ctx, []*client.Region{rs}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := c.RegisterLayout(ctx, []*client.Region{rd}, 4096)
	if err != nil {
		t.Fatal(err)
	}
	prepared, err := c.PrepareBlocks(client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{2}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	expired, cancelExpired := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, ended := range []context.Context{cancelled, expired} {
		calls := map[string]func() error{
			"Write": func() error { _, err := c.Write(ended, rs, 0, client.ToRegion(rd), 0, 4096); return err },
			"TransferBlocks": func() error {
				_, err := c.TransferBlocks(ended, client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{2}, client.TransferOptions{})
				return err
			},
			"SubmitBlocks": func() error {
				_, err := c.SubmitBlocks(ended, client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{2}, client.TransferOptions{})
				return err
			},
			"PreparedBlocks.Run": func() error { _, err := prepared.Run(ended); return err },
		}
		for name, call := range calls {
			err := call()
			if !errors.Is(err, ended.Err()) {
				t.Errorf("%s with a context that ended (%v): %v, want an error that is the context's", name, ended.Err(), err)
			}
		}
	}
	if !bytes.Equal(dst.Bytes, make([]byte, len(dst.Bytes))) {
		t.Fatal("a call whose context had ended moved bytes")
	}
	_, err = c.TransferBlocks(ctx, client.Write, ls, []uint32{1}, client.ToLayout(ld), []uint32{2}, client.TransferOptions{Timeout: -time.Second})
	if client.Code(err) != codes.InvalidArgument {
		t.Errorf("a negative timeout: %v, want InvalidArgument", err)
	}
	items := []client.Item{{Local: rs, Remote: client.ToRegion(rd), Length: 4096}}
	if _, err := c.Do(ctx, client.Write, items, client.TransferOptions{Timeout: -time.Second}); client.Code(err) != codes.InvalidArgument {
		t.Errorf("a negative timeout on Do: %v, want InvalidArgument", err)
	}
	if err := c.Release(ctx, &client.PoolSlice{}); err == nil {
		t.Error("releasing a pool slice the client never allocated succeeded")
	}
	// A region of the caller's own memory wrapped as a slice is refused before the client forgets it: it stays
	// the client's to register again on Recover, and deregistering it works.
	if err := c.Release(ctx, &client.PoolSlice{Region: rs}); client.Code(err) != codes.InvalidArgument || !client.Holds(c, rs) {
		t.Errorf("releasing a region of the caller's own memory as a pool slice: %v (still held: %t), want InvalidArgument and held",
			err, client.Holds(c, rs))
	}
	if err := c.Deregister(ctx, rs); err != nil {
		t.Errorf("deregistering the region a refused Release named: %v", err)
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

// TestNamesAreFreeWhenCloseReturns: a process that closes its client and registers the same segment and layout
// names in a new one at once (a restarted engine, the next worker) finds them free: Close ends the session and the
// agent frees them before it answers (when only the connection closes, the agent frees them in the background).
func TestNamesAreFreeWhenCloseReturns(t *testing.T) {
	srv := startLocal(t)
	mem := sharedMemory(t, "kv", 1<<16)
	watcher, wctx := dialLocal(t, srv, "close-names-watcher")
	for round := range 30 {
		c, ctx := dialLocal(t, srv, "close-names")
		r, err := c.RegisterHost(ctx, mem.File, 0, 1<<16, client.Segment("handoff"))
		if err != nil {
			t.Fatalf("round %d: registering the names the last client closed with: %v", round, err)
		}
		if _, err := c.RegisterLayout(ctx, []*client.Region{r}, 4096, client.PublishLayout("kv")); err != nil {
			t.Fatalf("round %d: publishing the layout name the last client closed with: %v", round, err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		// Asked at once on a connection open already: no dial's round trips in between.
		if _, err := watcher.API().ResolveSegment(wctx, &agentv1.ResolveSegmentRequest{Segment: "handoff"}); client.Code(err) != codes.NotFound {
			t.Fatalf("round %d: the closed client's segment right after Close: %v, want NotFound", round, err)
		}
	}
}

// TestANotificationStreamSaysWhyItEnded: a stream's end reads as the client's calls do: the context's error when
// the caller cancelled it, ErrClosed after Close, ErrSessionLost when the agent stopped (it read as gRPC's
// Canceled or Unavailable, which a "Recover on ErrSessionLost" loop never met).
func TestANotificationStreamSaysWhyItEnded(t *testing.T) {
	srv, stopAgent, err := runLocalAgent()
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceFunc(stopAgent)
	t.Cleanup(stop)
	c, ctx := dialLocal(t, srv, "stream-ends")
	mem := sharedMemory(t, "kv", 1<<16)
	if _, err := c.RegisterHost(ctx, mem.File, 0, 1<<16); err != nil {
		t.Fatal(err)
	}
	listen := func(ctx context.Context) func() error {
		t.Helper()
		_, wait, err := c.Notifications(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return wait
	}
	cancelled, cancel := context.WithCancel(ctx)
	wait := listen(cancelled)
	cancel()
	if err := wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("a stream whose context was cancelled: %v, want context.Canceled", err)
	}
	wait = listen(ctx)
	stop()
	if err := wait(); !errors.Is(err, client.ErrSessionLost) {
		t.Errorf("a stream of an agent that stopped: %v, want ErrSessionLost", err)
	}

	srv2 := startLocal(t)
	c2, ctx2 := dialLocal(t, srv2, "stream-ends-close")
	if _, err := c2.RegisterHost(ctx2, mem.File, 0, 1<<16); err != nil {
		t.Fatal(err)
	}
	_, wait, err = c2.Notifications(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	c2.Close()
	if err := wait(); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a stream of a closed client: %v, want ErrClosed", err)
	}
}
