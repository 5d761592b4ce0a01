// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
)

// TestEndSessionFreesTheSessionBeforeItAnswers: EndSession answers once the caller's regions and layouts, and
// their names, are gone (the next connection of the same pod registers the same names at once: when a
// connection closes they go in the background), refuses the connection's later calls with FailedPrecondition
// but answers EndSession again, ends its fast connection, and leaves another pod's registrations working.
func TestEndSessionFreesTheSessionBeforeItAnswers(t *testing.T) {
	opts, proc := podOptions(t)
	a := startAgent(t, opts)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(51, 52))
	proc.setPod(t, "5d0c1e2a-3333-4c1e-9d8a-000000000003")
	other := dial(t, a)
	kept, _ := hostLayout(t, other, rng, 1, 8, 256, client.PublishLayout("other-kv"))

	proc.setPod(t, "5d0c1e2a-4444-4c1e-9d8a-000000000004")
	for round := range 20 {
		c := dial(t, a)
		mem := shm(t, 4096)
		if _, err := c.RegisterHost(ctx, mem.File, 0, 4096, client.Segment("handoff")); err != nil {
			t.Fatalf("round %d: registering the segment the last session held: %v", round, err)
		}
		l, _ := hostLayout(t, c, rng, 1, 4, 256, client.PublishLayout("kv"))
		if _, err := c.API().EndSession(ctx, &agentv1.EndSessionRequest{}); err != nil {
			t.Fatalf("round %d: EndSession: %v", round, err)
		}
		if _, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("round %d: a call after EndSession: %v, want FailedPrecondition", round, err)
		}
		if _, err := c.TransferBlocks(ctx, client.Write, l, []uint32{0}, client.ToLayout(l), []uint32{1}, client.TransferOptions{}); err == nil {
			t.Fatalf("round %d: a block transfer after EndSession succeeded", round)
		}
		if _, err := c.API().EndSession(ctx, &agentv1.EndSessionRequest{}); err != nil {
			t.Fatalf("round %d: EndSession again: %v", round, err)
		}
	}
	if _, err := other.TransferBlocks(ctx, client.Write, kept, []uint32{1, 2}, client.ToLayout(kept), []uint32{5, 6}, client.TransferOptions{}); err != nil {
		t.Fatalf("another pod's layout after 20 sessions ended: %v", err)
	}
}

// TestANameHeldByAnEndedSessionSaysSo: a segment whose session ended while a transfer on it was still in flight
// stays taken until the transfer settles (EndSession's wait ran out first), and registering it meanwhile says why
// and that it frees itself; once the transfer settles it registers.
func TestANameHeldByAnEndedSessionSaysSo(t *testing.T) {
	backend := enginetest.NewGatedHost()
	a := startOnBackend(t, backend)
	ctx := ctxT(t)
	m := shm(t, 2<<20)
	old := dial(t, a)
	src, err := old.RegisterHost(ctx, m.File, 0, 1<<20, client.Segment("handoff"))
	if err != nil {
		t.Fatal(err)
	}
	dst, err := old.RegisterHost(ctx, m.File, 1<<20, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	release := backend.Gate.Shut(t)
	if _, err := old.Submit(ctx, client.Write, []client.Item{{Local: src, Remote: client.ToRegion(dst), Length: 4096}}, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := old.API().EndSession(short, &agentv1.EndSessionRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("EndSession with a transfer held in flight: %v, want DeadlineExceeded", err)
	}
	again := dial(t, a)
	_, err = again.RegisterHost(ctx, m.File, 0, 4096, client.Segment("handoff"))
	if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "free once its transfers in flight settle") {
		t.Fatalf("registering the ending session's segment: %v, want AlreadyExists saying it frees itself", err)
	}
	release()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err = again.RegisterHost(ctx, m.File, 0, 4096, client.Segment("handoff")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the segment 10 s after the transfer was let go: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
