// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// slot is descriptor staging for one in-flight launch: pinned host memory the
// host writes, which the kernel reads in place or from an uploaded copy in
// device memory (Options.UploadDescriptors).
type slot struct {
	hostPtr uintptr
	devPtr  cuda.DevicePtr
	size    uint64
}

func (s *slot) host() []byte {
	return unsafe.Slice((*byte)(cuda.HostPointer(s.hostPtr)), s.size)
}

// newSlots returns the staging pool of a Copier; its calls need the Copier's context current.
func newSlots(drv *cuda.Driver) *gpushare.Staging[*slot] {
	return &gpushare.Staging[*slot]{
		Alloc: func(size uint64) (*slot, error) {
			h, err := drv.MemHostAlloc(size)
			if err != nil {
				return nil, err
			}
			d, err := drv.MemAlloc(size)
			if err != nil {
				return nil, errors.Join(err, drv.MemFreeHost(h))
			}
			return &slot{hostPtr: h, devPtr: d, size: size}, nil
		},
		Free: func(s *slot) error { return errors.Join(drv.MemFree(s.devPtr), drv.MemFreeHost(s.hostPtr)) },
		Size: func(s *slot) uint64 { return s.size },
	}
}
