// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// CompositeName is what the composite engine answers to Name.
const CompositeName = "composite"

// routeCacheLimit bounds the route cache; it is emptied when full (routes are cheap to recompute).
const routeCacheLimit = 1 << 16

// CompositeOptions configure a Composite.
type CompositeOptions struct {
	// Node is this node's name.
	Node string
	// Metrics, when set, is charged for every plan and every rejected item.
	Metrics *Metrics
	// Registry, when set, is the node's one region table: every engine was built with it (each engine's
	// Options.Registry) and shares it. The composite then alone adds and removes regions, drains them on
	// Deregister across engines, and plans every batch once, for all engines (see Planned). Nil: the composite
	// keeps a table of its own beside each engine's, and hands items to each engine's NewPlan.
	Registry *Registry
}

// Planned is an engine that shares the composite's registry and lets the composite plan for it: the composite
// builds the engine's plan sets itself, with the engine's limits, in the one pass that checks the batch
// (lookup, bounds, overlap, order), and the engine only executes them.
type Planned interface {
	Engine
	// Registry is the region table the engine plans and submits against.
	Registry() *Registry
	// PlanLimits are the limits the engine plans with.
	PlanLimits() Limits
}

// Composite routes each (source, destination) pair to the first engine, in the fixed order xgmi, fabric, rdma,
// tcp, whose CanHandle claims it. Registration fans out to every engine and merges their handles. It is itself
// an Engine, so callers (the agent, xferbench) use one object.
type Composite struct {
	opts    CompositeOptions
	engines []Engine
	reg     *Registry
	// shared: every engine shares reg (CompositeOptions.Registry) and limits holds each one's plan limits.
	shared bool
	limits []Limits

	mu     sync.Mutex
	routes map[[2]MemoryID]route
	hook   notifyHook
}

type route struct {
	engine   int // index into engines; -1 when none claims the pair
	refusals []Refusal
	conflict string
}

var _ Engine = (*Composite)(nil)

// NewComposite returns a composite over the given engines (any subset of the four, each at most once).
func NewComposite(opts CompositeOptions, engs ...Engine) (*Composite, error) {
	if opts.Node == "" {
		return nil, fmt.Errorf("composite engine: %w: node name required", ErrInvalid)
	}
	sorted := slices.Clone(engs)
	seen := map[string]bool{}
	for _, e := range sorted {
		if _, ok := EngineRank(e.Name()); !ok {
			return nil, fmt.Errorf("composite engine: %w: unknown engine %q", ErrInvalid, e.Name())
		}
		if seen[e.Name()] {
			return nil, fmt.Errorf("composite engine: %w: engine %q given twice", ErrInvalid, e.Name())
		}
		seen[e.Name()] = true
	}
	slices.SortFunc(sorted, func(a, b Engine) int {
		ra, _ := EngineRank(a.Name())
		rb, _ := EngineRank(b.Name())
		return ra - rb
	})
	c := &Composite{opts: opts, engines: sorted, reg: opts.Registry, routes: map[[2]MemoryID]route{}}
	if c.reg == nil {
		c.reg = NewRegistry(opts.Node, 0)
	} else {
		if c.reg.Self() != opts.Node {
			return nil, fmt.Errorf("composite engine: %w: registry of node %q for node %q", ErrInvalid, c.reg.Self(), opts.Node)
		}
		c.shared = true
		for _, e := range sorted {
			pe, ok := e.(Planned)
			if !ok || pe.Registry() != c.reg {
				return nil, fmt.Errorf("composite engine: %w: engine %s does not share the composite's registry", ErrInvalid, e.Name())
			}
			c.limits = append(c.limits, pe.PlanLimits())
		}
	}
	for _, e := range sorted {
		e.SetNotifyHandler(c.deliver)
	}
	return c, nil
}

// Name implements Engine.
func (c *Composite) Name() string { return CompositeName }

// Engines returns the configured engines in routing order.
func (c *Composite) Engines() []Engine { return slices.Clone(c.engines) }

// Registry is the composite's region table: with CompositeOptions.Registry, the only one of the node.
func (c *Composite) Registry() *Registry { return c.reg }

