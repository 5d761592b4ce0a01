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

// Events keeps a copier's idle completion events for reuse (creating one is a runtime call per submission),
// those recording timing apart from the others. Safe for concurrent use.
type Events[E comparable] struct {
	mu   sync.Mutex
	idle [2][]E // [0] without timing, [1] with
}

func timingIndex(timing bool) int {
	if timing {
		return 1
	}
	return 0
}

// Get takes an idle event of the kind, if there is one.
func (p *Events[E]) Get(timing bool) (E, bool) {
	k := timingIndex(timing)
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle[k]); n > 0 {
		ev := p.idle[k][n-1]
		p.idle[k] = p.idle[k][:n-1]
		return ev, true
	}
	var none E
	return none, false
}

// Put hands back a completed (or never recorded) event; the zero event (none was taken) is ignored.
func (p *Events[E]) Put(ev E, timing bool) {
	var none E
	if ev == none {
		return
	}
	k := timingIndex(timing)
	p.mu.Lock()
	p.idle[k] = append(p.idle[k], ev)
	p.mu.Unlock()
}

// Destroy destroys every idle event and forgets them (the runtime's context must be current where it needs
// one).
func (p *Events[E]) Destroy(destroy func(E) error) []error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, evs := range p.idle {
		for _, ev := range evs {
			errs = append(errs, destroy(ev))
		}
	}
	p.idle = [2][]E{}
	return errs
}
