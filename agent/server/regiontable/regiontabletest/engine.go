// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontabletest

import (
	"context"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines"
)

// DrainingEngine is an engine whose first Deregister of a region waits until LetGo is closed (it drains the
// region's copies and undoes its registrations); a second one of the same region finds it gone at once, as the
// composite's registry answers. Started is closed when the first Deregister begins; Drained is set when it ends.
type DrainingEngine struct {
	Started, LetGo chan struct{}

	mu      sync.Mutex
	known   map[engines.MemoryID]bool
	drained bool
}

// NewDrainingEngine makes a DrainingEngine for one removal.
func NewDrainingEngine() *DrainingEngine {
	return &DrainingEngine{Started: make(chan struct{}), LetGo: make(chan struct{}), known: map[engines.MemoryID]bool{}}
}

// Register implements the region table's engine.
func (e *DrainingEngine) Register(_ context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.known[d.ID] = true
	return d, nil
}

// Deregister implements the region table's engine.
func (e *DrainingEngine) Deregister(_ context.Context, id engines.MemoryID) error {
	e.mu.Lock()
	first := e.known[id]
	delete(e.known, id)
	e.mu.Unlock()
	if !first {
		return engines.ErrUnknownMemory
	}
	close(e.Started)
	<-e.LetGo
	e.mu.Lock()
	e.drained = true
	e.mu.Unlock()
	return nil
}

// CanHandle implements the region table's engine.
func (e *DrainingEngine) CanHandle(_, _ *engines.MemoryDesc) (bool, string) { return true, "" }

// Drained says whether the first Deregister ended.
func (e *DrainingEngine) Drained() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.drained
}
