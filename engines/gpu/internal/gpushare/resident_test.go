// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"bytes"
	"testing"
)

// Layout kinds of the tests.
var k0, k7, k8 = [2]uint64{0, 0}, [2]uint64{7, 1}, [2]uint64{7, 2}

type keptBuf struct {
	host []byte
	id   int
}

func newResident(max int) (*Resident[*keptBuf], *[]int) {
	var back []int
	return &Resident[*keptBuf]{Max: max, MaxBytes: 64,
		Host: func(b *keptBuf) []byte { return b.host },
		Put:  func(b *keptBuf) { back = append(back, b.id) },
	}, &back
}

// adopt keeps a buffer holding desc, as a launch that wrote its device copy would.
func adopt(r *Resident[*keptBuf], id int, kind [2]uint64, desc []byte) *ResidentSet[*keptBuf] {
	buf := &keptBuf{host: append(append([]byte(nil), desc...), 0xEE, 0xEE), id: id} // staging is larger than the set
	return r.Adopt(r.Key(kind, desc), kind, len(desc), buf)
}

func TestResidentFindsOnlyIdenticalSets(t *testing.T) {
	r, _ := newResident(4)
	a := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	r.Done(adopt(r, 1, k7, a))
	if e := r.Lookup(r.Key(k7, a), k7, bytes.Clone(a)); e == nil || e.Buf.id != 1 {
		t.Fatalf("the same bytes under the same kind must be found, got %v", e)
	}
	b := bytes.Clone(a)
	b[7] = 9
	if e := r.Lookup(r.Key(k7, b), k7, b); e != nil {
		t.Errorf("different bytes found set %d", e.Buf.id)
	}
	if e := r.Lookup(r.Key(k8, a), k8, a); e != nil {
		t.Errorf("the same bytes under another kind (piece size or unit) found set %d", e.Buf.id)
	}
	if e := r.Lookup(r.Key(k7, a[:4]), k7, a[:4]); e != nil {
		t.Errorf("a prefix of a kept set found set %d", e.Buf.id)
	}
	// A key collision with different bytes is still refused: the bytes decide.
	if e := r.Lookup(r.Key(k7, a), k7, b); e != nil {
		t.Errorf("bytes that differ under a matching key found set %d", e.Buf.id)
	}
}

func TestResidentEvictsLeastRecentAndWaitsForUsers(t *testing.T) {
	r, back := newResident(2)
	sets := [][]byte{{1}, {2}, {3}, {4}}
	s1 := adopt(r, 1, k0, sets[0]) // its launch is still running: one user
	r.Done(adopt(r, 2, k0, sets[1]))
	// Using set 2 makes set 1 the least recent.
	r.Done(r.Lookup(r.Key(k0, sets[1]), k0, sets[1]))
	r.Done(adopt(r, 3, k0, sets[2]))
	if r.Len() != 2 {
		t.Fatalf("%d sets kept, want Max 2", r.Len())
	}
	if e := r.Lookup(r.Key(k0, sets[0]), k0, sets[0]); e != nil {
		t.Fatalf("evicted set 1 still found")
	}
	if len(*back) != 0 {
		t.Fatalf("buffers %v handed back while set 1's launch still uses its buffer", *back)
	}
	r.Done(s1)
	if len(*back) != 1 || (*back)[0] != 1 {
		t.Fatalf("after its last user, handed back %v, want [1]", *back)
	}
	// An idle set evicted goes back at once.
	r.Done(adopt(r, 4, k0, sets[3]))
	if len(*back) != 2 || (*back)[1] != 2 {
		t.Fatalf("handed back %v, want set 2 next (least recently used)", *back)
	}
	// Drain hands back idle sets now and a busy one at its last Done.
	busy := r.Lookup(r.Key(k0, sets[3]), k0, sets[3])
	r.Drain()
	if r.Len() != 0 || len(*back) != 3 {
		t.Fatalf("after Drain: %d kept, handed back %v", r.Len(), *back)
	}
	r.Done(busy)
	if len(*back) != 4 || (*back)[3] != 4 {
		t.Fatalf("busy set not handed back after Drain and its last Done: %v", *back)
	}
}

func TestResidentKeepsOnlyWhatFits(t *testing.T) {
	r, _ := newResident(2)
	if r.Keeps(0) || r.Keeps(65) || !r.Keeps(64) {
		t.Errorf("Keeps(0, 64, 65) = %v %v %v, want false true false", r.Keeps(0), r.Keeps(64), r.Keeps(65))
	}
	off, _ := newResident(0)
	if off.Keeps(8) {
		t.Error("Max 0 must keep nothing")
	}
}
