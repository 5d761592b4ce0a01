// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Tracker is the Transfer that Registry.Begin returns. Engines run each Work and report it with Finish; the
// tracker enforces the deadline, turns context endings into ErrDeadline/ErrCancelled/ErrDeregistered, unpins
// regions when the last plan ends, and implements Wait/Done/Cancel/Outcomes.
type Tracker struct {
	engine string
	plans  []Plan
	start  time.Time

	ctx   transferContext
	cause atomic.Pointer[error] // why cancel stopped it, for StopCause (the deadline's is the context's)

	mu        sync.Mutex
	outcomes  []Outcome
	finished  []bool
	remaining int
	armed     bool
	result    error
	done      chan struct{}

	finalize   func(ctx context.Context, outcomes []Outcome)
	onDone     partWatcher
	onDonePart int
	share      string // SubmitOptions.Share: whose turn a slot is (RunPlans)
	// pinned are the regions Begin pinned for the transfer; reg unpins them once it settles (nil: none).
	pinned []*region
	reg    *Registry
	// one holds what a transfer of one plan, the usual waited block copy, keeps per plan (its outcome, finished
	// flag, pinned regions and work), sparing their allocations.
	one struct {
		outcome  [1]Outcome
		finished [1]bool
		pinned   [2]*region
		work     [1]Work
	}

	drive    driver    // set by DriveOnWait
	handoffs *handoffs // the registry's, which DriveOnWait joins; nil: one of the tracker's own

	// lander is told that every byte landed (DriveLanded), under mu; landed says complete told it.
	lander Lander
	landed bool
}

// WaitedHandoff bounds how long a transfer submitted as Waited waits for a Wait before a goroutine takes it.
const WaitedHandoff = 5 * time.Millisecond

// driverPollBudget bounds how long one Drive polls before handing the transfer to a goroutine: a copy still
// running after this is long enough for a thread hand-off not to matter.
const driverPollBudget = 2 * time.Millisecond

// Drivable is a transfer's work an engine leaves to its waiter (DriveOnWait): Poll, non-blocking, finishes what
// has ended and reports whether every plan has; Run, blocking, waits for the rest on a goroutine of its own.
// Only one goroutine calls Poll at a time. An interface, not two closures: one object per transfer.
type Drivable interface {
	Poll() bool
	Run()
}

// driver lets the waiting goroutine advance a transfer (DriveOnWait); handing over starts Run once.
type driver struct {
	mu      sync.Mutex
	work    Drivable
	handed  bool
	holding bool
	driven  bool // a Drive started: it hands the transfer over itself if it gives up
}

// DriveOnWait makes Wait and Drive advance the transfer by calling work.Poll on the waiting goroutine, and
// work.Run (on a goroutine of its own) the fallback: when a Drive gives up, or nobody drives within
// WaitedHandoff. Engines call it before Submit returns, instead of starting Run themselves.
func (t *Tracker) DriveOnWait(work Drivable) {
	d := &t.drive
	d.mu.Lock()
	d.work = work
	d.mu.Unlock()
	if t.handoffs == nil {
		t.handoffs = &handoffs{}
	}
	t.handoffs.add(t, time.Now())
}

// handOff starts the blocking run on a goroutine, once, unless the transfer is done.
func (t *Tracker) handOff() {
	d := &t.drive
	d.mu.Lock()
	if d.handed || d.work == nil {
		d.mu.Unlock()
		return
	}
	d.handed = true
	work := d.work
	d.mu.Unlock()
	select {
	case <-t.done:
	default:
		go work.Run()
	}
}

// Drive implements Driven: it polls on the caller's goroutine until the transfer is done, ctx ends or
// driverPollBudget passes, then hands the transfer over if it is not done.
func (t *Tracker) Drive(ctx context.Context) bool {
	d := &t.drive
	d.mu.Lock()
	if d.work == nil || d.handed || d.holding {
		d.mu.Unlock()
		return t.isDone()
	}
	d.holding, d.driven = true, true
	work := d.work
	d.mu.Unlock()
	until := time.Now().Add(driverPollBudget)
	done := false
	// The contexts and the clock are read every 16 polls: the transfer's context reads the clock for its
	// deadline, and a poll of a done word is a few nanoseconds.
	for i := 0; ; i++ {
		if done = work.Poll(); done {
			break
		}
		if i%16 == 15 && (ctx.Err() != nil || t.ctx.Err() != nil || time.Now().After(until)) {
			break
		}
	}
	d.mu.Lock()
	d.holding = false
	d.mu.Unlock()
	if !done {
		t.handOff()
	}
	return done && t.isDone()
}