// Register implements Engine: every engine registers the region in turn, each adding its handles to what the
// ones before it produced; if one fails, the others are undone.
func (c *Composite) Register(ctx context.Context, desc MemoryDesc) (MemoryDesc, error) {
	if err := desc.Validate(); err != nil {
		return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
	}
	if desc.Node != c.opts.Node {
		return desc, fmt.Errorf("registering %s: %w: memory of node %q on node %q", desc.ID, ErrInvalid, desc.Node, c.opts.Node)
	}
	if c.shared {
		return c.registerShared(ctx, desc)
	}
	if _, _, err := c.reg.Lookup(desc.ID); err == nil {
		return desc, fmt.Errorf("registering %s: %w: id already registered", desc.ID, ErrInvalid)
	}
	merged := desc
	for i, e := range c.engines {
		next, err := e.Register(ctx, merged)
		if err != nil {
			c.undo(ctx, c.engines[:i], desc.ID)
			return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
		}
		merged = next
	}
	if err := c.reg.AddLocal(merged); err != nil {
		c.undo(ctx, c.engines, desc.ID)
		return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
	}
	return merged, nil
}

// registerShared registers with engines that share the registry: the id is reserved first, so a concurrent
// registration of it fails before any engine sets up state, and the region becomes usable only once every
// engine has filled its handles.
func (c *Composite) registerShared(ctx context.Context, desc MemoryDesc) (MemoryDesc, error) {
	if err := c.reg.reserve(desc.ID); err != nil {
		return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
	}
	merged := desc
	for i, e := range c.engines {
		next, err := e.Register(ctx, merged)
		if err != nil {
			c.abandon(ctx, c.engines[:i], merged)
			return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
		}
		merged = next
	}
	if err := c.reg.commit(merged); err != nil {
		c.abandon(ctx, c.engines, merged)
		return desc, fmt.Errorf("registering %s: %w", desc.ID, err)
	}
	return merged, nil
}

// abandon undoes a shared registration that failed: the engines that registered d release their state of it.
func (c *Composite) abandon(ctx context.Context, engs []Engine, d MemoryDesc) {
	c.reg.settle(d)
	c.undo(ctx, engs, d.ID)
	c.reg.forget(d.ID)
}

func (c *Composite) undo(ctx context.Context, engs []Engine, id MemoryID) {
	for _, e := range engs {
		_ = e.Deregister(ctx, id) // best effort: nothing was submitted against the region yet
	}
}

// Import implements Engine.
func (c *Composite) Import(ctx context.Context, desc MemoryDesc) error {
	if err := c.reg.AddRemote(desc); err != nil {
		return fmt.Errorf("importing %s: %w", desc.ID, err)
	}
	for i, e := range c.engines {
		if err := e.Import(ctx, desc); err != nil {
			c.undo(ctx, c.engines[:i], desc.ID)
			_ = c.reg.Remove(ctx, desc.ID)
			return fmt.Errorf("importing %s: %w", desc.ID, err)
		}
	}
	return nil
}

// Deregister implements Engine: every engine deregisters the region at once (each waits for, then cancels, its
// own transfers using it). The region stays known here until all of them succeeded, so it can be retried.
//
// With a shared registry the composite drains the region itself, across engines (it waits for, then cancels,
// every transfer using it, whichever engine runs it); only then does each engine release its own state of it,
// and the region is removed. If transfers do not stop (ErrBusy) the region stays pinned and no engine has
// released anything, so it can be retried.
func (c *Composite) Deregister(ctx context.Context, id MemoryID) error {
	if c.shared {
		return c.deregisterShared(ctx, id)
	}
	if _, _, err := c.reg.Lookup(id); err != nil {
		return fmt.Errorf("deregistering: %w", err)
	}
	errs := c.deregisterAll(ctx, id)
	c.mu.Lock()
	clear(c.routes)
	c.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deregistering %s: %w", id, err)
	}
	return c.reg.Remove(ctx, id)
}

