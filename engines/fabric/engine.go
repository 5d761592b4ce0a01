// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// ErrNotExportable: the allocation holding a region was not created with the
// fabric handle type, so no other node can map it.
var ErrNotExportable = errors.New("memory is not fabric-exportable")

// Options configure the engine.
type Options struct {
	// Node is this node's name.
	Node string
	// Runtime is the GPU side (required).
	Runtime Runtime
	// Notifier carries notifications to the destination node of a write;
	// without it a submission asking for one fails its remote plans.
	Notifier engines.NotifySender
	// Workers is how many plans run at once (default 4).
	Workers int
	// Grace bounds how long Deregister and Close wait for cancelled copies.
	Grace time.Duration
	// Registry, when set, is the composite's region table, shared by every engine of the node (see
	// engines.Regions); nil gives the engine one of its own.
	Registry *engines.Registry
}

// Engine is the fabric engine.
type Engine struct {
	*engines.Base
	opts        Options
	reg         engines.Regions
	slots       *engines.Slots
	available   bool
	unavailable string

	mu       sync.Mutex
	local    map[engines.MemoryID]localRegion
	notExp   map[engines.MemoryID]string // local regions that could not be exported, and why
	mappings map[engines.MemoryID]*mapping
}

type localRegion struct {
	addr uint64
	gpu  int
}

// mapping is a remote allocation mapped for one local GPU.
type mapping struct {
	once  sync.Once
	gpu   int
	base  uint64
	unmap func() error
	err   error
}

var _ engines.Engine = (*Engine)(nil)

// New returns the engine; when the runtime says fabric handles do not work
// here, the engine still registers memory but claims no pair, and says why.
func New(opts Options) (*Engine, error) {
	if opts.Node == "" || opts.Runtime == nil {
		return nil, fmt.Errorf("fabric engine: %w: node name and runtime required", engines.ErrInvalid)
	}
	if opts.Workers <= 0 {
		opts.Workers = 4
	}
	reg, err := engines.NewRegions(engines.EngineFabric, opts.Registry, opts.Node, opts.Grace)
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, reg: reg, slots: engines.NewSlots(opts.Workers),
		local: map[engines.MemoryID]localRegion{}, notExp: map[engines.MemoryID]string{}, mappings: map[engines.MemoryID]*mapping{}}
	e.available, e.unavailable = opts.Runtime.Available()
	// No limits: a plan is one copy call per segment.
	e.Base = engines.NewBase(engines.EngineFabric, reg, engines.Limits{}, e.CanHandle)
	return e, nil
}

// Available reports whether the engine moves bytes on this node, and why not.
func (e *Engine) Available() (bool, string) { return e.available, e.unavailable }

// Register implements engines.Engine: local GPU memory gets its fabric
// handle; memory that cannot have one is registered without it (and pairs
// that need it are refused with the reason).
func (e *Engine) Register(ctx context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error) {
	if desc.Node != e.opts.Node {
		return desc, fmt.Errorf("fabric: registering %s: %w: memory of node %q on node %q", desc.ID, engines.ErrInvalid, desc.Node, e.opts.Node)
	}
	if err := desc.Validate(); err != nil {
		return desc, fmt.Errorf("fabric: registering %s: %w", desc.ID, err)
	}
	out := desc
	var lr *localRegion
	why := ""
	switch {
	case desc.Location.Kind != engines.LocationGPU:
		why = "host memory is not on the scale-up fabric"
	case !e.available:
		why = "fabric unavailable on this node: " + e.unavailable
	case desc.Handles.VMM != nil && len(desc.Handles.VMM.FDs) > 1:
		// Another node would have to import and map every allocation: thousands of handles in each descriptor
		// for a large KV cache. Such memory moves through this node's own mapping instead.
		why = fmt.Sprintf("memory spans %d VMM allocations (expandable segments): cross-node fabric export of multi-allocation regions is not supported (the descriptor would need a fabric handle per allocation)",
			len(desc.Handles.VMM.FDs))
	default:
		addr, gpu, err := e.opts.Runtime.Local(&desc)
		if err != nil {
			why = "not addressable in this process: " + err.Error()
			break
		}
		lr = &localRegion{addr: addr, gpu: gpu}
		if desc.Handles.Fabric == nil {
			h, err := e.opts.Runtime.Export(&desc)
			if err != nil {
				why = err.Error()
				break
			}
			if h.Offset+desc.Size > h.AllocSize || h.Offset+desc.Size < h.Offset {
				return desc, fmt.Errorf("fabric: registering %s: %w: region [%d, +%d) outside its allocation of %d bytes",
					desc.ID, engines.ErrInvalid, h.Offset, desc.Size, h.AllocSize)
			}
			out.Handles.Fabric = &h
		}
	}
	if err := e.reg.AddLocal(out); err != nil {
		return desc, fmt.Errorf("fabric: registering %s: %w", desc.ID, err)
	}
	e.mu.Lock()
	if lr != nil {
		e.local[desc.ID] = *lr
	}
	if why != "" {
		e.notExp[desc.ID] = why
	}
	e.mu.Unlock()
	return out, nil
}

