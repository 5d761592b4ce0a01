// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"errors"
	"sync"
)

// minStagingSize is the smallest staging buffer: the descriptors of a few thousand blocks.
const minStagingSize = 64 << 10

// Staging recycles the pinned buffers descriptors are staged in. Sizes are powers of two from 64 KiB, so a
// buffer fits many later submissions; one goes back (Put) only once the launch that read it has completed.
// Alloc and Free create and destroy one buffer of a size; Size reports a buffer's. Safe for concurrent use.
type Staging[T any] struct {
	Alloc func(size uint64) (T, error)
	Free  func(T) error
	Size  func(T) uint64

	mu   sync.Mutex
	idle []T
}

// Get returns a buffer of at least n bytes, reusing an idle one when one is large enough.
func (p *Staging[T]) Get(n uint64) (T, error) {
	p.mu.Lock()
	for i, b := range p.idle {
		if p.Size(b) >= n {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			p.mu.Unlock()
			return b, nil
		}
	}
	p.mu.Unlock()
	size := uint64(minStagingSize)
	for size < n {
		size *= 2
	}
	return p.Alloc(size)
}

// Put takes back a buffer no launch reads any more.
func (p *Staging[T]) Put(b T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.idle = append(p.idle, b)
}

// Close frees every idle buffer (the runtime's context must be current where it needs one).
func (p *Staging[T]) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, b := range p.idle {
		errs = append(errs, p.Free(b))
	}
	p.idle = nil
	return errors.Join(errs...)
}
