// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Backend copies between two local regions of the kinds it claims. The engine calls Claims only for pairs
// whose regions both belong to this node.
type Backend interface {
	// Name identifies the backend in refusal reasons ("host", "cuda", "hip").
	Name() string
	// Claims reports whether the backend copies from src to dst, and why not.
	Claims(src, dst *engines.MemoryDesc) (bool, string)
	// Register fills the handles this backend produces for local memory (returns desc unchanged if none).
	Register(ctx context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error)
	// Release drops what Register set up for desc; called once no copy uses the region any more.
	Release(ctx context.Context, desc *engines.MemoryDesc) error
	// Copy moves every segment of w.Plan and returns once the bytes have landed. When ctx ends it stops
	// promptly and returns ctx's error, but never before the hardware has stopped touching the memory.
	Copy(ctx context.Context, w engines.Work) error
	// Limits are the backend's planning limits (zero: none).
	Limits() engines.Limits
}

// Options configure the engine.
type Options struct {
	// Node is this node's name; regions registered here carry it.
	Node string
	// Workers is how many plans run at once (default 4).
	Workers int
	// Grace bounds how long Deregister and Close wait for cancelled copies (engines.DefaultGrace when zero).
	Grace time.Duration
	// CheckDisjoint makes CanHandle ask every backend and refuse a pair that two claim (tests, debugging).
	CheckDisjoint bool
	// Registry, when set, is the composite's region table, shared by every engine of the node (see
	// engines.Regions); nil gives the engine one of its own.
	Registry *engines.Registry
}

// Engine is the same-node engine.
type Engine struct {
	*engines.Base
	opts     Options
	backends []Backend
	reg      engines.Regions
	slots    *engines.Slots
}

var _ engines.Engine = (*Engine)(nil)

// New returns the engine over the given backends, tried in order.
func New(opts Options, backends ...Backend) (*Engine, error) {
	if opts.Node == "" {
		return nil, fmt.Errorf("xgmi engine: %w: node name required", engines.ErrInvalid)
	}
	if len(backends) == 0 {
		return nil, fmt.Errorf("xgmi engine: %w: no backend", engines.ErrInvalid)
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	reg, err := engines.NewRegions(engines.EngineXGMI, opts.Registry, opts.Node, opts.Grace)
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, backends: backends, reg: reg, slots: engines.NewSlots(opts.Workers)}
	var lim engines.Limits
	for _, b := range backends {
		lim = tighter(lim, b.Limits())
	}
	e.Base = engines.NewBase(engines.EngineXGMI, reg, lim, e.CanHandle)
	return e, nil
}

// BlockCopier is a Backend that copies the block plans of one submission together (one launch for every
// region pair of a KV layout). Every work item it is given has Plan.Blocks set and the same BlockList.
type BlockCopier interface {
	// StartBlocks queues the copies without waiting for them.
	StartBlocks(ctx context.Context, works []engines.Work) (Started, error)
}

// Started is a queued block copy.
type Started struct {
	// Wait returns once the bytes have landed (also when ctx ends first: never while the hardware may still
	// touch the memory).
	Wait func(ctx context.Context) error
	// Poll, when set, asks without blocking whether the copy has ended, and how.
	Poll func() (bool, error)
}

// tighter combines two backends' limits; block plans are taken when any backend takes them (the others get
// their segments expanded).
func tighter(a, b engines.Limits) engines.Limits {
	a.BlockPlans = a.BlockPlans || b.BlockPlans
	if b.MaxSegmentBytes > 0 && (a.MaxSegmentBytes == 0 || b.MaxSegmentBytes < a.MaxSegmentBytes) {
		a.MaxSegmentBytes = b.MaxSegmentBytes
	}
	if b.MaxPlanSegments > 0 && (a.MaxPlanSegments == 0 || b.MaxPlanSegments < a.MaxPlanSegments) {
		a.MaxPlanSegments = b.MaxPlanSegments
	}
	return a
}