func (c *Composite) deregisterShared(ctx context.Context, id MemoryID) error {
	if _, _, err := c.reg.Describe(id); err != nil {
		return fmt.Errorf("deregistering: %w", err)
	}
	if err := c.reg.Drain(ctx, id); err != nil {
		return err
	}
	if !c.reg.release(id) {
		return fmt.Errorf("deregistering %s: %w: deregistered concurrently", id, ErrUnknownMemory)
	}
	errs := c.deregisterAll(ctx, id)
	c.mu.Lock()
	clear(c.routes)
	c.mu.Unlock()
	c.reg.forget(id)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("deregistering %s: %w", id, err)
	}
	return nil
}

// deregisterAll deregisters id from every engine at once and returns their errors (unknown memory is none).
func (c *Composite) deregisterAll(ctx context.Context, id MemoryID) []error {
	errs := make([]error, len(c.engines))
	var wg sync.WaitGroup
	for i, e := range c.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := e.Deregister(ctx, id); err != nil && !errors.Is(err, ErrUnknownMemory) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errs
}

// CanHandle implements Engine: some engine claims the pair.
func (c *Composite) CanHandle(src, dst *MemoryDesc) (bool, string) {
	r := c.decide(src, dst)
	if r.engine < 0 {
		return false, (&UnplannableError{Src: src.ID, Dst: dst.ID, Refusals: r.refusals}).Error()
	}
	return true, ""
}

// decide asks every engine, in order, and refuses a pair two of them claim: disjointness is the composite's to
// enforce, not a property of how the agent wired its engines. Routes are cached, so this runs once per pair.
func (c *Composite) decide(src, dst *MemoryDesc) route {
	r := route{engine: -1}
	for i, e := range c.engines {
		ok, reason := e.CanHandle(src, dst)
		if !ok {
			if r.engine < 0 {
				r.refusals = append(r.refusals, Refusal{Engine: e.Name(), Reason: reason})
			}
			continue
		}
		if r.engine < 0 {
			r.engine = i
			continue
		}
		r.conflict = fmt.Sprintf("engines %s and %s both claim the pair; engines must be disjoint", c.engines[r.engine].Name(), e.Name())
		r.refusals = append(r.refusals, Refusal{Engine: CompositeName, Reason: r.conflict})
		r.engine = -1
		break
	}
	return r
}

// routeFor returns the cached route of a pair, deciding it on a miss.
func (c *Composite) routeFor(src, dst *MemoryDesc) route {
	key := [2]MemoryID{src.ID, dst.ID}
	c.mu.Lock()
	r, ok := c.routes[key]
	c.mu.Unlock()
	if ok {
		return r
	}
	r = c.decide(src, dst)
	c.mu.Lock()
	if len(c.routes) >= routeCacheLimit {
		clear(c.routes)
	}
	c.routes[key] = r
	c.mu.Unlock()
	return r
}

// Explanation is how the composite routes a pair.
type Explanation struct {
	Src, Dst  MemoryID
	Direction Direction
	// Engine is the engine that moves the pair; empty when none does.
	Engine string
	// Refusals are the reasons of every engine tried before Engine (all of them when Engine is empty).
	Refusals []Refusal
}

// Explain returns the engine chosen for a pair and every earlier engine's refusal. It bypasses the route cache.
func (c *Composite) Explain(src, dst MemoryID) (Explanation, error) {
	s, sLocal, err := c.reg.Lookup(src)
	if err != nil {
		return Explanation{}, fmt.Errorf("explaining %s -> %s: source: %w", src, dst, err)
	}
	d, dLocal, err := c.reg.Lookup(dst)
	if err != nil {
		return Explanation{}, fmt.Errorf("explaining %s -> %s: destination: %w", src, dst, err)
	}
	ex := Explanation{Src: src, Dst: dst}
	dir, ok := PairDirection(sLocal, dLocal)
	if !ok {
		ex.Refusals = []Refusal{{Engine: CompositeName, Reason: "neither region belongs to this node"}}
		return ex, nil
	}
	ex.Direction = dir
	r := c.decide(s, d)
	ex.Refusals = r.refusals
	if r.engine >= 0 {
		ex.Engine = c.engines[r.engine].Name()
	}
	return ex, nil
}

