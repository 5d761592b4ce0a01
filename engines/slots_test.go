// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// TestSlotsTakeTurnsBetweenShares: with every slot taken, a share that queued one waiter behind another share's
// five is served second, not sixth; each share's waiters in their own order; a waiter whose context ends holds
// no slot and is skipped; every slot comes back.
func TestSlotsTakeTurnsBetweenShares(t *testing.T) {
	s := engines.NewSlots(1)
	ctx := context.Background()
	if err := s.Take(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var served []string
	var wg sync.WaitGroup
	want := 1
	queue := func(share, name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Take(ctx, share); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			served = append(served, name)
			mu.Unlock()
			s.Give()
		}()
		awaitQueued(t, s, want)
		want++
	}
	for _, name := range []string{"b1", "b2", "b3", "b4", "b5"} {
		queue("busy", name)
	}
	gone, cancel := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() { left <- s.Take(gone, "gone") }()
	awaitQueued(t, s, want)
	want++
	queue("quiet", "q1")
	cancel()
	if err := <-left; err != context.Canceled {
		t.Fatalf("a waiter whose context ended: %v", err)
	}
	s.Give()
	wg.Wait()
	if want := []string{"b1", "q1", "b2", "b3", "b4", "b5"}; !slices.Equal(served, want) {
		t.Fatalf("served %v, want %v", served, want)
	}
	// The one slot is free again, and no waiter is left.
	short, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	if err := s.Take(short, "any"); err != nil {
		t.Fatalf("the slot after every waiter was served: %v", err)
	}
	s.Give()
}

// TestSlotsAWaiterThatLeavesAsItIsServedPassesTheSlotOn: contexts that end just as their slot is handed over
// never lose a slot (each Take that fails holds none, each that succeeds holds one).
func TestSlotsAWaiterThatLeavesAsItIsServedPassesTheSlotOn(t *testing.T) {
	s := engines.NewSlots(2)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*50*time.Microsecond)
			defer cancel()
			if s.Take(ctx, []string{"a", "b", "c"}[i%3]) == nil {
				time.Sleep(20 * time.Microsecond)
				s.Give()
			}
		}()
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for range 2 {
		if err := s.Take(ctx, "after"); err != nil {
			t.Fatalf("a slot was lost: %v", err)
		}
	}
}

// awaitQueued waits until n Takes wait on s: waiters queued one at a time are queued in that order.
func awaitQueued(t *testing.T, s *engines.Slots, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.Queued() != n; time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters queued, want %d", s.Queued(), n)
		}
	}
}
