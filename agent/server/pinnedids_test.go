// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
)

// lendingEngine is the host composite with id buffers of its own (as the GPU backend lends pinned ones): it
// counts what is lent and not given back, and lends at most limit at once.
type lendingEngine struct {
	*engines.Composite
	mu          sync.Mutex
	out, lent   int
	limit       int
	doubleFrees int
}

func (e *lendingEngine) PinnedIDs(n int) ([]uint32, func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.out >= e.limit {
		return nil, nil
	}
	e.out++
	e.lent++
	freed := false
	return make([]uint32, n), func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if freed {
			e.doubleFrees++
			return
		}
		freed = true
		e.out--
	}
}

func (e *lendingEngine) state() (out, lent, doubleFrees int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.out, e.lent, e.doubleFrees
}

// Block ids go into the engine's lent buffers, and every buffer comes back once its transfer settled or was
// refused, whatever the path: waited, submitted and waited for later, refused ids, a repeated destination,
// and an engine with one buffer left (the server uses its own arrays and gives the lone one back).
func TestLentIDBuffersComeBack(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	eng := &lendingEngine{Composite: hostComposite(t, "node-a"), limit: 1 << 10}
	opts.Engine = eng
	a := startAgent(t, opts)
	c := dial(t, a)
	rng := rand.New(rand.NewPCG(21, 22))
	const bs, blocks = 32, 4096
	src, srcMem := hostLayout(t, c, rng, 1, blocks, bs)
	dst, dstMem := hostLayout(t, c, rng, 1, blocks, bs)
	ctx := ctxT(t)
	settled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			out, _, doubles := eng.state()
			if doubles != 0 {
				t.Fatalf("%s: %d buffers given back twice", what, doubles)
			}
			if out == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d id buffers still lent after the transfer settled", what, out)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	want := bytes.Clone(dstMem[0].Bytes)
	move := func(l, r []uint32) {
		for i := range l {
			copy(want[uint64(r[i])*bs:][:bs], srcMem[0].Bytes[uint64(l[i])*bs:][:bs])
		}
	}
	perm := func(n int) []uint32 {
		out := make([]uint32, n)
		for i, v := range rng.Perm(blocks)[:n] {
			out[i] = uint32(v)
		}
		return out
	}

	l, r := perm(3000), perm(3000)
	if _, err := c.TransferBlocks(ctx, client.Write, src, l, client.ToLayout(dst), r, client.TransferOptions{}); err != nil {
		t.Fatalf("waited block transfer: %v", err)
	}
	move(l, r)
	settled("waited transfer")
	if _, lent, _ := eng.state(); lent != 2 {
		t.Fatalf("%d buffers lent for one transfer, want 2 (one per side)", lent)
	}
	l, r = perm(500), perm(500)
	x, err := c.SubmitBlocks(ctx, client.Write, src, l, client.ToLayout(dst), r, client.TransferOptions{})
	if err != nil {
		t.Fatalf("submitting: %v", err)
	}
	if _, err := x.Wait(ctx); err != nil {
		t.Fatalf("waiting: %v", err)
	}
	move(l, r)
	settled("submitted transfer")
	if !bytes.Equal(dstMem[0].Bytes, want) {
		t.Fatal("the destination differs from the blocks moved through lent buffers")
	}

	for name, ids := range map[string][2][]uint32{
		"an id past the layout":  {{1, blocks}, {2, 3}},
		"a repeated destination": {{1, 2}, {7, 7}},
	} {
		if _, err := c.TransferBlocks(ctx, client.Write, src, ids[0], client.ToLayout(dst), ids[1], client.TransferOptions{}); client.Code(err).String() != "InvalidArgument" {
			t.Fatalf("%s: %v, want InvalidArgument", name, err)
		}
		settled(name)
	}
	if !bytes.Equal(dstMem[0].Bytes, want) {
		t.Fatal("a refused transfer changed the destination")
	}

	eng.mu.Lock()
	eng.limit = 1 // one buffer left: not enough for a transfer
	eng.mu.Unlock()
	l, r = perm(64), perm(64)
	if _, err := c.TransferBlocks(ctx, client.Write, src, l, client.ToLayout(dst), r, client.TransferOptions{}); err != nil {
		t.Fatalf("block transfer with one buffer to lend: %v", err)
	}
	move(l, r)
	settled("one buffer to lend")
	if !bytes.Equal(dstMem[0].Bytes, want) {
		t.Fatal("the destination differs after a transfer on the server's own arrays")
	}
}
