// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"testing"
	"unsafe"
)

// The id pool lends at most maxIDBuffers buffers, knows its own buffers (and only those) by their first id,
// reuses what comes back, takes a double give-back once (a stale one, after the buffer went out again, changes
// nothing), and refuses sizes it cannot hold.
func TestIDBuffersLendAndKnowTheirOwn(t *testing.T) {
	var keep [][]byte // the "pinned" memory of this test, kept alive here
	allocs, drops := 0, 0
	p := &idBuffers{bases: map[uintptr]uint64{},
		alloc: func(size uint64) (uintptr, error) {
			allocs++
			b := make([]byte, size)
			keep = append(keep, b)
			return uintptr(unsafe.Pointer(&b[0])), nil
		},
		drop: func(uintptr) error { drops++; return nil },
	}
	for _, n := range []int{0, -1, idBufferIDs + 1} {
		if ids, _ := p.get(n); ids != nil {
			t.Fatalf("a buffer of %d ids was lent", n)
		}
	}
	var frees []func()
	for i := range maxIDBuffers {
		ids, free := p.get(1 + i)
		if len(ids) != 1+i {
			t.Fatalf("buffer %d holds %d ids, want %d", i, len(ids), 1+i)
		}
		if _, ok := p.at(ids); !ok {
			t.Fatalf("buffer %d not known to the pool", i)
		}
		if _, ok := p.at(ids[1:]); ok && len(ids) > 1 {
			t.Fatal("a slice from inside a buffer taken for a buffer")
		}
		frees = append(frees, free)
	}
	if ids, _ := p.get(8); ids != nil {
		t.Fatalf("more than %d buffers lent", maxIDBuffers)
	}
	if _, ok := p.at(make([]uint32, 8)); ok {
		t.Fatal("the caller's own memory taken for a pool buffer")
	}
	frees[0]()
	frees[0]() // a second give-back of the same lending changes nothing
	a, freeA := p.get(100)
	if a == nil {
		t.Fatal("a buffer given back was not lent again")
	}
	if b, _ := p.get(100); b != nil {
		t.Fatal("a buffer given back twice was lent twice")
	}
	frees[0]() // a stale give-back, the buffer out again on another lending: it stays out
	if b, _ := p.get(100); b != nil {
		t.Fatal("a stale give-back freed a buffer lent again")
	}
	freeA()
	if got := testing.AllocsPerRun(100, func() {
		_, free := p.get(64)
		free()
	}); got > 1 {
		t.Fatalf("%.1f allocations a lending, want at most one (its give-back)", got)
	}
	if allocs != maxIDBuffers {
		t.Fatalf("%d allocations for %d buffers", allocs, maxIDBuffers)
	}
	if err := p.close(); err != nil || drops != maxIDBuffers {
		t.Fatalf("close: %v, %d of %d buffers freed", err, drops, maxIDBuffers)
	}
	if _, ok := p.at(a); ok {
		t.Fatal("a buffer still known after close")
	}

	// No GPU set up yet: nothing is lent, and the caller uses its own memory.
	none := &idBuffers{bases: map[uintptr]uint64{}, alloc: func(uint64) (uintptr, error) { return 0, errNoCopier }}
	if ids, _ := none.get(10); ids != nil {
		t.Fatal("a buffer lent without memory behind it")
	}
	if ids, _ := (*idBuffers)(nil).get(10); ids != nil {
		t.Fatal("a nil pool (a copier of its own) lent a buffer")
	}
	if _, ok := (*idBuffers)(nil).at(make([]uint32, 4)); ok {
		t.Fatal("a nil pool knows a buffer")
	}
}
