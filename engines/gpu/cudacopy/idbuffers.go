// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// Block ids decoded straight into pinned host memory: the check kernel reads them in place, so a checked list
// is not copied a second time into the copier's staging (8.7 µs of a 15,360-id call on the H200 VM). The memory
// is portable (every copier's context reaches it) and buffers are reused, never freed before the backend.

const (
	// idBufferIDs is one buffer's capacity: the most ids one side of a transfer names.
	idBufferIDs = 1 << 16
	// maxIDBuffers bounds the pinned memory held for ids (16 MiB); past it callers use their own memory.
	maxIDBuffers = 64
)

// idBuffers is a backend's pool of pinned id buffers.
type idBuffers struct {
	mu   sync.Mutex
	free []uintptr
	// bases are every buffer's first byte, with the lending it is out on (0: none); lendings counts them.
	bases    map[uintptr]uint64
	lendings uint64
	// alloc returns size bytes of portable pinned host memory (nil: no GPU set up yet).
	alloc func(size uint64) (uintptr, error)
	drop  func(uintptr) error
}

// get returns a buffer of n ids and what gives it back, or nil when n is not in (0, idBufferIDs] or no buffer
// can be had.
func (p *idBuffers) get(n int) ([]uint32, func()) {
	if p == nil || n <= 0 || n > idBufferIDs {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var base uintptr
	if k := len(p.free); k > 0 {
		base, p.free = p.free[k-1], p.free[:k-1]
	} else {
		if len(p.bases) >= maxIDBuffers || p.alloc == nil {
			return nil, nil
		}
		var err error
		if base, err = p.alloc(4 * idBufferIDs); err != nil {
			return nil, nil
		}
	}
	p.lendings++
	lending := p.lendings
	p.bases[base] = lending
	ids := unsafe.Slice((*uint32)(cuda.HostPointer(base)), idBufferIDs)[:n:n]
	// The give-back names its lending, so a second one, even after the buffer went out again, changes nothing;
	// one allocation (the function) per lending.
	return ids, func() { p.giveBack(base, lending) }
}

// giveBack returns base to the free buffers if it is still out on lending.
func (p *idBuffers) giveBack(base uintptr, lending uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bases[base] == lending {
		p.bases[base] = 0
		p.free = append(p.free, base)
	}
}

// at returns the host address of ids when they begin one of the pool's buffers (kernels read them there).
func (p *idBuffers) at(ids []uint32) (uintptr, bool) {
	if p == nil || len(ids) == 0 || len(ids) > idBufferIDs {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(&ids[0]))
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.bases[base]
	return base, ok
}

// close frees every buffer; nothing may use them any more.
func (p *idBuffers) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for base := range p.bases {
		errs = append(errs, p.drop(base))
	}
	p.bases, p.free = map[uintptr]uint64{}, nil
	return errors.Join(errs...)
}

// PinnedIDs returns a buffer for n block ids in pinned host memory that this backend's kernels read in place,
// and what gives it back once nothing reads it (the transfer that used it settled); nil when none can be had
// (no GPU set up yet, n over 65,536, every buffer in use), and the caller then uses memory of its own.
func (b *Backend) PinnedIDs(n int) ([]uint32, func()) {
	return b.ids.get(n)
}
