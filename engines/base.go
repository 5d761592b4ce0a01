// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"context"
	"fmt"
	"sync"
)

// Base is what every engine has in common, for embedding: its name, its region table, planning with its
// limits and pair rule, Import, and the notification handler. What is left to an engine is its pair rule
// (CanHandle), Register (its handles and private state), Deregister (releasing that state once the table
// drained the region), Submit (executing plans) and Close. Engines built on the composite's registry satisfy
// Planned through it.
type Base struct {
	name string
	reg  Regions
	lim  Limits
	can  CanHandleFunc

	hook notifyHook
}

// NewBase returns the common part of the named engine, planning against reg with lim and can.
func NewBase(name string, reg Regions, lim Limits, can CanHandleFunc) *Base {
	return &Base{name: name, reg: reg, lim: lim, can: can}
}

// Name implements Engine.
func (b *Base) Name() string { return b.name }

// Registry is the region table the engine plans and submits against (the composite's when shared).
func (b *Base) Registry() *Registry { return b.reg.Registry }

// PlanLimits are the limits the engine plans with; the composite plans with them for an engine sharing its
// registry.
func (b *Base) PlanLimits() Limits { return b.lim }

// NewPlan implements Engine: the engine's own planner, for use without the composite's registry.
func (b *Base) NewPlan() PlanBuilder { return NewPlanner(b.name, b.reg.Registry, b.lim, b.can) }

// Import implements Engine: another node's memory is only a descriptor in the table.
func (b *Base) Import(_ context.Context, desc MemoryDesc) error {
	if err := b.reg.AddRemote(desc); err != nil {
		return fmt.Errorf("%s: importing %s: %w", b.name, desc.ID, err)
	}
	return nil
}

// SetNotifyHandler implements Engine.
func (b *Base) SetNotifyHandler(fn NotifyFunc) { b.hook.set(fn) }

// Deliver hands a notification to this node's handler (dropped when none is installed): notifications of
// transfers that landed here, and those that arrive from peers over the agent channel.
func (b *Base) Deliver(n Notification) { b.hook.deliver(n) }

// notifyHook is the handler notifications are delivered to, set and read from any goroutine.
type notifyHook struct {
	mu sync.Mutex
	fn NotifyFunc
}

func (h *notifyHook) set(fn NotifyFunc) {
	h.mu.Lock()
	h.fn = fn
	h.mu.Unlock()
}

// deliver hands n to the handler; without one it is dropped.
func (h *notifyHook) deliver(n Notification) {
	h.mu.Lock()
	fn := h.fn
	h.mu.Unlock()
	if fn != nil {
		fn(n)
	}
}