// Deregister implements engines.Engine: once no copy uses the region, its
// mapping (if any) is undone.
func (e *Engine) Deregister(ctx context.Context, id engines.MemoryID) error {
	if err := e.reg.Remove(ctx, id); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	e.mu.Lock()
	m := e.mappings[id]
	delete(e.mappings, id)
	delete(e.local, id)
	delete(e.notExp, id)
	e.mu.Unlock()
	if m != nil {
		m.once.Do(func() {}) // a mapping being made finishes first
		if m.err == nil && m.unmap != nil {
			if err := m.unmap(); err != nil {
				return fmt.Errorf("fabric: deregistered %s, unmapping it: %w", id, err)
			}
		}
	}
	return nil
}

// CanHandle implements engines.Engine.
func (e *Engine) CanHandle(src, dst *engines.MemoryDesc) (bool, string) {
	if ok, why := Claims(e.opts.Node, src, dst); !ok {
		return false, why
	}
	if !e.available {
		return false, "fabric unavailable on this node: " + e.unavailable
	}
	local := src
	if dst.Node == e.opts.Node {
		local = dst
	}
	e.mu.Lock()
	_, mapped := e.local[local.ID]
	why := e.notExp[local.ID]
	e.mu.Unlock()
	if !mapped {
		if why == "" {
			why = "not registered with the fabric engine"
		}
		return false, fmt.Sprintf("%s: %s", local.ID, why)
	}
	return true, ""
}

// Claims is the fabric engine's pair rule on descriptors alone: GPU memory
// on two nodes of one fabric domain, one of them self, the remote one
// carrying a fabric handle. Other engines use it to stay disjoint.
func Claims(self string, src, dst *engines.MemoryDesc) (bool, string) {
	if src.Node == dst.Node {
		return false, "both regions on node " + src.Node + " (the same-node engine's pair)"
	}
	if src.Node != self && dst.Node != self {
		return false, "neither region belongs to this node"
	}
	for _, d := range []*engines.MemoryDesc{src, dst} {
		if d.Location.Kind != engines.LocationGPU {
			return false, fmt.Sprintf("%s is host memory, which is not on the scale-up fabric", d.ID)
		}
		if d.FabricDomain == "" {
			return false, fmt.Sprintf("%s is on a GPU outside any fabric domain", d.ID)
		}
	}
	if src.FabricDomain != dst.FabricDomain {
		return false, fmt.Sprintf("different fabric domains (%s in %s, %s in %s)", src.ID, src.FabricDomain, dst.ID, dst.FabricDomain)
	}
	remote := src
	if src.Node == self {
		remote = dst
	}
	if remote.Handles.Fabric == nil {
		return false, fmt.Sprintf("%s is not fabric-exportable (its allocation was not created with a fabric handle type)", remote.ID)
	}
	return true, ""
}

// Submit implements engines.Engine.
func (e *Engine) Submit(ctx context.Context, ps *engines.PlanSet, opts engines.SubmitOptions) (engines.Transfer, error) {
	var finalize func(context.Context, []engines.Outcome)
	if opts.Notify != nil {
		payload := append([]byte(nil), opts.Notify...)
		finalize = func(ctx context.Context, outcomes []engines.Outcome) { e.notifyAll(ctx, ps.Plans, outcomes, payload) }
	}
	t, work, err := e.reg.Begin(ctx, e.Name(), ps, opts, finalize)
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	if len(work) > 0 {
		go e.run(t, work)
	}
	return t, nil
}