// DriveLanded implements LandedDriven: Drive, with l told of a success before the transfer's bookkeeping.
func (t *Tracker) DriveLanded(ctx context.Context, l Lander) (done, landed bool) {
	t.mu.Lock()
	t.lander = l
	t.mu.Unlock()
	done = t.Drive(ctx)
	t.mu.Lock()
	taken := t.lander == nil
	t.lander = nil
	t.mu.Unlock()
	if !taken {
		return done, false
	}
	// complete took l, on this goroutine or another: it tells l (or not) before Done closes, so l has
	// returned once Done is closed, and nothing tells it afterwards.
	<-t.done
	return true, t.landed
}

// driveTaken reports whether the transfer no longer needs the handoff: done, handed over, or driven (a Drive
// hands it over itself when it gives up).
func (t *Tracker) driveTaken() bool {
	d := &t.drive
	d.mu.Lock()
	taken := d.handed || d.driven
	d.mu.Unlock()
	return taken || t.isDone()
}

// handoffs hands waited transfers that nobody drives within WaitedHandoff to a goroutine, with one timer for
// all of a registry's transfers: a timer of its own for each transfer (armed, then stopped microseconds later
// by its waiter) cost more than the rest of the engine's work around a small GPU copy.
type handoffs struct {
	mu      sync.Mutex
	waiting []handoffEntry // in the order they joined, so by due time
	timer   *time.Timer
	armed   bool
}

type handoffEntry struct {
	t   *Tracker
	due time.Time
}

func (h *handoffs) add(t *Tracker, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting = append(h.waiting, handoffEntry{t: t, due: now.Add(WaitedHandoff)})
	if h.armed {
		return
	}
	h.armed = true
	if h.timer == nil {
		h.timer = time.AfterFunc(WaitedHandoff, h.sweep)
	} else {
		h.timer.Reset(WaitedHandoff)
	}
}

// sweep hands over the transfers that are due and nobody took, forgets the taken ones, and waits for the next.
func (h *handoffs) sweep() {
	now := time.Now()
	h.mu.Lock()
	var due []*Tracker
	keep := h.waiting[:0]
	for _, e := range h.waiting {
		switch {
		case e.t.driveTaken():
		case now.Before(e.due):
			keep = append(keep, e)
		default:
			due = append(due, e.t)
		}
	}
	clear(h.waiting[len(keep):])
	h.waiting = keep
	if len(keep) > 0 {
		h.timer.Reset(keep[0].due.Sub(now))
	} else {
		h.armed = false
	}
	h.mu.Unlock()
	for _, t := range due {
		t.handOff()
	}
}

func (t *Tracker) isDone() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func newTracker(parent context.Context, engine string, plans []Plan, opts SubmitOptions,
	finalize func(context.Context, []Outcome)) *Tracker {
	t := &Tracker{
		engine:     engine,
		plans:      plans,
		start:      time.Now(),
		remaining:  len(plans),
		done:       make(chan struct{}),
		finalize:   finalize,
		onDone:     opts.onDone,
		onDonePart: opts.onDonePart,
		share:      opts.Share,
	}
	if len(plans) == 1 {
		t.outcomes, t.finished = t.one.outcome[:], t.one.finished[:]
	} else {
		t.outcomes, t.finished = make([]Outcome, len(plans)), make([]bool, len(plans))
	}
	// The earlier of the context's deadline and now+Timeout; DefaultTimeout when neither is set.
	parentDeadline, hasParent := parent.Deadline()
	var deadline time.Time
	switch {
	case opts.Timeout > 0:
		deadline = t.start.Add(opts.Timeout)
		if hasParent && parentDeadline.Before(deadline) {
			deadline = parentDeadline
		}
	case hasParent:
		deadline = parentDeadline
	default:
		deadline = t.start.Add(DefaultTimeout)
	}
	// The context carries the enforced deadline (engines hand ctx.Deadline() to peers and syscalls) and ends
	// with errDeadline as its cause when it passes. One context, not a cancellable one under the deadline: the
	// reason of a cancel is kept beside it. It lives in the tracker and arms its timer only if someone waits on
	// its Done (transferContext).
	t.ctx.init(parent, deadline)
	return t
}

// Context is cancelled when the transfer must stop: Cancel, deadline, deregistration of one of its regions,
// engine Close, or the submitter's context ending. Engines watch it.
func (t *Tracker) Context() context.Context { return &t.ctx }

