// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"errors"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

func TestCopyKernelsLookupAndChoice(t *testing.T) {
	handles := map[string]uintptr{kernels.ContigCopy: 1, kernels.ScatterGeneral: 2, kernels.ScatterUniform: 3,
		kernels.ScatterFlat16: 4, kernels.ScatterPacked: 5}
	var k CopyKernels[uintptr]
	if err := k.Lookup(func(name string) (uintptr, error) { return handles[name], nil }); err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[scatter.Kernel]uintptr{scatter.KernelGeneral: 2, scatter.KernelUniform: 3,
		scatter.KernelFlat16: 4, scatter.KernelPacked: 5} {
		if got := k.ByKind(kind); got != want {
			t.Errorf("kernel %d is handle %d, want %d", kind, got, want)
		}
	}
	if k.Contig != 1 {
		t.Errorf("contiguous kernel %d", k.Contig)
	}
	missing := errors.New("named symbol not found")
	var asked []string
	err := (&CopyKernels[uintptr]{}).Lookup(func(name string) (uintptr, error) {
		asked = append(asked, name)
		if name == kernels.ScatterUniform {
			return 0, missing
		}
		return 9, nil
	})
	if err != missing || len(asked) != 3 {
		t.Errorf("a missing kernel: %v after asking %v, want its error at the third lookup", err, asked)
	}
}
