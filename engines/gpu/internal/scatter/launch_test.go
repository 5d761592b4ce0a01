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
	})
	if allocs != 0 || sum == 0 {
		t.Errorf("%v allocations per launch's arguments, want 0", allocs)
	}
}
