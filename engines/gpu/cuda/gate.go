// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"sync/atomic"
)

// StreamGate holds streams until the host has queued the work behind them: a held stream waits on a word of
// mapped pinned host memory that the host raises afterwards. Events around the work then time the GPU alone,
// not the host's driver calls between them. Not safe for concurrent use.
type StreamGate struct {
	drv  *Driver
	word uintptr
	seq  uint32
}

// NewStreamGate allocates the gate's word; a context must be current.
func NewStreamGate(d *Driver) (*StreamGate, error) {
	w, err := d.MemHostAlloc(4096)
	if err != nil {
		return nil, err
	}
	atomic.StoreUint32((*uint32)(HostPointer(w)), 0)
	return &StreamGate{drv: d, word: w}, nil
}

// Hold makes s wait for the returned open, which must run on every path once the work is queued (GEQ compares
// cyclically, so the sequence may wrap).
func (g *StreamGate) Hold(s Stream) (open func(), err error) {
	g.seq++
	seq := g.seq
	if err := g.drv.StreamWaitValue32(s, uint64(g.word), seq); err != nil {
		return nil, err
	}
	return func() { atomic.StoreUint32((*uint32)(HostPointer(g.word)), seq) }, nil
}

// Close frees the word; no stream may still wait on it, and a context must be current.
func (g *StreamGate) Close() error {
	if g == nil || g.word == 0 {
		return errors.New("closing a stream gate twice")
	}
	err := g.drv.MemFreeHost(g.word)
	g.word = 0
	return err
}
