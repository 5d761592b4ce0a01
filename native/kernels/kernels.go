// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package kernels

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
)

// CUDA is the CUDA C++ source of the copy kernels.
//
//go:embed copy.cu
var CUDA string

// HIP is the HIP source of the copy kernels.
//
//go:embed copy.hip
var HIP string

// Kernel entry points (extern "C" names, the same in both sources).
const (
	ContigCopy     = "fx_copy_contig"
	ScatterGeneral = "fx_scatter_general"
	ScatterUniform = "fx_scatter_uniform"
	ScatterFlat16  = "fx_scatter_flat16"
	ScatterPacked  = "fx_scatter_packed16"
)

// Entry points of block lists checked on the GPU (copy.cu only: the HIP copier checks block lists on the host).
const (
	BlocksCheck  = "fx_blocks_check"
	BlocksCopy16 = "fx_blocks16"
)

// Descriptor sizes in bytes, as laid out by the kernels' structs.
const (
	GeneralDescriptorSize = 24 // fx_desc {src, dst, size uint64}
	UniformDescriptorSize = 8  // fx_off {src, dst uint32}, in units of 1<<shift bytes
)

// Hash is the hex SHA-256 of a source; it keys compiled-kernel caches.
func Hash(src string) string {
	h := sha256.Sum256([]byte(src))
	return hex.EncodeToString(h[:])
}
