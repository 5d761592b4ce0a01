// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem

import (
	"fmt"
	"sort"
)

type span struct{ off, len uint64 }

// ranges is first-fit bookkeeping of one contiguous pool: free spans sorted by offset and coalesced, used spans
// by slice id. Not safe for concurrent use; the pool holding it locks.
type ranges struct {
	size  uint64
	align uint64
	free  []span
	used  map[string]span
}

func newRanges(size, align uint64) *ranges {
	return &ranges{size: size, align: align, free: []span{{0, size}}, used: map[string]span{}}
}

// take reserves size bytes (rounded up to the alignment) for id; ok is false when no free span is large enough.
func (r *ranges) take(id string, size uint64) (span, bool) {
	rounded := (size + r.align - 1) / r.align * r.align
	if rounded < size {
		return span{}, false
	}
	for i, s := range r.free {
		if s.len < rounded {
			continue
		}
		got := span{s.off, rounded}
		if s.len == rounded {
			r.free = append(r.free[:i], r.free[i+1:]...)
		} else {
			r.free[i] = span{s.off + rounded, s.len - rounded}
		}
		r.used[id] = got
		return got, true
	}
	return span{}, false
}

// put gives id's span back, merging it with its neighbours.
func (r *ranges) put(id string) (span, error) {
	s, ok := r.used[id]
	if !ok {
		return span{}, fmt.Errorf("freeing pool memory %q: not allocated", id)
	}
	delete(r.used, id)
	r.free = append(r.free, s)
	sort.Slice(r.free, func(i, j int) bool { return r.free[i].off < r.free[j].off })
	merged := r.free[:1]
	for _, f := range r.free[1:] {
		last := &merged[len(merged)-1]
		if last.off+last.len == f.off {
			last.len += f.len
		} else {
			merged = append(merged, f)
		}
	}
	r.free = merged
	return s, nil
}

func (r *ranges) freeBytes() (free uint64) {
	for _, s := range r.free {
		free += s.len
	}
	return free
}
