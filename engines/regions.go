// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"fmt"
	"time"
)

// Regions is an engine's region table: the Registry it plans, submits and pins against. An engine running alone
// owns it; in the agent every engine is given the composite's registry (the engine's Options.Registry) and the
// table is shared: the composite alone adds and removes regions and waits for in-flight transfers of every
// engine on Deregister, and the engine keeps only state of its own (memory registrations, mappings, staging)
// keyed by MemoryID. The methods below do the right thing in both cases, so an engine's Register, Import,
// Deregister and Close are written once.
type Regions struct {
	*Registry
	engine string
	shared bool
}

// NewRegions returns the table of the named engine of node self: shared when it is not nil (it must belong to
// the same node), else a registry of the engine's own whose grace period is grace.
func NewRegions(engine string, shared *Registry, self string, grace time.Duration) (Regions, error) {
	if shared == nil {
		return Regions{Registry: NewRegistry(self, grace), engine: engine}, nil
	}
	if shared.Self() != self {
		return Regions{}, fmt.Errorf("%s engine: %w: shared registry of node %q, engine of node %q", engine, ErrInvalid, shared.Self(), self)
	}
	return Regions{Registry: shared, engine: engine, shared: true}, nil
}

// Shared reports whether the table is the composite's.
func (r Regions) Shared() bool { return r.shared }

// AddLocal adds memory of this node to an owned table; on a shared one the composite adds the descriptor every
// engine filled, so this only validates it.
func (r Regions) AddLocal(d MemoryDesc) error {
	if r.shared {
		if d.Node != r.self {
			return fmt.Errorf("registering memory %s: %w: it belongs to node %q, this is %q", d.ID, ErrInvalid, d.Node, r.self)
		}
		return d.Validate()
	}
	return r.Registry.AddLocal(d)
}

// AddRemote adds another node's memory to an owned table; on a shared one the composite has added it.
func (r Regions) AddRemote(d MemoryDesc) error {
	if r.shared {
		return nil
	}
	return r.Registry.AddRemote(d)
}

// Remove removes a region from an owned table following the Deregister rule. On a shared table it only drains
// the region (at once when the composite drained it already): the composite removes it once every engine
// released its own state, and Describe finds it until then.
func (r Regions) Remove(ctx context.Context, id MemoryID) error {
	if r.shared {
		return r.Drain(ctx, id)
	}
	return r.Registry.Remove(ctx, id)
}

// Close closes an owned table; on a shared one it stops only this engine's transfers and refuses its
// submissions (the composite closes the table).
func (r Regions) Close() error {
	if r.shared {
		return r.CloseEngine(r.engine)
	}
	return r.Registry.Close()
}