// SetNotifyHandler implements Engine; notifications from every engine reach fn.
func (c *Composite) SetNotifyHandler(fn NotifyFunc) { c.hook.set(fn) }

func (c *Composite) deliver(n Notification) { c.hook.deliver(n) }

// Close implements Engine.
func (c *Composite) Close() error {
	var errs []error
	for _, e := range c.engines {
		if err := e.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", e.Name(), err))
		}
	}
	if err := c.reg.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// NewPlan implements Engine.
func (c *Composite) NewPlan() PlanBuilder {
	return &compositePlanner{c: c, b: c.reg.getBatch()}
}

type compositePlanner struct {
	c      *Composite
	b      *batch
	out    PlanSet
	built  bool
	blocks compositeBlocks
}

func (p *compositePlanner) Add(it Item) error {
	if p.blocks.added {
		return p.reject(it, fmt.Errorf("planning: %w: a plan with a block batch takes no items", ErrInvalid), 0)
	}
	if p.built {
		return fmt.Errorf("planning: %w: Build already called", ErrInvalid)
	}
	if it.Size == 0 {
		p.out.Dropped = append(p.out.Dropped, it.Tag)
		return nil
	}
	i := p.b.pairOf(it.Src, it.Dst, func() pairInfo { return p.judgePair(it.Src, it.Dst) })
	pi := &p.b.pairs[i]
	if pi.err != nil {
		return p.reject(it, pi.err, pi.dir)
	}
	if err := CheckBounds(it, pi.srcSize, pi.dstSize); err != nil {
		return p.reject(it, err, pi.dir)
	}
	p.b.accept(i, it)
	return nil
}

// judgePair looks both regions up once, with their generations (which the plans of engines sharing the
// registry carry to Submit), and routes the pair.
func (p *compositePlanner) judgePair(srcID, dstID MemoryID) pairInfo {
	src, sLocal, srcGen, err := p.c.reg.lookup(srcID)
	if err != nil {
		return pairInfo{err: fmt.Errorf("source: %w", err)}
	}
	dst, dLocal, dstGen, err := p.c.reg.lookup(dstID)
	if err != nil {
		return pairInfo{err: fmt.Errorf("destination: %w", err)}
	}
	dir, ok := PairDirection(sLocal, dLocal)
	if !ok {
		return pairInfo{err: &UnplannableError{Src: srcID, Dst: dstID,
			Refusals: []Refusal{{Engine: CompositeName, Reason: "neither region belongs to this node"}}}}
	}
	info := pairInfo{dir: dir, srcSize: src.Size, dstSize: dst.Size, srcGen: srcGen, dstGen: dstGen}
	r := p.c.routeFor(src, dst)
	if r.engine < 0 {
		info.err = &UnplannableError{Src: srcID, Dst: dstID, Refusals: r.refusals}
	}
	info.engine = r.engine
	return info
}

func (p *compositePlanner) reject(it Item, err error, dir Direction) error {
	ie := &ItemError{Item: it, Err: err}
	p.out.Rejected = append(p.out.Rejected, ie)
	if m := p.c.opts.Metrics; m != nil {
		m.rejected(dir, it.Size)
	}
	return ie
}

func (p *compositePlanner) Build() *PlanSet {
	out := &p.out
	out.owner = p.c
	if p.built {
		return &PlanSet{owner: p.c}
	}
	p.built = true
	if p.blocks.added {
		p.buildBlocks(out)
		p.c.reg.putBatch(p.b)
		p.b = nil
		return out
	}
	if len(p.b.entries) == 0 {
		return out
	}
	// Overlap is checked across engines: two engines may write one destination.
	p.b.intern()
	p.b.rejectOverlaps(func(it Item, err error) {
		p.reject(it, err, p.b.pairs[p.b.index[[2]MemoryID{it.Src, it.Dst}]].dir)
	})
	if p.c.shared {
		// The batch is checked: it is planned here, once, for every engine.
		p.b.groupByPair()
		p.planParts(out)
		p.c.reg.putBatch(p.b)
		p.b = nil
		return out
	}
	// Items go to their engine's planner without an intermediate copy. Plans come out in the order their pairs
	// were first added, so several pairs go back to that order; one pair stays in destination order, which the
	// planner's own sort then finds already done.
	if len(p.b.pairs) > 1 {
		p.b.sortBySeq()
	}
	builders := make([]PlanBuilder, len(p.c.engines))
	for i := range p.b.entries {
		e := &p.b.entries[i]
		eng := p.b.pairs[e.pair].engine
		if builders[eng] == nil {
			builders[eng] = p.c.engines[eng].NewPlan()
		}
		_ = builders[eng].Add(p.b.item(e)) // a refusal is recorded in the part's Rejected
	}
	p.c.reg.putBatch(p.b)
	p.b = nil
	for _, b := range builders {
		if b == nil {
			continue
		}
		p.addPart(out, b.Build())
	}
	return out
}

