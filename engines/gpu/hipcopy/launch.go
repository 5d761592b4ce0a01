// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// kernelKind names which scatter kernel a layout launches.
type kernelKind = scatter.Kernel

const (
	kernelGeneral = scatter.KernelGeneral
	kernelUniform = scatter.KernelUniform
	kernelFlat16  = scatter.KernelFlat16
	kernelPacked  = scatter.KernelPacked
)

// launchShape is the kernel and grid for layout on a GPU of cus compute
// units: at most one full wave of resident blocks, each block's threads one
// wavefront per piece, or for the flat form one run of FlatChunk pieces per
// block round (the rule copy.hip's fx_flat_chunk follows).
func launchShape(l scatter.Layout, cus int) (kernelKind, uint32) {
	return scatter.Shape(l, threadsPerBlock, wavesPerBlock, uint64(max(cus, 1)*blocksPerCU))
}

// launch queues the scatter kernel over descriptors at descs (pinned host
// memory the kernel reads directly); the Copier's device must be current.
// The flat kernel keeps no device copy of them here (keep is null).
func (c *Copier) launch(l scatter.Layout, descs uint64) error {
	kind, grid := launchShape(l, c.cus)
	cfg := hip.LaunchConfig{GridX: grid, BlockX: threadsPerBlock, Stream: c.stream}
	var args scatter.Args
	ptrs, n := args.Pointers(kind, l, descs, 0)
	return c.rt.Launch(c.kernels.copy.ByKind(kind), cfg, ptrs[:n])
}
