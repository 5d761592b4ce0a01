// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import "unsafe"

// Kernel names which scatter kernel of native/kernels a layout launches.
type Kernel int

// The scatter kernels, named as copy.cu and copy.hip export them (kernels.Scatter*).
const (
	KernelGeneral Kernel = iota // 24-byte descriptors, pieces of any size
	KernelUniform               // equal pieces, 8-byte offsets
	KernelFlat16                // equal 16-byte-aligned pieces, one flat range of vectors
	KernelPacked                // the flat form with offsets packed to the bits they need
)

// Shape is the kernel and grid for l: at most wave thread blocks (one full wave of resident blocks on the GPU),
// each block of threads threads taking groups pieces a round (one warp or wavefront each), or for the flat forms
// one run of FlatChunk pieces per block round, the rule both kernel sources follow.
func Shape(l Layout, threads, groups uint32, wave uint64) (Kernel, uint32) {
	if l.Flat16 {
		chunk := uint64(FlatChunk(uint32(l.PieceSize/16), threads))
		runs := (uint64(l.Pieces) + chunk - 1) / chunk
		if l.Packed {
			return KernelPacked, uint32(min(runs, wave))
		}
		return KernelFlat16, uint32(min(runs, wave))
	}
	blocks := uint32(min((uint64(l.Pieces)+uint64(groups)-1)/uint64(groups), wave))
	if l.Uniform {
		return KernelUniform, blocks
	}
	return KernelGeneral, blocks
}

// Args holds one launch's kernel arguments where the runtime's launch call reads them, through an array of
// pointers to each (Pointers). Keep both on the caller's stack (a local variable; nothing of them outlives the
// launch call), so a launch allocates nothing.
type Args struct {
	l           Layout
	descs, keep uint64
	src, dst    uint64 // fx_copy_contig's range
	count, per  uint32
	total       uint32
	size        uint64
	sig         Signal
}

// Signal is the last argument of the CUDA copy kernels (fx_signal in copy.cu; copy.hip's kernels take none):
// with Done set, the launch's last block to finish writes Seq to the host word at Done once every block's
// writes are visible system-wide, counting finished blocks in the device word at Count, which must be zero
// before the launch (the last block resets it). The zero value signals nothing. Its layout is the kernel's:
// two 64-bit addresses and a 32-bit number, 24 bytes.
type Signal struct {
	Done, Count uint64
	Seq         uint32
	_           uint32
}

// Pointers lays out the arguments of kernel k over l's descriptors at descs (an address the kernel reads);
// the flat kernels also copy them to keep (device memory) unless it is 0. The first n pointers, into a, are
// the launch's arguments. The array is returned, not kept in a: a pointer stored into a itself would move a
// to the heap.
func (a *Args) Pointers(k Kernel, l Layout, descs, keep uint64) (p [9]unsafe.Pointer, n int) {
	a.l, a.descs, a.keep, a.count = l, descs, keep, uint32(l.Pieces)
	switch k {
	case KernelFlat16:
		a.per = uint32(l.PieceSize / 16)
		a.total = uint32(uint64(l.Pieces) * uint64(a.per))
		return [9]unsafe.Pointer{unsafe.Pointer(&a.l.SrcBase), unsafe.Pointer(&a.l.DstBase), unsafe.Pointer(&a.descs),
			unsafe.Pointer(&a.total), unsafe.Pointer(&a.per), unsafe.Pointer(&a.l.Shift), unsafe.Pointer(&a.keep)}, 7
	case KernelPacked:
		a.per = uint32(l.PieceSize / 16)
		return [9]unsafe.Pointer{unsafe.Pointer(&a.l.SrcBase), unsafe.Pointer(&a.l.DstBase), unsafe.Pointer(&a.descs),
			unsafe.Pointer(&a.count), unsafe.Pointer(&a.per), unsafe.Pointer(&a.l.Unit),
			unsafe.Pointer(&a.l.SrcBits), unsafe.Pointer(&a.l.DstBits), unsafe.Pointer(&a.keep)}, 9
	case KernelUniform:
		a.size = l.PieceSize
		return [9]unsafe.Pointer{unsafe.Pointer(&a.l.SrcBase), unsafe.Pointer(&a.l.DstBase), unsafe.Pointer(&a.descs),
			unsafe.Pointer(&a.count), unsafe.Pointer(&a.size), unsafe.Pointer(&a.l.Shift)}, 6
	}
	return [9]unsafe.Pointer{unsafe.Pointer(&a.descs), unsafe.Pointer(&a.count)}, 2
}

// Signalled is Pointers for kernels that take a Signal last (copy.cu's), with sig there.
func (a *Args) Signalled(k Kernel, l Layout, descs, keep uint64, sig Signal) (p [10]unsafe.Pointer, n int) {
	q, n := a.Pointers(k, l, descs, keep)
	for i := range n { // not copy: a slice of p would move a to the heap
		p[i] = q[i]
	}
	a.sig = sig
	p[n] = unsafe.Pointer(&a.sig)
	return p, n + 1
}

// Contig lays out the arguments of fx_copy_contig (copy.cu): size bytes from src to dst, then sig.
func (a *Args) Contig(dst, src, size uint64, sig Signal) (p [10]unsafe.Pointer, n int) {
	a.dst, a.src, a.size, a.sig = dst, src, size, sig
	return [10]unsafe.Pointer{unsafe.Pointer(&a.dst), unsafe.Pointer(&a.src), unsafe.Pointer(&a.size), unsafe.Pointer(&a.sig)}, 4
}