// Deadline returns the deadline the tracker enforces: the earlier of the submitter's context deadline and
// now+Timeout, or now+DefaultTimeout when neither is set. Never zero.
func (t *Tracker) Deadline() time.Time { return t.ctx.deadline }

// cancel stops the transfer's context with cause, unless it already ended (the first reason stands).
func (t *Tracker) cancel(cause error) {
	if t.ctx.Err() == nil {
		t.cause.CompareAndSwap(nil, &cause)
	}
	t.ctx.stop()
}

// Cancel implements Transfer.
func (t *Tracker) Cancel() { t.cancel(errCancelled) }

// Done implements Transfer.
func (t *Tracker) Done() <-chan struct{} { return t.done }

// StopCause returns the typed reason the transfer's context ended (nil while it is live).
func (t *Tracker) StopCause() error {
	return t.stopCause()
}

// stopCause is the typed reason the context ended: the cause cancel was given, else the context's own (its
// deadline's, or the submitter's context's).
func (t *Tracker) stopCause() error {
	if t.ctx.Err() == nil {
		return nil
	}
	cause := t.ctx.cause()
	if c := t.cause.Load(); c != nil && !errors.Is(cause, ErrDeadline) {
		cause = *c
	}
	switch {
	case cause == nil:
		return nil
	case errors.Is(cause, ErrDeadline), errors.Is(cause, ErrCancelled), errors.Is(cause, ErrDeregistered),
		errors.Is(cause, ErrClosed):
		return cause
	case errors.Is(cause, context.DeadlineExceeded):
		return errDeadline
	case errors.Is(cause, context.Canceled):
		return errCancelled
	}
	return fmt.Errorf("%w: %w", ErrCancelled, cause)
}

// Finish records plan i's outcome (nil = success). Later calls for the same plan are ignored. An error that
// is only the context ending is replaced by the typed reason it ended.
func (t *Tracker) Finish(i int, err error) {
	if err != nil && t.ctx.Err() != nil &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		err = t.stopCause()
	}
	t.mu.Lock()
	if i < 0 || i >= len(t.finished) || t.finished[i] {
		t.mu.Unlock()
		return
	}
	t.finished[i] = true
	t.outcomes[i] = Outcome{Err: err, Elapsed: time.Since(t.start)}
	t.remaining--
	complete := t.armed && t.remaining == 0
	t.mu.Unlock()
	if complete {
		t.complete()
	}
}

// arm allows completion; Begin calls it once every refused plan is recorded.
func (t *Tracker) arm() {
	t.mu.Lock()
	t.armed = true
	complete := t.remaining == 0
	t.mu.Unlock()
	if complete {
		t.complete()
	}
}

func (t *Tracker) complete() {
	if t.finalize != nil {
		t.finalize(&t.ctx, t.outcomes)
	}
	var failures []Failure
	for i, o := range t.outcomes {
		if o.Err != nil {
			p := &t.plans[i]
			failures = append(failures, Failure{Engine: t.engine, Plan: i, Src: p.Src, Dst: p.Dst, Tags: p.Tags, Err: o.Err})
		}
	}
	if len(failures) > 0 {
		t.result = &TransferError{Failures: failures}
	}
	t.mu.Lock()
	l := t.lander
	t.lander = nil
	t.landed = l != nil && t.result == nil
	t.mu.Unlock()
	if t.landed {
		l.Landed() // before the rest: the waiting caller hears of its bytes before the bookkeeping below
	}
	t.ctx.stop() // releases the context's timer and link, if Done armed them; the outcome is already fixed
	// Done closes before the regions are unpinned, so a Deregister that waited for them returns after Done.
	close(t.done)
	if t.onDone != nil {
		t.onDone.partFinished(t.onDonePart)
	}
	if t.reg != nil {
		t.reg.releaseTracker(t)
	}
}

// Wait implements Transfer.
func (t *Tracker) Wait(ctx context.Context) error {
	t.Drive(ctx)
	select {
	case <-t.done:
		return t.result
	case <-ctx.Done():
		select {
		case <-t.done:
			return t.result
		default:
		}
		return fmt.Errorf("waiting for %s transfer: %w", t.engine, ctx.Err())
	}
}

// Outcomes implements Transfer; nil until Done is closed.
func (t *Tracker) Outcomes() []Outcome {
	select {
	case <-t.done:
		return t.outcomes
	default:
		return nil
	}
}

// Plans returns the plans this tracker follows, in PlanSet order.
func (t *Tracker) Plans() []Plan { return t.plans }
