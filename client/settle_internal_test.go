// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSettleWaitsForTheWaitedCallsThatStartedBeforeIt: drain returns once every call counted before it has left,
// not before, and never waits for a call that started after it; its context bounds it; concurrent drains share.
func TestSettleWaitsForTheWaitedCallsThatStartedBeforeIt(t *testing.T) {
	w := waitedCalls{turn: make(chan struct{}, 1)}
	before := w.enter()
	drained := make(chan error, 1)
	go func() { drained <- w.drain(context.Background()) }()
	select {
	case err := <-drained:
		t.Fatalf("drain returned (%v) while a call that started before it was in flight", err)
	case <-time.After(30 * time.Millisecond):
	}
	for w.phase.Load() == 0 {
		time.Sleep(time.Millisecond) // the flip: the call below starts after it
	}
	after := w.enter()
	w.leave(before)
	select {
	case err := <-drained:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("drain still waiting 5 s after the call before it left (it waits for one that started after it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.drain(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain beside a call that does not leave: %v, want its context's deadline", err)
	}
	// That drain ended early and left "after" behind in the phase before the current one: the next drain waits
	// for it too, though it started before the last flip, not this one.
	drained = make(chan error, 1)
	go func() { drained <- w.drain(context.Background()) }()
	select {
	case err := <-drained:
		t.Fatalf("a drain after one that ended early returned (%v) while a call counted before both was in flight", err)
	case <-time.After(30 * time.Millisecond):
	}
	w.leave(after)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}

	// Concurrent drains share a flip: those queued behind one that flipped after they arrived return when it
	// finishes, not each after a flip of its own waiting for calls that started later (here one that never ends).
	first := w.enter()
	results := make(chan error, 5)
	w.turn <- struct{}{} // as a drain under way would: all five arrive before any of them flips
	for range 5 {
		go func() { results <- w.drain(context.Background()) }()
	}
	time.Sleep(30 * time.Millisecond)
	<-w.turn
	time.Sleep(30 * time.Millisecond) // one of them flipped and waits for first
	later := w.enter()
	defer w.leave(later)
	w.leave(first)
	for range 5 {
		select {
		case err := <-results:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a drain queued behind one that covered it waited for a call that started after it arrived")
		}
	}
}
