// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric

import (
	"context"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Segment is one copy between two addresses the local GPU can reach.
type Segment struct {
	Dst, Src uint64
	Size     uint64
}

// Runtime is what the engine needs from the GPU runtime. Implementations
// must be safe for concurrent use.
type Runtime interface {
	// Available says whether fabric handles work on this node, and why not.
	Available() (bool, string)
	// Local returns the address, in this process, of local GPU memory desc
	// and the GPU it lives on.
	Local(desc *engines.MemoryDesc) (addr uint64, gpu int, err error)
	// Export returns the fabric handle of the allocation holding local GPU
	// memory desc, with the region's offset in it and the allocation's size.
	// An allocation that is not fabric-exportable fails with ErrNotExportable.
	Export(desc *engines.MemoryDesc) (engines.FabricHandle, error)
	// Map imports a remote allocation and maps all of it for GPU gpu; it
	// returns the mapping's base and the way to undo it.
	Map(gpu int, h engines.FabricHandle) (base uint64, unmap func() error, err error)
	// Copy moves segs with GPU gpu and returns once the bytes have landed or
	// ctx ended and the GPU has stopped touching the memory.
	Copy(ctx context.Context, gpu int, segs []Segment) error
}
