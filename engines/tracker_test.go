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
