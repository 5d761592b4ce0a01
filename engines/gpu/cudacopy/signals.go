// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
)

// signalDrain bounds how long releasing signal memory waits for the copies that write there.
const signalDrain = 10 * time.Second

// signalRanges is the host memory offered for signals (engines.SignalMemory). A range is registered with the
// driver on the first signal into it, from the copier about to write it, so memory offered before any GPU is
// set up (a fast connection opened before the first tensor) costs nothing until used.
type signalRanges struct {
	mu     sync.Mutex
	ranges []*signalRange
}

type signalRange struct {
	mem        []byte
	registered bool
	broken     string     // why no signal goes here (registration failed)
	released   bool       // released: take no more signals
	taking     int        // signals taken whose submission is not recorded yet
	pending    []*Pending // submissions that write here, until seen done
}

// RegisterSignalMemory implements engines.SignalMemory: mem (page-aligned, mapped for the life of the
// registration) may receive signals; release waits for the copies that write there before the driver forgets it.
func (b *Backend) RegisterSignalMemory(mem []byte) (func() error, error) {
	if len(mem) == 0 || uintptr(unsafe.Pointer(&mem[0]))%4096 != 0 {
		return nil, errors.New("signal memory must be whole, page-aligned mappings")
	}
	r := &signalRange{mem: mem}
	b.signals.mu.Lock()
	b.signals.ranges = append(b.signals.ranges, r)
	b.signals.mu.Unlock()
	return func() error { return b.releaseSignals(r) }, nil
}

// takeSignal returns the range sig's word lies in, registered with the driver from c's context, or nil when
// the GPU may not write there; a range returned must be given to recordSignal.
func (b *Backend) takeSignal(c *Copier, sig *engines.Signal) *signalRange {
	if sig == nil || sig.Word == nil {
		return nil
	}
	at := uintptr(unsafe.Pointer(sig.Word))
	b.signals.mu.Lock()
	defer b.signals.mu.Unlock()
	for _, r := range b.signals.ranges {
		base := uintptr(unsafe.Pointer(&r.mem[0]))
		if at < base || at+4 > base+uintptr(len(r.mem)) || at%4 != 0 {
			continue
		}
		if r.released || r.broken != "" {
			return nil
		}
		if !r.registered {
			err := b.drv.WithContext(c.ctx, func() error { return b.drv.MemHostRegister(base, uint64(len(r.mem))) })
			if err != nil {
				r.broken = err.Error()
				return nil
			}
			r.registered = true
		}
		r.taking++
		return r
	}
	return nil
}

// recordSignal notes the submission (nil: none was queued) that took a signal of r.
func (b *Backend) recordSignal(r *signalRange, p *Pending) {
	b.signals.mu.Lock()
	defer b.signals.mu.Unlock()
	r.taking--
	r.pending = slices.DeleteFunc(r.pending, func(q *Pending) bool { return q.end.Ended() })
	if p != nil && p.Signalled() {
		r.pending = append(r.pending, p)
	}
}

// releaseSignals stops signals into r and, once every submission that writes there is done, unregisters it.
// It fails, leaving r registered, when one is not done within signalDrain: the memory must then stay mapped.
func (b *Backend) releaseSignals(r *signalRange) error {
	deadline := time.Now().Add(signalDrain)
	b.signals.mu.Lock()
	r.released = true
	for {
		r.pending = slices.DeleteFunc(r.pending, func(p *Pending) bool { return p.Done() })
		if r.taking == 0 && len(r.pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.signals.mu.Unlock()
			return fmt.Errorf("%d GPU copies that write signals did not finish within %v", len(r.pending)+r.taking, signalDrain)
		}
		b.signals.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		b.signals.mu.Lock()
	}
	b.signals.ranges = slices.DeleteFunc(b.signals.ranges, func(q *signalRange) bool { return q == r })
	registered := r.registered
	b.signals.mu.Unlock()
	if !registered {
		return nil
	}
	base := uintptr(unsafe.Pointer(&r.mem[0]))
	if err := b.inSomeContext(func() error { return b.drv.MemHostUnregister(base) }); err != nil {
		return fmt.Errorf("unregistering signal memory: %w", err)
	}
	return nil
}
