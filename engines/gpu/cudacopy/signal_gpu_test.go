// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// TestGPUKernelsWriteTheDoneWord: a submission whose kernel runs last writes the copier's done word from its
// last block instead of a stream write behind it. Every kernel form (one range, general and flat descriptors,
// a block list, a checked block list) and a copy-engine copy (the stream's write) take turns, so a kernel
// whose block counter were left set would never write the word; each wait must find the word at its copy's
// number and the copy's bytes in place, and a long kernel must not show its number before it ends.
func TestGPUKernelsWriteTheDoneWord(t *testing.T) {
	drv, nv := gpuEnv(t)
	c := newCopier(t, drv, cudacopy.Options{NVRTC: nv})
	if c.Mode() != cudacopy.ModeKernel {
		t.Skipf("no copy kernels: %s", c.Reason())
	}
	if on, why := c.DoneWord(); !on {
		t.Skipf("this driver cannot write a word from a stream (%s): waiters ask the driver", why)
	}
	const size = 512 << 20
	src, dst, free := devicePair(t, drv, c, size)
	defer free()
	r := rand.New(rand.NewPCG(21, 21))
	data := randomBytes(r, size)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, data) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	zero := make([]byte, size)
	clearDst := func() {
		t.Helper()
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(dst, zero) }); err != nil {
			t.Fatal(err)
		}
	}
	// expect checks that dst holds the source's bytes where moves put them (source offset to destination
	// offset, n bytes) and zeros elsewhere within its first span bytes.
	type move struct{ from, to, n uint64 }
	expect := func(what string, span uint64, moves []move) {
		t.Helper()
		got := make([]byte, span)
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, span)
		for _, m := range moves {
			copy(want[m.to:m.to+m.n], data[m.from:m.from+m.n])
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: the destination holds other bytes than the copy's", what)
		}
	}
	wait := func(what string, p *cudacopy.Pending, byKernel bool) {
		t.Helper()
		if p.SignalledByKernel() != byKernel {
			t.Fatalf("%s: signalled by its kernel %v, want %v", what, p.SignalledByKernel(), byKernel)
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		// No later submission is queued yet: only this one's own write can show its number.
		if !c.DoneWordReached(p.DoneSeq()) {
			t.Fatalf("%s: waited for, but the done word does not show its number %d", what, p.DoneSeq())
		}
	}

	// A long kernel: 34 ranges of 15 MiB (under the copy engine's threshold), about 250 µs of GPU time.
	var segs []cudacopy.Segment
	var long []move
	for i := range uint64(34) {
		m := move{from: i * (15 << 20), to: (33 - i) * (15 << 20), n: 15 << 20}
		segs = append(segs, cudacopy.Segment{Src: uint64(src) + m.from, Dst: uint64(dst) + m.to, Size: m.n})
		long = append(long, m)
	}
	clearDst()
	p, err := c.Submit(segs)
	if err != nil {
		t.Fatal(err)
	}
	if c.DoneWordReached(p.DoneSeq()) {
		t.Fatal("the done word showed a 510 MiB kernel copy ended right after it was queued")
	}
	wait("510 MiB in 34 ranges", p, true)
	expect("510 MiB in 34 ranges", 34*(15<<20), long)

	const bs, blocks = 720 * 16, 4096 // 11,520-byte blocks: flat 16-byte pieces
	pairs := []scatter.BlockBases{{Src: uint64(src), Dst: uint64(dst)}}
	for round := range 40 {
		clearSpan := uint64(blocks * bs)
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(dst, zero[:clearSpan]) }); err != nil {
			t.Fatal(err)
		}
		switch round % 5 {
		case 0: // one range: the contiguous kernel, its addresses as arguments
			off, n := uint64(r.IntN(1<<20)), uint64(1+r.IntN(1<<20))
			to := uint64(r.IntN(1 << 20))
			p, err = c.Submit([]cudacopy.Segment{{Src: uint64(src) + off, Dst: uint64(dst) + to, Size: n}})
			if err != nil {
				t.Fatal(err)
			}
			wait("one range", p, true)
			expect("one range", clearSpan, []move{{off, to, n}})
		case 1: // odd sizes at odd places: general descriptors
			var segs []cudacopy.Segment
			var moves []move
			for k := range uint64(300) {
				m := move{from: uint64(r.IntN(size - 4096)), to: k * 4096, n: uint64(1 + r.IntN(4095))}
				segs = append(segs, cudacopy.Segment{Src: uint64(src) + m.from, Dst: uint64(dst) + m.to, Size: m.n})
				moves = append(moves, m)
			}
			p, err = c.Submit(segs)
			if err != nil {
				t.Fatal(err)
			}
			wait("general", p, true)
			expect("general", clearSpan, moves)
		case 2, 3: // a block list, many blocks of the grid counted; checked on the GPU in round 3
			n := 1024 + r.IntN(blocks-1024)
			srcIDs := make([]uint32, n)
			perm := r.Perm(blocks)
			dstIDs := make([]uint32, n)
			var moves []move
			for i := range n {
				srcIDs[i], dstIDs[i] = uint32(r.IntN(size/bs)), uint32(perm[i])
				moves = append(moves, move{uint64(srcIDs[i]) * bs, uint64(dstIDs[i]) * bs, bs})
			}
			if round%5 == 2 {
				p, err = c.SubmitBlocks(pairs, bs, srcIDs, dstIDs, idRange(srcIDs), idRange(dstIDs))
			} else {
				p, err = c.SubmitCheckedBlocks(pairs, bs, srcIDs, dstIDs, uint32(size/bs), blocks)
			}
			if err != nil {
				t.Fatal(err)
			}
			wait("block list", p, true)
			expect("block list", clearSpan, moves)
		case 4: // the copy engine: the stream writes the word
			p, err = c.Submit([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: 32 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			wait("copy engine", p, false)
			expect("copy engine", clearSpan, []move{{0, 0, 32 << 20}})
		}
	}

	// A refused checked list still ends through its kernel's write, with its refusal.
	p, err = c.SubmitCheckedBlocks(pairs, bs, []uint32{0, 1}, []uint32{3, 3}, uint32(size/bs), blocks)
	if err == nil {
		err = p.Wait(ctx)
	}
	if err == nil {
		t.Fatal("a checked list naming one destination twice was not refused")
	}
	if p != nil && !c.DoneWordReached(p.DoneSeq()) {
		t.Fatal("a refused checked list ended without its kernel writing the done word")
	}

	// Timed submissions keep the stream's write behind their end event.
	timed, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, TimeDevice: true})
	if err != nil {
		t.Fatal(err)
	}
	defer timed.Close()
	p, err = timed.Submit([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if p.SignalledByKernel() {
		t.Fatal("a timed submission's kernel writes the done word before its end event")
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}
