// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// CopyKernels are the copy kernels both kernel sources (copy.cu, copy.hip) export, as one runtime's function
// handles F.
type CopyKernels[F any] struct {
	Contig, General, Uniform, Flat16, Packed F
}

// Lookup fills every kernel through get (the runtime's module function lookup), stopping at the first error.
func (k *CopyKernels[F]) Lookup(get func(name string) (F, error)) error {
	for _, f := range []struct {
		dst  *F
		name string
	}{{&k.Contig, kernels.ContigCopy}, {&k.General, kernels.ScatterGeneral}, {&k.Uniform, kernels.ScatterUniform},
		{&k.Flat16, kernels.ScatterFlat16}, {&k.Packed, kernels.ScatterPacked}} {
		var err error
		if *f.dst, err = get(f.name); err != nil {
			return err
		}
	}
	return nil
}

// ByKind is the scatter kernel of kind.
func (k *CopyKernels[F]) ByKind(kind scatter.Kernel) F {
	switch kind {
	case scatter.KernelFlat16:
		return k.Flat16
	case scatter.KernelPacked:
		return k.Packed
	case scatter.KernelUniform:
		return k.Uniform
	}
	return k.General
}
