// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"errors"
	"testing"
	"time"
)

type valueKey struct{}

// expectClosed fails unless ch closes within a second.
func expectClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatalf("%s: Done did not close", what)
	}
}

// TestTransferContextEndsAsWithDeadlineCause checks every way a transfer's context ends, each with Done asked
// before and after the ending: the deadline, the parent's cancel (its cause kept), and stop. The first ending
// stands; a context derived from it ends with it.
func TestTransferContextEndsAsWithDeadlineCause(t *testing.T) {
	parentCause := errors.New("the caller went away")
	for _, tc := range []struct {
		name      string
		deadline  time.Duration
		end       func(c *transferContext, cancelParent context.CancelCauseFunc)
		err       error
		wantCause error
	}{
		{"deadline", 20 * time.Millisecond, func(*transferContext, context.CancelCauseFunc) { time.Sleep(30 * time.Millisecond) },
			context.DeadlineExceeded, ErrDeadline},
		{"parent", time.Minute, func(_ *transferContext, cancel context.CancelCauseFunc) { cancel(parentCause) },
			context.Canceled, parentCause},
		{"stop", time.Minute, func(c *transferContext, _ context.CancelCauseFunc) { c.stop() },
			context.Canceled, context.Canceled},
	} {
		for _, doneFirst := range []bool{true, false} {
			t.Run(tc.name+map[bool]string{true: "/done-asked-first", false: "/done-asked-after"}[doneFirst], func(t *testing.T) {
				parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), valueKey{}, "value"))
				defer cancel(nil)
				var c transferContext
				c.init(parent, time.Now().Add(tc.deadline))
				if d, ok := c.Deadline(); !ok || time.Until(d) > tc.deadline {
					t.Fatalf("Deadline() = %v, %v", d, ok)
				}
				if c.Value(valueKey{}) != "value" {
					t.Fatal("Value does not reach the parent's values")
				}
				if err := c.Err(); err != nil || c.cause() != nil {
					t.Fatalf("live context: Err %v, cause %v", err, c.cause())
				}
				var done <-chan struct{}
				var child context.Context
				if doneFirst {
					done = c.Done()
					var stopChild context.CancelFunc
					child, stopChild = context.WithCancel(&c)
					defer stopChild()
					select {
					case <-done:
						t.Fatal("Done closed while the context is live")
					default:
					}
				}
				tc.end(&c, cancel)
				if done == nil {
					done = c.Done()
				}
				expectClosed(t, done, "the context")
				if child != nil {
					expectClosed(t, child.Done(), "a context derived from it")
				}
				if err := c.Err(); !errors.Is(err, tc.err) {
					t.Fatalf("Err() = %v, want %v", err, tc.err)
				}
				if got := c.cause(); !errors.Is(got, tc.wantCause) {
					t.Fatalf("cause() = %v, want %v", got, tc.wantCause)
				}
				// The first ending stands.
				c.stop()
				cancel(errors.New("later"))
				if got := c.cause(); !errors.Is(got, tc.wantCause) {
					t.Fatalf("after a later ending, cause() = %v, want %v", got, tc.wantCause)
				}
				c.mu.Lock()
				timer, unlink := c.timer, c.unlink
				c.mu.Unlock()
				if timer != nil || unlink != nil {
					t.Fatal("an ended context still holds its timer or its link to the parent")
				}
			})
		}
	}
}

// TestTransferContextWithoutDoneAllocatesNothing: a transfer nobody waits on through Done costs no timer, no
// channel and no link into its parent, however often its engine asks Err.
func TestTransferContextWithoutDoneAllocatesNothing(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	var c transferContext
	allocs := testing.AllocsPerRun(1000, func() {
		c = transferContext{}
		c.init(parent, time.Now().Add(time.Minute))
		for range 10 {
			if c.Err() != nil {
				t.Fatal("live context ended")
			}
		}
		c.stop()
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per transfer context without Done, want 0", allocs)
	}
	if c.done != nil || c.timer != nil {
		t.Fatal("Err made the channel or armed the timer")
	}
}

// TestTransferContextPastDeadlineEndsAtOnce: a deadline already passed ends the context on its first Err, and a
// Done asked then is closed.
func TestTransferContextPastDeadlineEndsAtOnce(t *testing.T) {
	var c transferContext
	c.init(context.Background(), time.Now().Add(-time.Millisecond))
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err() = %v, want DeadlineExceeded", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done of an ended context is not closed")
	}
	if got := c.cause(); !errors.Is(got, ErrDeadline) {
		t.Fatalf("cause() = %v, want ErrDeadline", got)
	}
}
