// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Completion is how a submitted copy ended, kept alike on both runtimes: ended once, by whichever of its
// waiter, a poller (Done) or the watcher thread sees the end first, and read by all of them afterwards. How
// the end is seen (which event, in which context, after which earlier copy) stays with each backend's Pending.
// A Pending holds it by value: starting one allocates only its channel.
type Completion struct {
	done chan struct{}
	err  error
	gpu  time.Duration
	once sync.Once
	// WatchOnce starts the backend's watcher thread at most once per copy. It sits beside once so that the
	// two pack without padding: a Pending stays in the allocation size class it had.
	WatchOnce sync.Once
}

// Start readies c for a new submission.
func (c *Completion) Start() { c.done = make(chan struct{}) }

// Ended reports, without blocking, whether the copy has ended.
func (c *Completion) Ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Err is how the copy ended; read it only once Ended (or Finish) says it did.
func (c *Completion) Err() error { return c.err }

// DeviceTime is the copy's GPU time as Finish recorded it; 0 before the end.
func (c *Completion) DeviceTime() time.Duration {
	if !c.Ended() {
		return 0
	}
	return c.gpu
}

// Finish ends the copy, once: end turns what the runtime reported into the copy's outcome and GPU time (and
// hands back its resources), then every waiter wakes. Later calls do nothing.
func (c *Completion) Finish(reported error, end func(error) (error, time.Duration)) {
	c.once.Do(func() {
		c.err, c.gpu = end(reported)
		close(c.done)
	})
}

// Block waits for the end, which the backend's watcher thread will see, or for ctx.
func (c *Completion) Block(ctx context.Context) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for a GPU copy: %w", ctx.Err())
	}
}

// Chan is closed at the end.
func (c *Completion) Chan() <-chan struct{} { return c.done }
