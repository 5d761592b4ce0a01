// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// DefaultGrace is how long Deregister and Close wait for cancelled copies to stop before giving up with ErrBusy.
const DefaultGrace = 10 * time.Second

// Registry holds regions (local and imported), pins them while transfers use them, and implements the
// Deregister rule of the contract. In the agent there is one, owned by the composite and shared by every
// engine (see Regions); an engine running alone keeps its own. It is safe for concurrent use.
type Registry struct {
	self  string
	grace time.Duration

	mu       sync.Mutex
	regions  map[MemoryID]*region
	lastGen  uint64
	closed   bool
	trackers map[*Tracker]struct{}
	// closedEngines are engines closed on a shared registry: their submissions are refused, the others' not.
	closedEngines map[string]bool

	handoffs handoffs // waited transfers not yet driven

	// batches recycles planners' working memory: a batch of tens of thousands of KV blocks needs megabytes,
	// and fresh pages for every plan cost more than the planning itself.
	batches sync.Pool // *batch
}

type region struct {
	desc     MemoryDesc
	local    bool
	gen      uint64
	draining bool
	// reserved: the id is taken while the composite's engines register the memory; the region is not usable
	// (draining is set too) and Describe does not find it.
	reserved bool
	// releasing: drained, and the composite's engines are releasing their state of it (see release).
	releasing bool
	pins      int
	users     map[*Tracker]int
	idle      chan struct{} // made when draining starts with pins > 0; closed when pins reaches 0
}

// NewRegistry returns an empty registry for the node named self. grace bounds how long cancelled copies may
// take to stop (DefaultGrace when zero).
func NewRegistry(self string, grace time.Duration) *Registry {
	if grace <= 0 {
		grace = DefaultGrace
	}
	return &Registry{self: self, grace: grace, regions: map[MemoryID]*region{}, trackers: map[*Tracker]struct{}{}}
}

// Self is the name of the node this registry belongs to.
func (r *Registry) Self() string { return r.self }

// AddLocal validates and adds memory owned by this node.
func (r *Registry) AddLocal(d MemoryDesc) error {
	if d.Node != r.self {
		return fmt.Errorf("registering memory %s: %w: it belongs to node %q, this is %q", d.ID, ErrInvalid, d.Node, r.self)
	}
	return r.add(d, true)
}

// AddRemote validates and adds another node's memory. Process-local handles are refused: they mean nothing here.
func (r *Registry) AddRemote(d MemoryDesc) error {
	if d.Node == r.self {
		return fmt.Errorf("importing memory %s: %w: it belongs to this node; register it instead", d.ID, ErrInvalid)
	}
	if d.Handles.Ptr != 0 || d.Handles.Host != nil || d.Handles.VMM != nil {
		return fmt.Errorf("importing memory %s: %w: carries process-local handles", d.ID, ErrInvalid)
	}
	return r.add(d, false)
}

// owned validates d and returns it with the handles it shares with the caller copied.
func owned(d MemoryDesc) (MemoryDesc, error) {
	if err := d.Validate(); err != nil {
		return d, err
	}
	d.Handles.RDMA = append([]RDMAKey(nil), d.Handles.RDMA...)
	d.Handles.IPC = append([]byte(nil), d.Handles.IPC...)
	if len(d.Handles.IPC) == 0 {
		d.Handles.IPC = nil
	}
	if f := d.Handles.Fabric; f != nil {
		c := *f
		d.Handles.Fabric = &c
	}
	return d, nil
}

func (r *Registry) add(d MemoryDesc, local bool) error {
	d, err := owned(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if _, ok := r.regions[d.ID]; ok {
		return fmt.Errorf("adding memory %s: %w: id already registered", d.ID, ErrInvalid)
	}
	r.lastGen++
	r.regions[d.ID] = &region{desc: d, local: local, gen: r.lastGen, users: map[*Tracker]int{}}
	return nil
}

// reserve takes an id for a local region whose descriptor is not known yet (the composite's engines are
// registering it), so that a concurrent registration of the same id fails before any engine sets up state.
func (r *Registry) reserve(id MemoryID) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if _, ok := r.regions[id]; ok {
		return fmt.Errorf("adding memory %s: %w: id already registered", id, ErrInvalid)
	}
	r.regions[id] = &region{desc: MemoryDesc{ID: id}, local: true, draining: true, reserved: true, users: map[*Tracker]int{}}
	return nil
}

// commit turns a reservation into the registered region d (validated like AddLocal).
func (r *Registry) commit(d MemoryDesc) error {
	if d.Node != r.self {
		return fmt.Errorf("registering memory %s: %w: it belongs to node %q, this is %q", d.ID, ErrInvalid, d.Node, r.self)
	}
	d, err := owned(d)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.regions[d.ID]
	if !ok || !g.reserved {
		return fmt.Errorf("registering memory %s: %w: not reserved", d.ID, ErrInvalid)
	}
	if r.closed {
		return ErrClosed
	}
	r.lastGen++
	g.desc, g.gen, g.reserved, g.draining = d, r.lastGen, false, false
	return nil
}

