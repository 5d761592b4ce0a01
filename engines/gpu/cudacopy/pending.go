// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// errCopierClosed ends a copy whose end nobody saw before its copier closed (Close waited for the stream, so it
// did end; how is not known).
var errCopierClosed = fmt.Errorf("the GPU copier closed before the copy's end was seen: %w", engines.ErrClosed)

// Pending is a submitted copy; Wait reports how it ended.
type Pending struct {
	c         *Copier
	start     cuda.Event // with Options.TimeDevice
	event     cuda.Event
	slot      *slot
	resident  *gpushare.ResidentSet[*slot] // kept descriptors the launch read or wrote
	reused    bool                         // the launch read kept descriptors
	byKernel  bool                         // the submission's kernel writes doneSeq itself
	doneSeq   uint32                       // what the copier's done word shows once the copy ended (0: none)
	end       gpushare.Completion
	bytes     uint64        // what the submission moves
	queued    time.Time     // when it was queued
	timedFrom time.Time     // when the device timing's start was queued
	queueing  time.Duration // host time from there to the end event
	checked   *checkedList  // a block list the GPU checked: its verdict is read at the end
	// prev is the submission queued before this one on the stream (nil once either ended), which the stream
	// finishes first: Wait blocks on it before polling, so of many copies in flight only the oldest polls the
	// GPU. With every waiter polling, eight 64 MiB copies in flight took 69 µs each instead of 43: the polls
	// contend in the driver with the next launches.
	prev    atomic.Pointer[Pending]
	waiters atomic.Int32 // goroutines in Wait
}

// DeviceTime is the GPU time of the copy, from its first queued operation to
// its completion (Options.TimeDevice; 0 otherwise or before Done). Where the
// copier holds its stream until the submission is queued (TimingGated), the
// host's driver calls are not in it.
func (p *Pending) DeviceTime() time.Duration {
	if !p.Done() {
		return 0
	}
	return p.end.DeviceTime()
}

// ReusedDescriptors reports whether the kernel read descriptors an earlier
// launch left in device memory (Options.ResidentLayouts) instead of staging.
func (p *Pending) ReusedDescriptors() bool { return p.reused }

// Done reports whether the copy has finished (successfully or not), asking
// the GPU without blocking: the done word where the copier writes one (a
// failed copy, which never writes it, is reported by Wait, whose watcher asks
// the driver), else the completion event.
func (p *Pending) Done() bool {
	if p.end.Ended() {
		return true
	}
	if p.doneSeq != 0 {
		// Polled back to back by the engines: a driver query between reads of the word would hold the driver
		// from the thread queueing the next copies and see the word late by its own length.
		if !p.c.done.Reached(p.doneSeq) {
			return false
		}
		p.finish(nil)
		return true
	}
	var ready bool
	var qerr error
	_ = p.c.drv.WithContextKept(p.c.ctx, func() error {
		ready, qerr = p.c.drv.EventQuery(p.event)
		return nil
	})
	if ready || qerr != nil {
		p.finish(qerr)
		return true
	}
	return false
}

// Wait blocks until the copy finishes or ctx ends; it is idempotent. When
// ctx ends first the copy goes on (a launched kernel cannot be recalled) and
// a later Wait still reports how it ended. A Pending must be waited for (or
// polled with Done until true): that returns its staging and events.
//
// Short copies are awaited by polling on the calling goroutine for up to
// Options.SpinWait, which saves the hand-offs between threads that dominate a
// copy of tens of microseconds: the copier's done word (memory, read back to
// back) or, where there is none, the completion event (a driver call, spaced
// by Options.PollGap). Longer ones are left to a watcher blocked in the driver,
// which also reports how a failed copy ended (a failed stream never writes the
// word).
func (p *Pending) Wait(ctx context.Context) error {
	if p.end.Ended() {
		return p.end.Err()
	}
	// Poll for up to SpinWait beyond the least time the copy can take (bytes
	// at a rate above any path of this GPU). Sleeping through that time
	// instead was measured on the H200 VM: Go timers there overslept a
	// 0.27 ms sleep by most of a millisecond, doubling a 1 GiB copy's latency.
	p.waiters.Add(1)
	defer p.waiters.Add(-1)
	started := p.queued // the copy runs from here, or once the copy before it ended
	if prev := p.prev.Load(); prev != nil {
		if err := prev.follow(ctx); err != nil {
			p.end.WatchOnce.Do(func() { go p.watch() })
			return fmt.Errorf("waiting for a GPU copy: %w", err)
		}
		p.prev.Store(nil)
		started = time.Now()
	}
	least := time.Duration(float64(p.bytes) / p.c.opts.SleepRate * 1e9)
	// Nothing of p.bytes ends sooner than least after it started: until then the clock is polled, not the driver.
	for until := started.Add(least); time.Now().Before(until) && ctx.Err() == nil; {
	}
	var finished bool
	var qerr error
	if p.doneSeq != 0 {
		// The done word is memory: polled back to back, it costs the driver nothing.
		finished, _ = gpushare.SpinUntil(ctx, time.Now().Add(p.c.opts.SpinWait+least), 0, p.reached)
	} else {
		_ = p.c.drv.WithContextKept(p.c.ctx, func() error {
			finished, qerr = gpushare.SpinUntil(ctx, time.Now().Add(p.c.opts.SpinWait+least), p.c.opts.PollGap, func() (bool, error) {
				return p.c.drv.EventQuery(p.event)
			})
			return nil
		})
	}
	if finished {
		p.finish(qerr)
		return p.end.Err()
	}
	p.end.WatchOnce.Do(func() { go p.watch() })
	return p.end.Block(ctx)
}

// reached polls the copier's done word for p's sequence number.
func (p *Pending) reached() (bool, error) { return p.c.done.Reached(p.doneSeq), nil }

// follow returns once p has ended, or with ctx's error: it blocks on p's end while another goroutine waits for
// p (which polls the GPU), else it waits for p itself, so a later copy waited for first still ends.
func (p *Pending) follow(ctx context.Context) error {
	if p.waiters.Load() > 0 {
		select {
		case <-p.end.Chan():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	_ = p.Wait(ctx) // p's own outcome is its waiter's; only whether it ended matters here
	return ctx.Err()
}

// watch waits for the copy's end on its own thread, blocked in the driver
// (which spins briefly, then yields) on its completion event, or, where the
// done word left it without one, on an event recorded now: it completes once
// everything queued so far has, this copy included.
func (p *Pending) watch() {
	ev, err := p.event, error(nil)
	if ev == 0 {
		if ev, err = p.c.recordBehindQueued(); ev != 0 {
			defer p.c.events.Put(ev, false)
		}
	}
	if err == nil {
		err = p.c.drv.WithContext(p.c.ctx, func() error { return p.c.drv.EventSynchronize(ev) })
	}
	p.finish(err)
}

func (p *Pending) finish(err error) { p.end.Finish(err, p.ended) }

// ended is how the copy ended (with the verdict of a block list the GPU checked) and its GPU time; it hands
// back the events and staging.
func (p *Pending) ended(err error) (error, time.Duration) {
	var gpu time.Duration
	if err == nil && p.start != 0 {
		_ = p.c.drv.WithContext(p.c.ctx, func() error {
			ms, err := p.c.drv.EventElapsed(p.start, p.event)
			if err == nil {
				gpu = time.Duration(float64(ms) * 1e6)
			}
			return nil
		})
	}
	if err == nil && p.checked != nil {
		err = p.checked.verdict(p.slot.host()[:reportBytes])
	}
	p.prev.Store(nil) // the chain of earlier submissions must not outlive them
	p.c.release(p)
	return err, gpu
}
