// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"math/rand/v2"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
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
