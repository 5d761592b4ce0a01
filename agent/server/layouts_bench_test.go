// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
)

// BenchmarkBlockTransferOverhead is one block transfer through the fast socket between host layouts of
// 2^18 blocks, with the composite assembled as the agent assembles it: one 720 B block (the fixed cost of a call),
// 15,360 of 720 B (the cost per id beside the copy) and of 16 B (the ids' own path: the Go client writes lists
// of 1,024 ids and more into its id arena); "1 block, socket" is the one-block call of a client whose frames stay
// on the socket (WithoutMailbox) in the same run; "1 block, driven" is the one-block call of an agent whose
// block copies, like GPU copies, end when the waiting call's poll sees them end (enginetest.PollingHost), so the
// call takes the path of a GPU copy's around a host copy; "1 block, prepared" is the one-block call prepared
// once (client.PrepareBlocks) and run each time.
func BenchmarkBlockTransferOverhead(b *testing.B) {
	t := &testing.T{}
	opts := baseOptions(t, newProcFixture(t))
	opts.Engine = nodeComposite(t, "node-a")
	a := startAgent(t, opts)
	mailboxed, socketOnly := dial(t, a), dial(t, a, client.WithoutMailbox())
	polled := dial(t, startOnBackend(t, enginetest.NewPollingHost(1)))
	rng := rand.New(rand.NewPCG(1, 2))
	const blocks = 1 << 18
	type pair struct{ src, dst *client.Layout }
	layouts := func(c *client.Client, bs uint64) pair {
		src, _ := hostLayout(t, c, rng, 1, blocks, bs)
		dst, _ := hostLayout(t, c, rng, 1, blocks, bs)
		return pair{src, dst}
	}
	wide, narrow, socketWide, polledWide := layouts(mailboxed, 720), layouts(mailboxed, 16), layouts(socketOnly, 720), layouts(polled, 720)
	for _, bc := range []struct {
		name string
		c    *client.Client
		l    pair
		n    int
	}{
		{"1 block", mailboxed, wide, 1},
		{"15360 blocks", mailboxed, wide, 15360},
		{"15360 blocks of 16 B", mailboxed, narrow, 15360},
		{"1 block, socket", socketOnly, socketWide, 1},
		{"1 block, driven", polled, polledWide, 1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, d := make([]uint32, bc.n), make([]uint32, bc.n)
			for i, v := range rng.Perm(blocks)[:bc.n] {
				s[i] = uint32(v)
			}
			for i, v := range rng.Perm(blocks)[:bc.n] {
				d[i] = uint32(v)
			}
			for b.Loop() {
				ctx, cancel := callContext()
				_, err := bc.c.TransferBlocks(ctx, client.Write, bc.l.src, s, client.ToLayout(bc.l.dst), d, client.TransferOptions{})
				cancel()
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("1 block, prepared", func(b *testing.B) {
		p, err := mailboxed.PrepareBlocks(client.Write, wide.src, []uint32{uint32(rng.IntN(blocks))}, client.ToLayout(wide.dst),
			[]uint32{uint32(rng.IntN(blocks))}, client.TransferOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			ctx, cancel := callContext()
			_, err := p.Run(ctx)
			cancel()
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// callContext is one benchmarked call's deadline, cancelled after it as a caller would: ctxT's contexts live until
// the test's cleanup (never, under the benchmark's bare testing.T), and hundreds of thousands of live deadline
// timers made the Go scheduler's timer upkeep a fifth of the benchmark's CPU time and its calls two to seven times
// slower.
func callContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// TestBlockCallAllocations bounds the allocations of one waited one-block transfer through the fast socket, the
// Go client's and the agent's together (they share this process), with the composite assembled as the agent's:
// each is work for the collector on the latency-bound path. 56 before the agent kept its decoded frames, reply,
// layouts' memory and a one-plan transfer's parts inline; 35 after; 25 once the Go client wrote its block frames
// directly instead of building and marshalling messages. The bound leaves five for pools the collector emptied.
func TestBlockCallAllocations(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Engine = nodeComposite(t, "node-a")
	a := startAgent(t, opts)
	c := dial(t, a)
	rng := rand.New(rand.NewPCG(1, 2))
	src, _ := hostLayout(t, c, rng, 1, 64, 720)
	dst, _ := hostLayout(t, c, rng, 1, 64, 720)
	s, d := []uint32{3}, []uint32{9}
	call := func() {
		if _, err := c.TransferBlocks(ctxT(t), client.Write, src, s, client.ToLayout(dst), d, client.TransferOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	call()
	got := testing.AllocsPerRun(300, call)
	t.Logf("%.1f allocations a waited one-block call", got)
	if got > 30 {
		t.Errorf("%.1f allocations a waited one-block call, want at most 30", got)
	}
}