// Register implements engines.Engine: every backend fills what it can.
func (e *Engine) Register(ctx context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error) {
	if desc.Node != e.opts.Node {
		return desc, fmt.Errorf("xgmi: registering %s: %w: memory of node %q on node %q", desc.ID, engines.ErrInvalid, desc.Node, e.opts.Node)
	}
	if err := desc.Validate(); err != nil {
		return desc, fmt.Errorf("xgmi: registering %s: %w", desc.ID, err)
	}
	out := desc
	var done []Backend
	for _, b := range e.backends {
		next, err := b.Register(ctx, out)
		if err != nil {
			e.release(ctx, done, &out)
			return desc, fmt.Errorf("xgmi: registering %s with %s backend: %w", desc.ID, b.Name(), err)
		}
		out = next
		done = append(done, b)
	}
	if err := e.reg.AddLocal(out); err != nil {
		e.release(ctx, done, &out)
		return desc, fmt.Errorf("xgmi: registering %s: %w", desc.ID, err)
	}
	return out, nil
}

func (e *Engine) release(ctx context.Context, bs []Backend, d *engines.MemoryDesc) error {
	var errs []error
	for _, b := range bs {
		if err := b.Release(ctx, d); err != nil {
			errs = append(errs, fmt.Errorf("%s backend: %w", b.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Deregister implements engines.Engine.
func (e *Engine) Deregister(ctx context.Context, id engines.MemoryID) error {
	d, local, err := e.reg.Describe(id)
	if err != nil {
		return fmt.Errorf("xgmi: deregistering: %w", err)
	}
	if err := e.reg.Remove(ctx, id); err != nil {
		return fmt.Errorf("xgmi: %w", err)
	}
	if local {
		// The copy that might have used backend state is over; release with a fresh bound.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := e.release(rctx, e.backends, d); err != nil {
			return fmt.Errorf("xgmi: deregistered %s, releasing backend state: %w", id, err)
		}
	}
	return nil
}

// CanHandle implements engines.Engine: both regions on this node, and a backend that claims them.
func (e *Engine) CanHandle(src, dst *engines.MemoryDesc) (bool, string) {
	if src.Node != e.opts.Node || dst.Node != e.opts.Node {
		return false, fmt.Sprintf("not both on this node (%s on %s, %s on %s)", src.ID, src.Node, dst.ID, dst.Node)
	}
	b, reason := e.backendFor(src, dst)
	return b != nil, reason
}

func (e *Engine) backendFor(src, dst *engines.MemoryDesc) (Backend, string) {
	var chosen Backend
	var reasons []string
	for _, b := range e.backends {
		ok, why := b.Claims(src, dst)
		if !ok {
			reasons = append(reasons, b.Name()+": "+why)
			continue
		}
		if chosen == nil {
			chosen = b
			if !e.opts.CheckDisjoint {
				break
			}
			continue
		}
		return nil, fmt.Sprintf("backends %s and %s both claim the pair (they must be disjoint)", chosen.Name(), b.Name())
	}
	if chosen == nil {
		return nil, "no backend claims the pair (" + strings.Join(reasons, "; ") + ")"
	}
	return chosen, ""
}

// Submit implements engines.Engine.
func (e *Engine) Submit(ctx context.Context, ps *engines.PlanSet, opts engines.SubmitOptions) (engines.Transfer, error) {
	var finalize func(context.Context, []engines.Outcome)
	if opts.Notify != nil {
		payload := append([]byte(nil), opts.Notify...)
		finalize = func(_ context.Context, outcomes []engines.Outcome) {
			e.deliver(ps.Plans, outcomes, payload)
		}
	}
	t, work, err := e.reg.Begin(ctx, e.Name(), ps, opts, finalize)
	if err != nil {
		return nil, fmt.Errorf("xgmi: %w", err)
	}
	if err := e.checkLists(work); err != nil {
		for _, w := range work {
			t.Finish(w.Index, fmt.Errorf("xgmi: %w", err))
		}
		return t, nil
	}
	if len(work) > 0 && !e.runInline(t, work) {
		// Block copies are queued here, so the GPU starts before any goroutine hand-off; they are waited for
		// beside the other plans.
		r := e.startBlocks(t, work)
		if opts.Waited && len(r.rest) == 0 && r.pollable() {
			// The submitter waits at once: its Wait polls the GPU itself, and only a Wait that gives up (or
			// none at all) hands the copy to a goroutine.
			t.DriveOnWait(r)
		} else {
			go r.Run()
		}
	}
	return t, nil
}

// PinnedIDs returns a block-id buffer a backend's kernels read in place (nil when no backend has one).
func (e *Engine) PinnedIDs(n int) ([]uint32, func()) {
	for _, b := range e.backends {
		if p, ok := b.(interface{ PinnedIDs(int) ([]uint32, func()) }); ok {
			if ids, free := p.PinnedIDs(n); ids != nil {
				return ids, free
			}
		}
	}
	return nil, nil
}

// ChecksBlocksAtRun implements engines.RunChecker: a pair whose backend checks block lists as it runs them
// (the CUDA backend, on the GPU). With CheckDisjoint the engine reads every id itself, so it never defers.
func (e *Engine) ChecksBlocksAtRun(src, dst *engines.MemoryDesc, blockBytes uint64, ids int) bool {
	if e.opts.CheckDisjoint {
		return false
	}
	b, _ := e.backendFor(src, dst)
	rc, ok := b.(engines.RunChecker)
	return ok && rc.ChecksBlocksAtRun(src, dst, blockBytes, ids)
}

// checkLists checks on the host the block lists planning left to a backend that will not check them (a route
// that changed since planning); the others are checked by their backend as it runs them.
func (e *Engine) checkLists(work []engines.Work) error {
	for _, w := range work {
		l := w.Plan.Blocks
		if l == nil || !l.Unchecked {
			continue
		}
		b, _ := e.backendFor(w.Src, w.Dst)
		if _, ok := b.(engines.RunChecker); ok {
			continue
		}
		if err := l.Check(); err != nil {
			return err
		}
	}
	return nil
}

// inlineMaxBytes: host copies this small are done inside Submit; a goroutine hand-off costs more than they do.
const inlineMaxBytes = 64 << 10

// runInline copies small host-only submissions on the caller's goroutine and reports whether it did.
func (e *Engine) runInline(t *engines.Tracker, work []engines.Work) bool {
	var total uint64
	for _, w := range work {
		total += w.Plan.Bytes
		if b, _ := e.backendFor(w.Src, w.Dst); b == nil {
			return false
		} else if _, host := b.(*HostBackend); !host {
			return false
		}
	}
	if total > inlineMaxBytes {
		return false
	}
	ctx := t.Context()
	for _, w := range work {
		b, _ := e.backendFor(w.Src, w.Dst)
		if err := ctx.Err(); err != nil { // already cancelled or past its deadline: move nothing
			t.Finish(w.Index, err)
			continue
		}
		if err := b.Copy(ctx, w); err != nil {
			t.Finish(w.Index, fmt.Errorf("xgmi %s copy %s -> %s: %w", b.Name(), w.Plan.Src, w.Plan.Dst, err))
			continue
		}
		t.Finish(w.Index, nil)
	}
	return true
}

// deliver hands the notification to this node's handler: every destination of this engine is local.
func (e *Engine) deliver(plans []engines.Plan, outcomes []engines.Outcome, payload []byte) {
	if !engines.AllSucceeded(outcomes) || len(plans) == 0 {
		return
	}
	ptrs := make([]*engines.Plan, len(plans))
	for i := range plans {
		ptrs[i] = &plans[i]
	}
	e.Deliver(engines.BuildNotification(e.opts.Node, ptrs, payload))
}

// blockRun is one submission's plans past planning: the block copies queued on BlockCopiers (started) and the
// plans copied otherwise (rest). One object holds what a submission to one backend needs, and it is what a
// waiter drives (engines.Drivable).
type blockRun struct {
	e        *Engine
	t        *engines.Tracker
	rest     []engines.Work
	started  []startedBlocks
	finished []bool // of started, set by Poll
	one      struct {
		started  [1]startedBlocks
		finished [1]bool
	}
}

// Run waits for the started copies, then copies the rest. It reads nothing Poll writes: a handoff may start it
// while a waiter still polls, and a plan finished twice keeps its first outcome.
func (r *blockRun) Run() {
	e, t := r.e, r.t
	ctx := t.Context()
	for _, sb := range r.started {
		e.finishStarted(t, sb, sb.Wait(ctx))
	}
	engines.RunPlans(t, r.rest, e.slots, func(ctx context.Context, w engines.Work) error {
		b, reason := e.backendFor(w.Src, w.Dst)
		if b == nil {
			return fmt.Errorf("xgmi: %w: %s", engines.ErrUnplannable, reason)
		}
		if !b.Limits().BlockPlans {
			w.Plan = engines.InSegments(w.Plan)
		}
		if err := b.Copy(ctx, w); err != nil {
			return fmt.Errorf("xgmi %s copy %s -> %s: %w", b.Name(), w.Plan.Src, w.Plan.Dst, err)
		}
		return nil
	})
}

// startedBlocks are block plans queued on a BlockCopier, waiting to be finished.
type startedBlocks struct {
	backend string
	works   []engines.Work
	Started
}

// pollable reports whether every started copy can be polled (and there is one).
func (r *blockRun) pollable() bool {
	if len(r.started) == 0 {
		return false
	}
	for _, sb := range r.started {
		if sb.Poll == nil {
			return false
		}
	}
	return true
}

// Poll finishes the started copies that have ended and reports whether all have (engines.Drivable).
func (r *blockRun) Poll() bool {
	all := true
	for i, sb := range r.started {
		if r.finished[i] {
			continue
		}
		done, err := sb.Poll()
		if !done {
			all = false
			continue
		}
		r.finished[i] = true
		r.e.finishStarted(r.t, sb, err)
	}
	return all
}

// finishStarted records how a started block copy ended, for each of its plans.
func (e *Engine) finishStarted(t *engines.Tracker, sb startedBlocks, err error) {
	if err != nil {
		err = fmt.Errorf("xgmi %s block copy of %d region pairs: %w", sb.backend, len(sb.works), err)
	}
	for _, w := range sb.works {
		t.Finish(w.Index, err)
	}
}

// startBlocks queues the block plans whose backend is a BlockCopier, one call per backend, and keeps the rest.
// Plans whose start failed are finished here.
func (e *Engine) startBlocks(t *engines.Tracker, work []engines.Work) *blockRun {
	r := &blockRun{e: e, t: t}
	r.started, r.finished = r.one.started[:0], r.one.finished[:]
	var groups map[Backend][]engines.Work
	var order []Backend
	if len(work) == 1 {
		// One plan, the usual block copy: its backend is the one group, the work slice its list.
		if b, _ := e.backendFor(work[0].Src, work[0].Dst); isBlockCopier(b, work[0]) {
			order = []Backend{b}
		} else {
			r.rest = work
		}
	} else {
		groups = map[Backend][]engines.Work{}
		for _, w := range work {
			b, _ := e.backendFor(w.Src, w.Dst)
			if !isBlockCopier(b, w) {
				r.rest = append(r.rest, w)
				continue
			}
			if groups[b] == nil {
				order = append(order, b)
			}
			groups[b] = append(groups[b], w)
		}
	}
	ctx := t.Context()
	for _, b := range order {
		ws := work
		if groups != nil {
			ws = groups[b]
		}
		err := ctx.Err()
		var st Started
		if err == nil {
			st, err = b.(BlockCopier).StartBlocks(ctx, ws)
		}
		if err != nil {
			for _, w := range ws {
				t.Finish(w.Index, fmt.Errorf("xgmi %s block copy of %d region pairs: %w", b.Name(), len(ws), err))
			}
			continue
		}
		r.started = append(r.started, startedBlocks{backend: b.Name(), works: ws, Started: st})
	}
	if len(r.started) > len(r.one.finished) {
		r.finished = make([]bool, len(r.started))
	}
	return r
}

// isBlockCopier reports whether w is a block plan that b queues as such.
func isBlockCopier(b Backend, w engines.Work) bool {
	_, ok := b.(BlockCopier)
	return ok && w.Plan.Blocks != nil
}

// Close implements engines.Engine.
func (e *Engine) Close() error {
	if err := e.reg.Close(); err != nil {
		return fmt.Errorf("xgmi: %w", err)
	}
	return nil
}
