// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"sync/atomic"
)

// hostWord is one 32-bit word of mapped pinned host memory that streams wait on or write (its address is the
// same on the host and the device), starting at 0.
type hostWord struct {
	drv  *Driver
	addr uintptr
}

// newHostWord allocates the word; a context must be current.
func newHostWord(d *Driver) (hostWord, error) {
	p, err := d.MemHostAlloc(4096)
	if err != nil {
		return hostWord{}, err
	}
	w := hostWord{drv: d, addr: p}
	atomic.StoreUint32(w.word(), 0)
	return w, nil
}

func (w *hostWord) word() *uint32 { return (*uint32)(HostPointer(w.addr)) }

// close frees the word; no stream may still use it, and a context must be current.
func (w *hostWord) close(what string) error {
	if w.addr == 0 {
		return errors.New("closing a " + what + " twice")
	}
	err := w.drv.MemFreeHost(w.addr)
	w.addr = 0
	return err
}

// StreamGate holds streams until the host has queued the work behind them: a held stream waits on a word of
// mapped pinned host memory that the host raises afterwards. Events around the work then time the GPU alone,
// not the host's driver calls between them. Not safe for concurrent use.
type StreamGate struct {
	hostWord
	seq uint32
}

// NewStreamGate allocates the gate's word; a context must be current.
func NewStreamGate(d *Driver) (*StreamGate, error) {
	w, err := newHostWord(d)
	if err != nil {
		return nil, err
	}
	return &StreamGate{hostWord: w}, nil
}

// Hold makes s wait for the returned open, which must run on every path once the work is queued (GEQ compares
// cyclically, so the sequence may wrap).
func (g *StreamGate) Hold(s Stream) (open func(), err error) {
	g.seq++
	seq := g.seq
	if err := g.drv.StreamWaitValue32(s, uint64(g.addr), seq); err != nil {
		return nil, err
	}
	return func() { atomic.StoreUint32(g.word(), seq) }, nil
}

// Close frees the word; no stream may still wait on it, and a context must be current.
func (g *StreamGate) Close() error {
	if g == nil {
		return errors.New("closing a nil stream gate")
	}
	return g.close("stream gate")
}