// planParts builds each engine's plan set from the checked batch (entries grouped by pair, pairs in the order
// they were first added, each pair's entries in destination order) with that engine's limits: parts in
// engine order, plans of a part in pair order, as the engines' own planners would have made them.
func (p *compositePlanner) planParts(out *PlanSet) {
	var parts [4]*PlanSet // at most one engine of each kind
	p.b.eachPair(func(es []entry) {
		info := &p.b.pairs[es[0].pair]
		part := parts[info.engine]
		if part == nil {
			part = p.c.newPart(info.engine)
			parts[info.engine] = part
		}
		planPair(part, part.planner, p.c.limits[info.engine], info, es)
	})
	for _, part := range parts[:len(p.c.engines)] {
		if part != nil {
			p.addPart(out, part)
		}
	}
}

// newPart returns an empty plan set of engine eng, submittable to it.
func (c *Composite) newPart(eng int) *PlanSet {
	return &PlanSet{owner: c.reg, planner: c.engines[eng].Name()}
}

func (p *compositePlanner) addPart(out *PlanSet, part *PlanSet) {
	if out.parts == nil {
		out.parts = out.onePart[:0]
	}
	out.parts = append(out.parts, part)
	if len(out.Plans) == 0 {
		// The first part's plans as they are (nothing writes a planned set's plans); a later part's are appended
		// to a copy, the capacity being cut to the length.
		out.Plans = part.Plans[:len(part.Plans):len(part.Plans)]
	} else {
		out.Plans = append(out.Plans, part.Plans...)
	}
	out.Rejected = append(out.Rejected, part.Rejected...)
	out.Dropped = append(out.Dropped, part.Dropped...)
}

// Submit implements Engine: each engine's part is submitted to it.
func (c *Composite) Submit(ctx context.Context, ps *PlanSet, opts SubmitOptions) (Transfer, error) {
	if ps == nil || ps.owner != any(c) {
		return nil, fmt.Errorf("submitting: %w", ErrForeignPlan)
	}
	ct := &compositeTransfer{plans: ps.Plans, done: make(chan struct{}), metrics: c.opts.Metrics}
	// One count per part plus one for this function, so the transfer completes only once every part is known.
	ct.remaining.Store(int64(len(ps.parts)) + 1)
	// A transfer of one part (one engine), the usual one, keeps its part and the part's once inline.
	ct.onces = ct.one.once[:]
	if len(ps.parts) > 1 {
		ct.subs, ct.onces = make([]Transfer, len(ps.parts)), make([]sync.Once, len(ps.parts))
	} else {
		ct.subs = ct.one.sub[:len(ps.parts)]
	}
	for i, part := range ps.parts {
		opts.onDone, opts.onDonePart = ct, i
		var sub Transfer
		var err error
		if e := c.engineNamed(partEngine(part)); e == nil {
			err = fmt.Errorf("%w: engine %q is not configured", ErrInvalid, partEngine(part))
		} else {
			sub, err = e.Submit(ctx, part, opts)
		}
		if err != nil {
			sub = failedTransfer(len(part.Plans), err)
		}
		ct.subs[i] = sub
		if _, tracked := sub.(*Tracker); !tracked {
			// Transfers that may not call the hook are watched instead.
			go func() { <-sub.Done(); ct.partFinished(i) }()
		}
	}
	ct.partDone()
	return ct, nil
}

