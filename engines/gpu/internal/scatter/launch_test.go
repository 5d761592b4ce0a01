// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import (
	"testing"
	"unsafe"
)

// TestShapeGrid holds the grid rule both backends launch with: one group (warp, wavefront) per piece in a
// round, flat forms one FlatChunk run per block, never more than one wave of resident blocks.
func TestShapeGrid(t *testing.T) {
	const threads, warps, wave = 256, 8, 132 * 8 // an H200: 132 SMs, 8 blocks each
	for _, c := range []struct {
		name string
		l    Layout
		kind Kernel
		grid uint32
	}{
		{"general, 20 pieces", Layout{Pieces: 20}, KernelGeneral, 3},
		{"uniform, 8 pieces", Layout{Uniform: true, Pieces: 8, PieceSize: 24}, KernelUniform, 1},
		{"uniform, capped by the wave", Layout{Uniform: true, Pieces: 1 << 20, PieceSize: 24}, KernelUniform, wave},
		// 720 B = 45 vectors: FlatChunk(45, 256) = 22 pieces a block round.
		{"flat16 720 B", Layout{Uniform: true, Flat16: true, Pieces: 100, PieceSize: 720}, KernelFlat16, (100 + 21) / 22},
		{"packed 720 B", Layout{Uniform: true, Flat16: true, Packed: true, Pieces: 15360, PieceSize: 720}, KernelPacked, (15360 + 21) / 22},
		{"flat16, capped by the wave", Layout{Uniform: true, Flat16: true, Pieces: 1 << 20, PieceSize: 720}, KernelFlat16, wave},
	} {
		if k, g := Shape(c.l, threads, warps, wave); k != c.kind || g != c.grid {
			t.Errorf("%s: kernel %d grid %d, want %d, %d", c.name, k, g, c.kind, c.grid)
		}
	}
}

// TestArgsMatchTheKernelSignatures reads each kernel's arguments back in the order copy.cu and copy.hip
// declare them.
func TestArgsMatchTheKernelSignatures(t *testing.T) {
	l := Layout{Uniform: true, Flat16: true, Pieces: 10, PieceSize: 720, SrcBase: 0x1000, DstBase: 0x2000, Shift: 4,
		Unit: 720, SrcBits: 18, DstBits: 18}
	u64 := func(p unsafe.Pointer) uint64 { return *(*uint64)(p) }
	u32 := func(p unsafe.Pointer) uint32 { return *(*uint32)(p) }
	var a Args
	p, n := a.Pointers(KernelFlat16, l, 0xd000, 0xe000)
	if n != 7 || u64(p[0]) != 0x1000 || u64(p[1]) != 0x2000 || u64(p[2]) != 0xd000 || u32(p[3]) != 450 || u32(p[4]) != 45 ||
		u32(p[5]) != 4 || u64(p[6]) != 0xe000 {
		t.Errorf("flat16 arguments wrong (%d)", n)
	}
	p, n = a.Pointers(KernelPacked, l, 0xd000, 0)
	if n != 9 || u64(p[2]) != 0xd000 || u32(p[3]) != 10 || u32(p[4]) != 45 || u64(p[5]) != 720 || u32(p[6]) != 18 ||
		u32(p[7]) != 18 || u64(p[8]) != 0 {
		t.Errorf("packed arguments wrong (%d)", n)
	}
	p, n = a.Pointers(KernelUniform, l, 0xd000, 0)
	if n != 6 || u64(p[0]) != 0x1000 || u32(p[3]) != 10 || u64(p[4]) != 720 || u32(p[5]) != 4 {
		t.Errorf("uniform arguments wrong (%d)", n)
	}
	p, n = a.Pointers(KernelGeneral, l, 0xd000, 0)
	if n != 2 || u64(p[0]) != 0xd000 || u32(p[1]) != 10 {
		t.Errorf("general arguments wrong (%d)", n)
	}
	// copy.cu's kernels take the signal last, after the same arguments.
	sig := Signal{Done: 0xa000, Count: 0xb000, Seq: 7}
	for _, k := range []Kernel{KernelGeneral, KernelUniform, KernelFlat16, KernelPacked} {
		plain, pn := a.Pointers(k, l, 0xd000, 0xe000)
		want := make([]uint64, pn)
		for i := range pn {
			want[i] = *(*uint64)(plain[i]) // 8 bytes from each: the low word of 32-bit arguments is theirs
		}
		sp, sn := a.Signalled(k, l, 0xd000, 0xe000, sig)
		if sn != pn+1 {
			t.Fatalf("kernel %d: %d signalled arguments, want %d", k, sn, pn+1)
		}
		for i := range pn {
			if got := *(*uint64)(sp[i]); uint32(got) != uint32(want[i]) {
				t.Errorf("kernel %d: argument %d moved with the signal", k, i)
			}
		}
		if got := *(*Signal)(sp[pn]); got != sig {
			t.Errorf("kernel %d: signal argument %+v, want %+v", k, got, sig)
		}
	}
	cp, cn := a.Contig(0x9000, 0x8000, 4096, sig)
	if cn != 4 || u64(cp[0]) != 0x9000 || u64(cp[1]) != 0x8000 || u64(cp[2]) != 4096 || *(*Signal)(cp[3]) != sig {
		t.Errorf("fx_copy_contig's arguments wrong (%d)", cn)
	}
	if unsafe.Sizeof(Signal{}) != 24 || unsafe.Offsetof(Signal{}.Seq) != 16 {
		t.Errorf("Signal is %d bytes with Seq at %d; fx_signal is 24 with seq at 16", unsafe.Sizeof(Signal{}), unsafe.Offsetof(Signal{}.Seq))
	}
}

// TestArgsAllocateNothing: a launch's arguments stay on the caller's stack (the copy path allocates nothing per
// submission for them).
func TestArgsAllocateNothing(t *testing.T) {
	l := Layout{Uniform: true, Flat16: true, Packed: true, Pieces: 10, PieceSize: 720}
	var sum uint64
	allocs := testing.AllocsPerRun(100, func() {
		var a Args
		p, n := a.Pointers(KernelPacked, l, 0xd000, 0)
		sum += uint64(n) + *(*uint64)(p[2])
		q, m := a.Signalled(KernelPacked, l, 0xd000, 0, Signal{Seq: 1})
		sum += uint64(m) + uint64((*Signal)(q[m-1]).Seq)
		c, k := a.Contig(0x9000, 0x8000, 4096, Signal{Seq: 2})
		sum += uint64(k) + *(*uint64)(c[2])
	})
	if allocs != 0 || sum == 0 {
		t.Errorf("%v allocations per launch's arguments, want 0", allocs)
	}
}