func (e *Engine) run(t *engines.Tracker, work []engines.Work) {
	engines.RunPlans(t, work, e.slots, func(ctx context.Context, w engines.Work) error {
		if err := e.copyPlan(ctx, w); err != nil {
			return fmt.Errorf("fabric copy %s -> %s: %w", w.Plan.Src, w.Plan.Dst, err)
		}
		return nil
	})
}

func (e *Engine) copyPlan(ctx context.Context, w engines.Work) error {
	local, remote := w.Src, w.Dst
	if w.Plan.Direction == engines.DirRead {
		local, remote = w.Dst, w.Src
	}
	e.mu.Lock()
	lr, ok := e.local[local.ID]
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s is not mapped by the fabric engine", engines.ErrUnknownMemory, local.ID)
	}
	rbase, err := e.remoteBase(lr.gpu, remote)
	if err != nil {
		return err
	}
	srcBase, dstBase := lr.addr, rbase
	if w.Plan.Direction == engines.DirRead {
		srcBase, dstBase = rbase, lr.addr
	}
	segs := make([]Segment, len(w.Plan.Segments))
	for i, s := range w.Plan.Segments {
		segs[i] = Segment{Src: srcBase + s.SrcOffset, Dst: dstBase + s.DstOffset, Size: s.Size}
	}
	return e.opts.Runtime.Copy(ctx, lr.gpu, segs)
}

// MappedRegions is how many remote regions are mapped (imported through their fabric handles) and kept for
// reuse: the agent's fabricxfer_agent_fabric_mapped_regions.
func (e *Engine) MappedRegions() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.mappings)
}

// remoteBase maps the remote region's allocation (once) and returns the
// address of the region's first byte.
func (e *Engine) remoteBase(gpu int, remote *engines.MemoryDesc) (uint64, error) {
	e.mu.Lock()
	m, ok := e.mappings[remote.ID]
	if !ok {
		m = &mapping{gpu: gpu}
		e.mappings[remote.ID] = m
	}
	e.mu.Unlock()
	m.once.Do(func() {
		m.base, m.unmap, m.err = e.opts.Runtime.Map(gpu, *remote.Handles.Fabric)
	})
	if m.err != nil {
		// A failed import is not cached: the exporter may come back.
		e.mu.Lock()
		if e.mappings[remote.ID] == m {
			delete(e.mappings, remote.ID)
		}
		e.mu.Unlock()
		return 0, fmt.Errorf("mapping %s's fabric handle: %w", remote.ID, m.err)
	}
	if m.gpu != gpu {
		return 0, fmt.Errorf("%s is mapped for GPU %d, not GPU %d", remote.ID, m.gpu, gpu)
	}
	return m.base + remote.Handles.Fabric.Offset, nil
}

// notifyAll delivers a successful submission's notifications: writes to the
// remote node through the Notifier, reads (which land here) to this node's
// handler. A notification that cannot be delivered fails its plans.
func (e *Engine) notifyAll(ctx context.Context, plans []engines.Plan, outcomes []engines.Outcome, payload []byte) {
	engines.NotifyDestinations(ctx, e.opts.Node, e.reg.Registry, plans, outcomes, payload, e.Deliver,
		func(ctx context.Context, node string, _ *engines.Plan, n engines.Notification) error {
			if e.opts.Notifier == nil {
				return errors.New("no channel to the destination node")
			}
			return e.opts.Notifier.SendNotification(ctx, node, n)
		})
}

// Close implements engines.Engine: cancels transfers, then undoes every mapping.
func (e *Engine) Close() error {
	err := e.reg.Close()
	e.mu.Lock()
	ms := e.mappings
	e.mappings = map[engines.MemoryID]*mapping{}
	e.mu.Unlock()
	errs := []error{err}
	for id, m := range ms {
		m.once.Do(func() {})
		if m.err == nil && m.unmap != nil {
			if err := m.unmap(); err != nil {
				errs = append(errs, fmt.Errorf("unmapping %s: %w", id, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("fabric: %w", err)
	}
	return nil
}
