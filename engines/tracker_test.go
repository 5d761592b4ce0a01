// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Deadline is the deadline the tracker enforces, and its context carries the same one.
func TestTrackerDeadlineIsTheEnforcedOne(t *testing.T) {
	far, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	near, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	for name, tc := range map[string]struct {
		parent  context.Context
		timeout time.Duration
		want    time.Duration
	}{
		"timeout, parent without deadline": {context.Background(), 3 * time.Second, 3 * time.Second},
		"timeout earlier than the parent":  {far, 3 * time.Second, 3 * time.Second},
		"parent earlier than the timeout":  {near, time.Minute, 2 * time.Second},
		"parent only":                      {near, 0, 2 * time.Second},
		"neither":                          {context.Background(), 0, DefaultTimeout},
	} {
		start := time.Now()
		tr := newTracker(tc.parent, "test", []Plan{{}}, SubmitOptions{Timeout: tc.timeout}, nil)
		got := tr.Deadline().Sub(start)
		if got < tc.want-time.Second || got > tc.want+time.Second {
			t.Errorf("%s: Deadline is %s from now, want %s", name, got, tc.want)
		}
		if d, ok := tr.Context().Deadline(); !ok || !d.Equal(tr.Deadline()) {
			t.Errorf("%s: Context().Deadline() = %v, %v; want %v", name, d, ok, tr.Deadline())
		}
		tr.arm()
		tr.Finish(0, nil)
	}
}

// Past the deadline the context ends with ErrDeadline as its stop cause, and Cancel still says cancelled.
func TestTrackerDeadlineEndsTheContext(t *testing.T) {
	tr := newTracker(context.Background(), "test", []Plan{{}}, SubmitOptions{Timeout: 20 * time.Millisecond}, nil)
	tr.arm()
	select {
	case <-tr.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("context outlived the deadline")
	}
	if err := tr.StopCause(); !errors.Is(err, ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stop cause %v, want ErrDeadline", err)
	}
	tr.Finish(0, tr.Context().Err())
	if err := tr.Wait(context.Background()); !errors.Is(err, ErrDeadline) {
		t.Fatalf("Wait = %v, want ErrDeadline", err)
	}
	tr2 := newTracker(context.Background(), "test", []Plan{{}}, SubmitOptions{Timeout: time.Minute}, nil)
	tr2.arm()
	tr2.Cancel()
	if err := tr2.StopCause(); !errors.Is(err, ErrCancelled) {
		t.Fatalf("stop cause after Cancel %v, want ErrCancelled", err)
	}
	tr2.Finish(0, nil)
}

// One registry's waited transfers share one handoff timer: of transfers joined at different times, each that
// nobody drives is handed to its goroutine once, not before WaitedHandoff after it joined; one whose Drive
// started is left to that Drive; one already done is never run.
func TestHandoffsShareOneTimer(t *testing.T) {
	var h handoffs
	type joined struct {
		tr  *Tracker
		at  time.Time
		ran chan time.Time
	}
	join := func() joined {
		tr := newTracker(context.Background(), "test", []Plan{{}}, SubmitOptions{Timeout: time.Minute}, nil)
		tr.arm()
		tr.handoffs = &h
		j := joined{tr: tr, ran: make(chan time.Time, 2)}
		j.at = time.Now()
		tr.DriveOnWait(drivable{poll: func() bool { return false }, run: func() { j.ran <- time.Now() }})
		return j
	}
	first := join()
	time.Sleep(2 * time.Millisecond)
	second := join()
	driven := join()
	driven.tr.drive.mu.Lock()
	driven.tr.drive.driven = true // as a Drive in progress leaves it
	driven.tr.drive.mu.Unlock()
	done := join()
	done.tr.Finish(0, nil)

	for name, j := range map[string]joined{"first": first, "second": second} {
		select {
		case at := <-j.ran:
			if waited := at.Sub(j.at); waited < WaitedHandoff {
				t.Errorf("%s transfer handed over %v after it joined, before WaitedHandoff (%v)", name, waited, WaitedHandoff)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s transfer was never handed over", name)
		}
	}
	time.Sleep(2 * WaitedHandoff)
	for name, j := range map[string]joined{"first": first, "second": second, "driven": driven, "done": done} {
		select {
		case <-j.ran:
			t.Errorf("%s transfer handed over once too often", name)
		default:
		}
	}
	h.mu.Lock()
	left, armed := len(h.waiting), h.armed
	h.mu.Unlock()
	if left != 0 || armed {
		t.Errorf("after every transfer was taken the handoffs keep %d waiting, timer armed %v", left, armed)
	}
	for _, j := range []joined{first, second, driven} {
		j.tr.Finish(0, nil)
	}
}

// BenchmarkTrackerLifetime is a one-plan tracker's whole life (made, armed, finished, waited) under a parent
// that can be cancelled, as the socket's connection context is, beside what its context alone costs.
func BenchmarkTrackerLifetime(b *testing.B) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	plans := []Plan{{}}
	b.Run("tracker", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tr := newTracker(parent, "test", plans, SubmitOptions{Timeout: time.Minute}, nil)
			tr.arm()
			tr.Finish(0, nil)
			if err := tr.Wait(parent); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cancel context", func(b *testing.B) {
		for b.Loop() {
			_, stop := context.WithCancelCause(parent)
			stop(nil)
		}
	})
	b.Run("deadline context", func(b *testing.B) {
		for b.Loop() {
			_, stop := context.WithDeadlineCause(parent, time.Now().Add(time.Minute), ErrDeadline)
			stop()
		}
	})
}

// The first reason a transfer stopped stands: a Cancel after a deregistration or after the deadline does not
// rewrite it, and contexts made from the transfer's see the deadline as context.DeadlineExceeded.
func TestTrackerFirstStopCauseStands(t *testing.T) {
	tr := newTracker(context.Background(), "test", []Plan{{}}, SubmitOptions{Timeout: time.Minute}, nil)
	tr.arm()
	tr.cancel(ErrDeregistered)
	tr.Cancel()
	if err := tr.StopCause(); !errors.Is(err, ErrDeregistered) {
		t.Errorf("stop cause after deregistration then Cancel = %v, want ErrDeregistered", err)
	}
	tr.Finish(0, nil)

	tr = newTracker(context.Background(), "test", []Plan{{}}, SubmitOptions{Timeout: 10 * time.Millisecond}, nil)
	tr.arm()
	child, stop := context.WithTimeout(tr.Context(), time.Hour)
	defer stop()
	select {
	case <-child.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a context made from the transfer's outlived its deadline")
	}
	if !errors.Is(child.Err(), context.DeadlineExceeded) {
		t.Errorf("derived context ended with %v, want context.DeadlineExceeded", child.Err())
	}
	tr.Cancel()
	if err := tr.StopCause(); !errors.Is(err, ErrDeadline) {
		t.Errorf("stop cause after the deadline then Cancel = %v, want ErrDeadline", err)
	}
	tr.Finish(0, nil)

	parent, cancelParent := context.WithCancelCause(context.Background())
	tr = newTracker(parent, "test", []Plan{{}}, SubmitOptions{Timeout: time.Minute}, nil)
	tr.arm()
	cancelParent(ErrClosed)
	if err := tr.StopCause(); !errors.Is(err, ErrClosed) {
		t.Errorf("stop cause after the submitter's context ended = %v, want its cause", err)
	}
	tr.Finish(0, nil)
}

// drivable is a Drivable of two functions.
type drivable struct {
	poll func() bool
	run  func()
}

func (d drivable) Poll() bool { return d.poll() }
func (d drivable) Run()       { d.run() }
