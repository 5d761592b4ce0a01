// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// slot is descriptor staging for one in-flight launch: pinned, mapped host
// memory the host writes and the kernel reads in place (HIP shares one
// address space with the host, so the host address is the kernel's).
type slot struct {
	ptr  uintptr
	size uint64
}

func (s *slot) host() []byte {
	return unsafe.Slice((*byte)(hip.HostPointer(s.ptr)), s.size)
}

// newSlots returns the staging pool of a Copier.
func newSlots(rt *hip.Runtime) *gpushare.Staging[*slot] {
	return &gpushare.Staging[*slot]{
		Alloc: func(size uint64) (*slot, error) {
			h, err := rt.HostMalloc(size)
			if err != nil {
				return nil, err
			}
			return &slot{ptr: h, size: size}, nil
		},
		Free: func(s *slot) error { return rt.HostFree(s.ptr) },
		Size: func(s *slot) uint64 { return s.size },
	}
}