// settle turns a reservation into a region that is being removed, described by d: the registration failed
// after some engines set up state for it, which their Deregister releases (it finds d with Describe); forget
// removes it then.
func (r *Registry) settle(d MemoryDesc) {
	r.mu.Lock()
	if g, ok := r.regions[d.ID]; ok && g.reserved {
		g.desc, g.reserved = d, false
	}
	r.mu.Unlock()
}

// Lookup returns a region's descriptor (shared: do not modify it) and whether it is local. Regions being
// deregistered are reported as unknown.
func (r *Registry) Lookup(id MemoryID) (*MemoryDesc, bool, error) {
	d, local, _, err := r.lookup(id)
	return d, local, err
}

func (r *Registry) lookup(id MemoryID) (*MemoryDesc, bool, uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.regions[id]
	if !ok || g.draining {
		return nil, false, 0, fmt.Errorf("memory %s: %w", id, ErrUnknownMemory)
	}
	return &g.desc, g.local, g.gen, nil
}

// Describe is Lookup that also finds regions being deregistered (for the engine's own Deregister, which may be
// called again after ErrBusy).
func (r *Registry) Describe(id MemoryID) (*MemoryDesc, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.regions[id]
	if !ok || g.reserved {
		return nil, false, fmt.Errorf("memory %s: %w", id, ErrUnknownMemory)
	}
	return &g.desc, g.local, nil
}

// Pin keeps a region registered until unpin is called; engines pin regions that a peer's request touches (the
// serving side of a remote read or write). Deregister waits for pins.
func (r *Registry) Pin(id MemoryID) (d *MemoryDesc, unpin func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.regions[id]
	if !ok || g.draining {
		return nil, nil, fmt.Errorf("memory %s: %w", id, ErrUnknownMemory)
	}
	g.pins++
	var once sync.Once
	return &g.desc, func() { once.Do(func() { r.unpin(g) }) }, nil
}

// releaseTracker unpins a settled transfer's regions and forgets it, under one hold of the lock.
func (r *Registry) releaseTracker(t *Tracker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range t.pinned {
		r.unpinLocked(g, t)
	}
	delete(r.trackers, t)
}

// unpin drops one pin of g that Pin took. Caller must not hold r.mu.
func (r *Registry) unpin(g *region) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unpinLocked(g, nil)
}

// unpinLocked drops one pin of g (held by t, when t is not nil); r.mu is held.
func (r *Registry) unpinLocked(g *region, t *Tracker) {
	g.pins--
	if t != nil {
		if g.users[t]--; g.users[t] <= 0 {
			delete(g.users, t)
		}
	}
	if g.pins == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// Remove deregisters a region following the contract: refuse new work, wait for in-flight work until ctx ends,
// then cancel it with ErrDeregistered and wait up to the grace period; ErrBusy if copies still run.
func (r *Registry) Remove(ctx context.Context, id MemoryID) error {
	if err := r.Drain(ctx, id); err != nil {
		return err
	}
	r.forget(id)
	return nil
}

// release marks a drained region as having its engines' state released, and reports whether this caller is
// the one to do it (two Deregisters at once must not release it twice).
func (r *Registry) release(id MemoryID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.regions[id]
	if !ok || !g.draining || g.reserved || g.releasing || g.pins > 0 {
		return false
	}
	g.releasing = true
	return true
}

// forget deletes a drained region.
func (r *Registry) forget(id MemoryID) {
	r.mu.Lock()
	if g, ok := r.regions[id]; ok && g.draining && !g.reserved {
		delete(r.regions, id)
	}
	r.mu.Unlock()
}

// Drain is Remove without the removal: once it returns nil no transfer uses the region and none can start,
// but Describe still finds it. The composite drains a shared region, lets each engine release its own state
// of it, then removes it; an engine's own Deregister on a shared registry drains (at once, when the
// composite did).
func (r *Registry) Drain(ctx context.Context, id MemoryID) error {
	r.mu.Lock()
	g, ok := r.regions[id]
	if !ok || g.reserved {
		r.mu.Unlock()
		return fmt.Errorf("deregistering memory %s: %w", id, ErrUnknownMemory)
	}
	g.draining = true
	idle := r.idleLocked(g)
	r.mu.Unlock()

	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			cause := fmt.Errorf("%w: memory %s", ErrDeregistered, id)
			r.mu.Lock()
			users := make([]*Tracker, 0, len(g.users))
			for t := range g.users {
				users = append(users, t)
			}
			idle = r.idleLocked(g)
			r.mu.Unlock()
			for _, t := range users {
				t.cancel(cause)
			}
			if idle != nil {
				timer := time.NewTimer(r.grace)
				defer timer.Stop()
				select {
				case <-idle:
				case <-timer.C:
					return fmt.Errorf("deregistering memory %s: %w: copies did not stop within %v of cancellation",
						id, ErrBusy, r.grace)
				}
			}
		}
	}
	return nil
}

