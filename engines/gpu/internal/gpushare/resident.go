// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"sync"
)

// Resident remembers the descriptor sets of recent launches whose device-side
// copy is in place, so that a later submission with exactly the same
// descriptors (the same block list, whatever its base addresses: a KV
// transfer's next layer) launches from device memory instead of reading them
// across PCIe again.
//
// A buffer T is a staging buffer with a host side, which holds the descriptor
// bytes and is compared on lookup, and a device side, which the launch that
// adopted it fills. All launches of one Resident must go to one stream, so a
// later launch that reads the device side runs after the one that wrote it.
// Safe for concurrent use.
type Resident[T any] struct {
	// Max is how many descriptor sets are kept (the least recently used goes).
	Max int
	// MaxBytes bounds one kept set; larger ones are not kept.
	MaxBytes int
	// Host is a buffer's host side; Put hands a buffer back to staging.
	Host func(T) []byte
	Put  func(T)

	once    sync.Once
	seed    maphash.Seed
	mu      sync.Mutex
	entries []*ResidentSet[T] // least recently used first
}

// ResidentSet is one kept descriptor set.
type ResidentSet[T any] struct {
	Buf     T
	key     uint64
	kind    [2]uint64
	n       int
	users   int
	evicted bool
}

// Key hashes a descriptor set: kind distinguishes layouts whose bytes mean
// different things (piece size, unit); b is the encoded descriptors.
func (r *Resident[T]) Key(kind [2]uint64, b []byte) uint64 {
	r.once.Do(func() { r.seed = maphash.MakeSeed() })
	var h maphash.Hash
	h.SetSeed(r.seed)
	var k [16]byte
	binary.LittleEndian.PutUint64(k[:], kind[0])
	binary.LittleEndian.PutUint64(k[8:], kind[1])
	_, _ = h.Write(k[:])
	_, _ = h.Write(b)
	return h.Sum64()
}

// Keeps reports whether a set of n bytes may be kept.
func (r *Resident[T]) Keeps(n int) bool { return r.Max > 0 && n > 0 && n <= r.MaxBytes }

// Lookup returns the kept set with exactly these bytes, counting one user
// (release it with Done once the launch reading it has completed), or nil.
func (r *Resident[T]) Lookup(key uint64, kind [2]uint64, b []byte) *ResidentSet[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.entries {
		if e.key == key && e.kind == kind && e.n == len(b) && bytes.Equal(r.Host(e.Buf)[:e.n], b) {
			copy(r.entries[i:], r.entries[i+1:])
			r.entries[len(r.entries)-1] = e
			e.users++
			return e
		}
	}
	return nil
}

// Adopt keeps buf, whose host side starts with the n descriptor bytes keyed
// key and whose device side the just-queued launch fills, counting one user.
// The least recently used set beyond Max leaves; its buffer goes back to
// staging once no launch uses it.
func (r *Resident[T]) Adopt(key uint64, kind [2]uint64, n int, buf T) *ResidentSet[T] {
	e := &ResidentSet[T]{Buf: buf, key: key, kind: kind, n: n, users: 1}
	r.mu.Lock()
	r.entries = append(r.entries, e)
	var out []T
	for len(r.entries) > r.Max {
		old := r.entries[0]
		r.entries = r.entries[1:]
		old.evicted = true
		if old.users == 0 {
			out = append(out, old.Buf)
		}
	}
	r.mu.Unlock()
	for _, b := range out {
		r.Put(b)
	}
	return e
}

// Done drops one user of e.
func (r *Resident[T]) Done(e *ResidentSet[T]) {
	r.mu.Lock()
	e.users--
	free := e.evicted && e.users == 0
	r.mu.Unlock()
	if free {
		r.Put(e.Buf)
	}
}

// Drain forgets every set and hands back the buffers no launch uses; the rest
// go back through Done. Close the staging pool after it.
func (r *Resident[T]) Drain() {
	r.mu.Lock()
	var out []T
	for _, e := range r.entries {
		e.evicted = true
		if e.users == 0 {
			out = append(out, e.Buf)
		}
	}
	r.entries = nil
	r.mu.Unlock()
	for _, b := range out {
		r.Put(b)
	}
}

// Len is how many sets are kept.
func (r *Resident[T]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.entries)
}
