// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"math/rand/v2"
	"testing"

	"github.com/fabricxfer/fabricxfer/client"
)

// BenchmarkBlockTransferOverhead is one block transfer through the fast socket between host layouts of
// 2^18 blocks of 720 B: one block (the fixed cost of a call) and 15,360 blocks (the cost per id beside the copy),
// with the composite assembled as the agent assembles it; "1 block, socket" is the one-block call of a client
// whose frames stay on the socket (WithoutMailbox) in the same run.
func BenchmarkBlockTransferOverhead(b *testing.B) {
	t := &testing.T{}
	opts := baseOptions(t, newProcFixture(t))
	opts.Engine = nodeComposite(t, "node-a")
	a := startAgent(t, opts)
	mailboxed, socketOnly := dial(t, a), dial(t, a, client.WithoutMailbox())
	rng := rand.New(rand.NewPCG(1, 2))
	const bs, blocks = 720, 1 << 18
	src, _ := hostLayout(t, mailboxed, rng, 1, blocks, bs)
	dst, _ := hostLayout(t, mailboxed, rng, 1, blocks, bs)
	sSrc, _ := hostLayout(t, socketOnly, rng, 1, blocks, bs)
	sDst, _ := hostLayout(t, socketOnly, rng, 1, blocks, bs)
	for _, n := range []int{1, 15360, -1} {
		c, src, dst := mailboxed, src, dst
		if n < 0 {
			c, src, dst, n = socketOnly, sSrc, sDst, 1
		}
		name := map[int]string{1: "1 block", 15360: "15360 blocks"}[n]
		if c == socketOnly {
			name = "1 block, socket"
		}
		b.Run(name, func(b *testing.B) {
			s, d := make([]uint32, n), make([]uint32, n)
			for i, v := range rng.Perm(blocks)[:n] {
				s[i] = uint32(v)
			}
			for i, v := range rng.Perm(blocks)[:n] {
				d[i] = uint32(v)
			}
			for b.Loop() {
				if _, err := c.TransferBlocks(ctxT(t), client.Write, src, s, client.ToLayout(dst), d, client.TransferOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestBlockCallAllocations bounds the allocations of one waited one-block transfer through the fast socket, the
// Go client's and the agent's together (they share this process), with the composite assembled as the agent's:
// each is work for the collector on the latency-bound path. 56 before the agent kept its decoded frames, reply,
// layouts' memory and a one-plan transfer's parts inline; 35 after. The bound leaves four for pools the collector
// emptied.
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
	if got := testing.AllocsPerRun(300, call); got > 40 {
		t.Errorf("%.1f allocations a waited one-block call, want at most 40", got)
	}
}
