// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"sync"
	"sync/atomic"
)

// DoneWord shows the host how far a stream got through a word of mapped pinned host memory that the stream
// writes: Signal queues a write of the next sequence number behind the work queued so far, Reached reads the
// word. A waiter then polls memory instead of the driver: cuEventQuery costs about 2 µs a call on the H200 VM
// and contends with the same process's launches, so polls had to be spaced 5 µs apart and a copy was seen done
// 3–4 µs late on average. A stream that fails never writes the word; its waiter falls back to the driver's
// answer. Signal is not safe for concurrent use (the stream's submissions are serialized); Reached is.
type DoneWord struct {
	hostWord
	seq uint32
	// freeing guards the word against Close: a waiter still polling when its copier closes reads "not yet"
	// instead of memory the driver has unmapped.
	freeing sync.RWMutex
}

// NewDoneWord allocates the word; a context must be current. It fails when the driver cannot write words from
// a stream.
func NewDoneWord(d *Driver) (*DoneWord, error) {
	if d.f.streamWriteValue32 == 0 {
		return nil, notExported("cuStreamWriteValue32", ErrNotSupported)
	}
	w, err := newHostWord(d)
	if err != nil {
		return nil, err
	}
	return &DoneWord{hostWord: w}, nil
}

// Signal queues on s the write of the next sequence number and returns it (never 0, so callers may keep 0 for
// "none").
func (w *DoneWord) Signal(s Stream) (uint32, error) {
	next := w.Next()
	if err := w.drv.StreamWriteValue32(s, uint64(w.addr), next); err != nil {
		return 0, err
	}
	w.seq = next
	return next, nil
}

// Next is the sequence number the next write will carry (never 0).
func (w *DoneWord) Next() uint32 {
	if w.seq+1 == 0 {
		return 1
	}
	return w.seq + 1
}

// Advance records that a kernel queued on the stream writes seq (Next) to the word itself at its end, in place
// of Signal's stream write.
func (w *DoneWord) Advance(seq uint32) { w.seq = seq }

// Addr is the word's device address, which a kernel writes.
func (w *DoneWord) Addr() DevicePtr { return DevicePtr(w.addr) }

// Reached reports whether the stream has written seq or a later sequence number (false once the word is
// closed: the driver then says how the copy ended).
func (w *DoneWord) Reached(seq uint32) bool {
	w.freeing.RLock()
	defer w.freeing.RUnlock()
	return w.addr != 0 && SeqReached(atomic.LoadUint32(w.word()), seq)
}

// SeqReached reports whether a word showing shown has passed seq, comparing cyclically: sequence numbers wrap,
// and fewer than 2^31 are ever outstanding.
func SeqReached(shown, seq uint32) bool { return int32(shown-seq) >= 0 }

// Close frees the word; no stream may still write it, and a context must be current.
func (w *DoneWord) Close() error {
	if w == nil {
		return errors.New("closing a nil done word")
	}
	w.freeing.Lock()
	defer w.freeing.Unlock()
	return w.close("done word")
}