// pinnedIDs is an engine (or an engine's backend) that hands out block-id buffers its GPU kernels read in place.
type pinnedIDs interface {
	PinnedIDs(n int) ([]uint32, func())
}

// PinnedIDs returns a buffer for n block ids that an engine's kernels read in place, sparing them a copy, and
// what gives it back once the transfer that used it settled; nil when no engine has one (use any memory).
func (c *Composite) PinnedIDs(n int) ([]uint32, func()) {
	for _, e := range c.engines {
		if p, ok := e.(pinnedIDs); ok {
			if ids, free := p.PinnedIDs(n); ids != nil {
				return ids, free
			}
		}
	}
	return nil, nil
}

func partEngine(ps *PlanSet) string {
	if len(ps.Plans) == 0 {
		return ""
	}
	return ps.Plans[0].Engine
}

func (c *Composite) engineNamed(name string) Engine {
	for _, e := range c.engines {
		if e.Name() == name {
			return e
		}
	}
	return nil
}

// compositeTransfer joins the transfers of each engine's part.
type compositeTransfer struct {
	plans     []Plan
	subs      []Transfer
	onces     []sync.Once // per part: its end counted once
	metrics   *Metrics
	remaining atomic.Int64
	one       struct { // the part of a transfer of one part, and its once (Submit)
		sub  [1]Transfer
		once [1]sync.Once
	}

	done     chan struct{}
	outcomes []Outcome
	result   error
}

// partFinished counts part i's end (once, whoever reports it).
func (t *compositeTransfer) partFinished(i int) { t.onces[i].Do(t.partDone) }

func (t *compositeTransfer) partDone() {
	if t.remaining.Add(-1) != 0 {
		return
	}
	if len(t.subs) == 1 {
		t.outcomes = t.subs[0].Outcomes() // settled, so no longer written: shared rather than copied
	} else {
		for _, s := range t.subs {
			t.outcomes = append(t.outcomes, s.Outcomes()...)
		}
	}
	var failures []Failure
	for i, o := range t.outcomes {
		p := &t.plans[i]
		if o.Err != nil {
			failures = append(failures, Failure{Engine: p.Engine, Plan: i, Src: p.Src, Dst: p.Dst, Tags: p.Tags, Err: o.Err})
		}
		if t.metrics != nil {
			t.metrics.plan(p, o)
		}
	}
	if len(failures) > 0 {
		t.result = &TransferError{Failures: failures}
	}
	close(t.done)
}

func (t *compositeTransfer) Done() <-chan struct{} { return t.done }

// Drive implements Driven: each part the waiting goroutine can advance is driven in turn.
func (t *compositeTransfer) Drive(ctx context.Context) bool {
	for _, sub := range t.subs {
		if d, ok := sub.(Driven); ok && !d.Drive(ctx) {
			return false
		}
	}
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// DriveLanded implements LandedDriven for a transfer of one part whose transfer does (the waited block copy);
// any other is driven without telling l: its parts land apart.
func (t *compositeTransfer) DriveLanded(ctx context.Context, l Lander) (done, landed bool) {
	if len(t.subs) == 1 {
		if ld, ok := t.subs[0].(LandedDriven); ok {
			if _, landed = ld.DriveLanded(ctx, l); landed {
				<-t.done // the part's end is counted before its regions are unpinned: microseconds
				return true, true
			}
		}
	}
	return t.Drive(ctx), false
}

func (t *compositeTransfer) Wait(ctx context.Context) error {
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
		return fmt.Errorf("waiting for transfer: %w", ctx.Err())
	}
}

func (t *compositeTransfer) Cancel() {
	for _, s := range t.subs {
		s.Cancel()
	}
}

func (t *compositeTransfer) Outcomes() []Outcome {
	select {
	case <-t.done:
		return t.outcomes
	default:
		return nil
	}
}

// failedTransfer is a transfer whose n plans all failed with err before starting.
func failedTransfer(n int, err error) Transfer {
	t := &compositeTransfer{done: make(chan struct{})}
	for range n {
		t.outcomes = append(t.outcomes, Outcome{Err: err})
	}
	close(t.done)
	return t
}