// idleLocked returns a channel closed when g has no pins, or nil when it has none now.
func (r *Registry) idleLocked(g *region) chan struct{} {
	if g.pins == 0 {
		return nil
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	return g.idle
}

// Close refuses new work, cancels every transfer in flight with ErrClosed and waits up to the grace period for
// them to finish.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	active := make([]*Tracker, 0, len(r.trackers))
	for t := range r.trackers {
		active = append(active, t)
	}
	r.mu.Unlock()
	return r.stop(active)
}

// CloseEngine is Close for one engine of a shared registry: that engine's submissions are refused from now
// on, its transfers in flight are cancelled with ErrClosed and waited for; the regions and the other engines'
// transfers stay.
func (r *Registry) CloseEngine(engine string) error {
	r.mu.Lock()
	if r.closed || r.closedEngines[engine] {
		r.mu.Unlock()
		return nil
	}
	if r.closedEngines == nil {
		r.closedEngines = map[string]bool{}
	}
	r.closedEngines[engine] = true
	var active []*Tracker
	for t := range r.trackers {
		if t.engine == engine {
			active = append(active, t)
		}
	}
	r.mu.Unlock()
	return r.stop(active)
}

// stop cancels the given transfers with ErrClosed and waits up to the grace period for them.
func (r *Registry) stop(active []*Tracker) error {
	for _, t := range active {
		t.cancel(ErrClosed)
	}
	timer := time.NewTimer(r.grace)
	defer timer.Stop()
	for _, t := range active {
		select {
		case <-t.done:
		case <-timer.C:
			return fmt.Errorf("closing: %w: transfers did not stop within %v", ErrBusy, r.grace)
		}
	}
	return nil
}

// Work is one plan of a submission that passed validation: the engine executes it and reports with
// Tracker.Finish(Index, err). Src and Dst stay registered until the tracker is done.
type Work struct {
	Index    int
	Plan     *Plan
	Src, Dst *MemoryDesc
}

// Begin starts a submission of a plan set planned by this registry's planner. It checks every plan's regions
// (still registered, same registration as at planning), pins them for the life of the transfer, and returns
// the tracker plus the plans to execute. Plans that fail the checks are already finished in the tracker.
// finalize, when not nil, runs once after the last plan finished and before Done closes (with the tracker's
// context still live); it may set errors in outcomes, e.g. when a notification could not be delivered.
func (r *Registry) Begin(ctx context.Context, engine string, ps *PlanSet, opts SubmitOptions,
	finalize func(ctx context.Context, outcomes []Outcome)) (*Tracker, []Work, error) {
	if ps == nil || ps.owner != any(r) || ps.planner != engine {
		return nil, nil, fmt.Errorf("submitting to %s: %w", engine, ErrForeignPlan)
	}
	if len(opts.Notify) > MaxNotifyPayload {
		return nil, nil, fmt.Errorf("submitting to %s: %w: notification of %d bytes, at most %d",
			engine, ErrInvalid, len(opts.Notify), MaxNotifyPayload)
	}
	if opts.Timeout < 0 {
		return nil, nil, fmt.Errorf("submitting to %s: %w: negative timeout", engine, ErrInvalid)
	}
	t := newTracker(ctx, engine, ps.Plans, opts, finalize)
	t.handoffs = &r.handoffs
	var work []Work
	if len(ps.Plans) == 1 {
		t.pinned, work = t.one.pinned[:0], t.one.work[:0]
	} else {
		t.pinned, work = make([]*region, 0, 2*len(ps.Plans)), make([]Work, 0, len(ps.Plans))
	}
	var refused []int
	var refusedErr []error

	r.mu.Lock()
	if r.closed || r.closedEngines[engine] {
		r.mu.Unlock()
		t.cancel(ErrClosed)
		return nil, nil, fmt.Errorf("submitting to %s: %w", engine, ErrClosed)
	}
	r.trackers[t] = struct{}{}
	for i := range ps.Plans {
		p := &ps.Plans[i]
		src, errSrc := r.checkLocked(p.Src, p.srcGen)
		dst, errDst := r.checkLocked(p.Dst, p.dstGen)
		if errSrc != nil || errDst != nil {
			refused = append(refused, i)
			refusedErr = append(refusedErr, firstErr(errSrc, errDst))
			continue
		}
		for _, g := range []*region{src, dst} {
			g.pins++
			g.users[t]++
			t.pinned = append(t.pinned, g)
		}
		work = append(work, Work{Index: i, Plan: p, Src: &src.desc, Dst: &dst.desc})
	}
	r.mu.Unlock()

	t.reg = r
	for k, i := range refused {
		t.Finish(i, refusedErr[k])
	}
	t.arm()
	return t, work, nil
}

func (r *Registry) checkLocked(id MemoryID, gen uint64) (*region, error) {
	g, ok := r.regions[id]
	if !ok || g.draining {
		return nil, fmt.Errorf("memory %s: %w", id, ErrUnknownMemory)
	}
	if g.gen != gen {
		return nil, fmt.Errorf("memory %s: %w: registered again since planning; plan again", id, ErrUnknownMemory)
	}
	return g, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
