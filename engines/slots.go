// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"slices"
	"sync"
)

// Slots lets a fixed number of copies run at once and hands a freed slot to the submissions waiting for one in
// turns between shares (SubmitOptions.Share: the caller a transfer is for), each share's in arrival order. In
// arrival order alone, one caller's queue of long copies held every other caller's behind it: a pod that kept 200
// copies of 1 GiB queued on a node's four host workers failed every other pod's 1 MiB copy at its deadline.
type Slots struct {
	mu   sync.Mutex
	free int
	// waiting holds each share's waiters, oldest first; turn the shares that have some, the next to serve first.
	waiting map[string][]chan struct{}
	turn    []string
}

// NewSlots returns n slots (at least one).
func NewSlots(n int) *Slots {
	return &Slots{free: max(n, 1), waiting: map[string][]chan struct{}{}}
}

// Take waits until a slot is share's, or ctx ends (its error; no slot is held then).
func (s *Slots) Take(ctx context.Context, share string) error {
	s.mu.Lock()
	if s.free > 0 && len(s.turn) == 0 {
		s.free--
		s.mu.Unlock()
		return nil
	}
	given := make(chan struct{})
	if len(s.waiting[share]) == 0 {
		s.turn = append(s.turn, share)
	}
	s.waiting[share] = append(s.waiting[share], given)
	s.mu.Unlock()
	select {
	case <-given:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	waited := s.forgetLocked(share, given)
	s.mu.Unlock()
	if !waited { // the slot came as ctx ended: it goes to the next
		s.Give()
	}
	return ctx.Err()
}

// Give returns a slot taken with Take: to the oldest waiter of the share whose turn it is (which then goes to the
// back of the turns if it has more), else back to the free ones.
func (s *Slots) Give() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.turn) == 0 {
		s.free++
		return
	}
	share := s.turn[0]
	q := s.waiting[share]
	close(q[0])
	q[0] = nil
	if q = q[1:]; len(q) == 0 {
		delete(s.waiting, share)
		s.turn = s.turn[1:]
		return
	}
	s.waiting[share] = q
	s.turn = append(s.turn[1:], share)
}

// forgetLocked takes given off share's waiters and reports whether it was there (not handed a slot yet).
func (s *Slots) forgetLocked(share string, given chan struct{}) bool {
	q := s.waiting[share]
	i := slices.Index(q, given)
	if i < 0 {
		return false
	}
	if q = slices.Delete(q, i, i+1); len(q) > 0 {
		s.waiting[share] = q
		return true
	}
	delete(s.waiting, share)
	s.turn = slices.DeleteFunc(s.turn, func(sh string) bool { return sh == share })
	return true
}
