// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"context"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
)

// Pending is a submitted copy; Wait reports how it ended. HIP events are
// queried and awaited without a current device, so waiting never touches the
// calling thread's device.
type Pending struct {
	c      *Copier
	start  hip.Event // with Options.TimeDevice
	event  hip.Event
	slot   *slot
	end    gpushare.Completion
	bytes  uint64    // what the submission moves
	queued time.Time // when it was queued
}

// DeviceTime is the GPU time of the copy (Options.TimeDevice; 0 otherwise or before Done).
func (p *Pending) DeviceTime() time.Duration {
	if !p.Done() {
		return 0
	}
	return p.end.DeviceTime()
}

// Done reports whether the copy has finished (successfully or not), asking
// the GPU without blocking.
func (p *Pending) Done() bool {
	if p.end.Ended() {
		return true
	}
	ready, err := p.c.rt.EventQuery(p.event)
	if ready || err != nil {
		p.finish(err)
		return true
	}
	return false
}

// Wait blocks until the copy finishes or ctx ends; it is idempotent. When
// ctx ends first the copy goes on (a launched kernel cannot be recalled) and
// a later Wait still reports how it ended. A Pending must be waited for (or
// polled with Done until true): that returns its staging and events.
//
// It polls the completion event for Options.SpinWait plus the least time the
// copy can take (a hand-off between threads costs more than a short copy),
// then leaves it to a watcher blocked in hipEventSynchronize.
func (p *Pending) Wait(ctx context.Context) error {
	if p.end.Ended() {
		return p.end.Err()
	}
	least := time.Duration(float64(p.bytes) / p.c.opts.SleepRate * 1e9)
	if finished, err := gpushare.SpinUntil(ctx, time.Now().Add(p.c.opts.SpinWait+least), 0, func() (bool, error) {
		return p.c.rt.EventQuery(p.event)
	}); finished {
		p.finish(err)
		return p.end.Err()
	}
	p.end.WatchOnce.Do(func() { go p.watch() })
	return p.end.Block(ctx)
}

// watch waits for the completion event on its own thread, blocked in the runtime.
func (p *Pending) watch() {
	p.finish(p.c.rt.EventSynchronize(p.event))
}

func (p *Pending) finish(err error) { p.end.Finish(err, p.ended) }

// ended is how the copy ended and its GPU time; it hands back the events and staging.
func (p *Pending) ended(err error) (error, time.Duration) {
	var gpu time.Duration
	if err == nil && p.start != 0 {
		if ms, err := p.c.rt.EventElapsed(p.start, p.event); err == nil {
			gpu = time.Duration(float64(ms) * 1e6)
		}
	}
	p.c.release(p)
	return err, gpu
}
