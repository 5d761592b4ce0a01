// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// kernelKind names which scatter kernel a layout launches.
type kernelKind int

const (
	kernelGeneral kernelKind = iota
	kernelUniform
	kernelFlat16
	kernelPacked
)

// launchShape is the kernel and grid for layout on a GPU of cus compute
// units: at most one full wave of resident blocks, each block's threads one
// wavefront per piece, or for the flat form one run of FlatChunk pieces per
// block round (the rule copy.hip's fx_flat_chunk follows).
func launchShape(l scatter.Layout, cus int) (kernelKind, uint32) {
	wave := uint64(max(cus, 1) * blocksPerCU)
	if l.Flat16 {
		chunk := uint64(scatter.FlatChunk(uint32(l.PieceSize/16), threadsPerBlock))
		runs := (uint64(l.Pieces) + chunk - 1) / chunk
		if l.Packed {
			return kernelPacked, uint32(min(runs, wave))
		}
		return kernelFlat16, uint32(min(runs, wave))
	}
	blocks := uint32(min((uint64(l.Pieces)+wavesPerBlock-1)/wavesPerBlock, wave))
	if l.Uniform {
		return kernelUniform, blocks
	}
	return kernelGeneral, blocks
}

// launch queues the scatter kernel over descriptors at descs (pinned host
// memory the kernel reads directly); the Copier's device must be current.
// The flat kernel keeps no device copy of them here (keep is null).
func (c *Copier) launch(l scatter.Layout, descs uint64) error {
	kind, grid := launchShape(l, c.cus)
	cfg := hip.LaunchConfig{GridX: grid, BlockX: threadsPerBlock, Stream: c.stream}
	count := uint32(l.Pieces)
	switch kind {
	case kernelFlat16:
		per := uint32(l.PieceSize / 16)
		total := count * per
		var keep uint64
		return c.rt.Launch(c.kernels.flat16, cfg, []unsafe.Pointer{
			unsafe.Pointer(&l.SrcBase), unsafe.Pointer(&l.DstBase), unsafe.Pointer(&descs),
			unsafe.Pointer(&total), unsafe.Pointer(&per), unsafe.Pointer(&l.Shift), unsafe.Pointer(&keep)})
	case kernelPacked:
		per := uint32(l.PieceSize / 16)
		var keep uint64
		return c.rt.Launch(c.kernels.packed, cfg, []unsafe.Pointer{
			unsafe.Pointer(&l.SrcBase), unsafe.Pointer(&l.DstBase), unsafe.Pointer(&descs),
			unsafe.Pointer(&count), unsafe.Pointer(&per), unsafe.Pointer(&l.Unit),
			unsafe.Pointer(&l.SrcBits), unsafe.Pointer(&l.DstBits), unsafe.Pointer(&keep)})
	case kernelUniform:
		size := l.PieceSize
		return c.rt.Launch(c.kernels.uniform, cfg, []unsafe.Pointer{
			unsafe.Pointer(&l.SrcBase), unsafe.Pointer(&l.DstBase), unsafe.Pointer(&descs),
			unsafe.Pointer(&count), unsafe.Pointer(&size), unsafe.Pointer(&l.Shift)})
	}
	return c.rt.Launch(c.kernels.general, cfg, []unsafe.Pointer{unsafe.Pointer(&descs), unsafe.Pointer(&count)})
}
