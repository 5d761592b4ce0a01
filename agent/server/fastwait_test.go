// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// TestGoClientWaitsOnTheFastSocketWithoutHoldingIt: the Go client submits without waiting and waits on the
// fast socket; a transfer still running after the fast wait's slice is waited for through gRPC, so while it is
// held the same client's other calls go on at once; the wait ends when the transfer does, with its bytes in
// place; a wait whose context ends first says so within that deadline and leaves the client working.
func TestGoClientWaitsOnTheFastSocketWithoutHoldingIt(t *testing.T) {
	backend, c, ctx, m, src, dst := newGatedBed(t)
	item := func(off uint64) []client.Item {
		return []client.Item{{Local: src, LocalOffset: off, Remote: client.ToRegion(dst), RemoteOffset: off, Length: 4096}}
	}
	moved := func(off uint64) bool { return bytes.Equal(m.Bytes[1<<20+off:1<<20+off+4096], m.Bytes[off:off+4096]) }

	// Open gate: submitted, then waited, every transfer ends with its bytes.
	for i := range uint64(20) {
		tr, err := c.Submit(ctx, client.Write, item(i*4096), client.TransferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.Wait(ctx); err != nil {
			t.Fatalf("wait %d: %v", i, err)
		}
		if !moved(i * 4096) {
			t.Fatalf("transfer %d waited for, its bytes not in place", i)
		}
	}

	release := backend.Gate.Shut(t)
	defer release()
	held, err := c.Submit(ctx, client.Write, item(100*4096), client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { _, err := held.Wait(ctx); waited <- err }()
	time.Sleep(50 * time.Millisecond) // past the fast wait's slice: the wait is on gRPC now
	select {
	case err := <-waited:
		t.Fatalf("a wait on a held transfer returned: %v", err)
	default:
	}
	// The same client's calls are not held behind that wait.
	submitted := make(chan *client.Transfer, 1)
	go func() {
		tr, err := c.Submit(ctx, client.Write, item(101*4096), client.TransferOptions{})
		if err != nil {
			t.Error(err)
		}
		submitted <- tr
	}()
	var other *client.Transfer
	select {
	case other = <-submitted:
	case <-time.After(2 * time.Second):
		t.Fatal("a submission was held behind another call's wait")
	}
	if other == nil {
		t.FailNow()
	}
	// A wait whose context ends first says so within its deadline.
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = other.Wait(short)
	if status.Code(err) != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a wait cut by its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("a wait with a 30 ms deadline took %v", d)
	}
	release()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("the held transfer's wait: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held transfer's wait did not end once the gate opened")
	}
	if _, err := other.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !moved(100*4096) || !moved(101*4096) {
		t.Fatal("the held transfers' bytes are not in place")
	}
	// The client still works on its fast path.
	if _, err := c.Do(ctx, client.Write, item(102*4096), client.TransferOptions{}); err != nil || !moved(102*4096) {
		t.Fatalf("a transfer after the waits: %v", err)
	}
}

// TestGoClientsDeadlineEndsItsTransferOnTheAgent: a waited transfer whose context has a deadline (and no
// timeout of its own) is ended by the agent within that deadline, which answers on the same fast connection: the
// call returns the agent's failed status, not the client's own timeout (which would drop the fast connection),
// the transfer never lands once its backend frees up, and the next call works.
func TestGoClientsDeadlineEndsItsTransferOnTheAgent(t *testing.T) {
	backend, c, ctx, m, src, dst := newGatedBed(t)
	item := []client.Item{{Local: src, Remote: client.ToRegion(dst), Length: 4096}}
	release := backend.Gate.Shut(t)
	defer release()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	st, err := c.Do(short, client.Write, item, client.TransferOptions{})
	took := time.Since(start)
	var terr *client.TransferError
	if !errors.As(err, &terr) || st == nil || !strings.Contains(st.Error, "deadline") {
		t.Fatalf("a waited transfer held past its context's deadline: %v (status %v), want the agent's deadline failure", err, st)
	}
	if took > 2*time.Second {
		t.Fatalf("the call with a 300 ms deadline took %v", took)
	}
	release()
	time.Sleep(100 * time.Millisecond)
	if bytes.Equal(m.Bytes[1<<20:1<<20+4096], m.Bytes[:4096]) {
		t.Fatal("the transfer landed after the agent ended it")
	}
	if _, err := c.Do(ctx, client.Write, item, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Bytes[1<<20:1<<20+4096], m.Bytes[:4096]) {
		t.Fatal("the next transfer's bytes are not in place")
	}
}

// newGatedBed starts an agent whose only engine copies host memory behind a gate, and registers the two halves of
// a 2 MiB memfd with a client of it: src (random bytes) and dst.
func newGatedBed(t *testing.T) (enginetest.GatedHost, *client.Client, context.Context, *client.SharedMemory, *client.Region, *client.Region) {
	t.Helper()
	backend := enginetest.NewGatedHost()
	c := dial(t, startOnBackend(t, backend))
	ctx := ctxT(t)
	m := shm(t, 2<<20)
	fill(t, m.Bytes[:1<<20])
	src, err := c.RegisterHost(ctx, m.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := c.RegisterHost(ctx, m.File, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return backend, c, ctx, m, src, dst
}

// startOnBackend starts an agent whose composite has one engine, xgmi over backend, assembled as the agent
// assembles its node's (one region registry, the engines' metrics).
func startOnBackend(t *testing.T, backend xgmi.Backend) *agent {
	t.Helper()
	regions := engines.NewRegistry("node-a", 0)
	x, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: regions}, backend)
	if err != nil {
		t.Fatal(err)
	}
	opts := baseOptions(t, newProcFixture(t))
	if opts.Engine, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a", Metrics: engines.NewMetrics(), Registry: regions}, x); err != nil {
		t.Fatal(err)
	}
	return startAgent(t, opts)
}

// TestACallCancelledWhileWaitingReadsCancelled: a waited transfer whose context is cancelled while the agent
// holds it fails with an error that is context.Canceled by errors.Is and by Code; the fast socket said
// DEADLINE_EXCEEDED for any ended context.
func TestACallCancelledWhileWaitingReadsCancelled(t *testing.T) {
	backend, c, ctx, _, src, dst := newGatedBed(t)
	release := backend.Gate.Shut(t)
	defer release()
	cancelled, cancel := context.WithCancel(ctx)
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err := c.Do(cancelled, client.Write, []client.Item{{Local: src, Remote: client.ToRegion(dst), Length: 4096}}, client.TransferOptions{})
	if !errors.Is(err, context.Canceled) || client.Code(err) != codes.Canceled {
		t.Fatalf("a waited transfer cancelled while held: %v (code %v), want Canceled by errors.Is and Code", err, client.Code(err))
	}
}
