// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poollend

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable/regiontabletest"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// countingPool is a pool of host slices that counts frees, refusing one of a slice not lent, as poolmem does.
type countingPool struct {
	mu    sync.Mutex
	lent  map[string]bool
	frees int
}

func (p *countingPool) Kind() poolmem.Kind { return poolmem.Host }
func (p *countingPool) Allocate(string, uint64) (*poolmem.Slice, error) {
	return nil, fmt.Errorf("not used")
}
func (p *countingPool) Free(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frees++
	if !p.lent[id] {
		return fmt.Errorf("slice %s is not allocated", id)
	}
	delete(p.lent, id)
	return nil
}
func (p *countingPool) Usage() (uint64, uint64) { return 0, 0 }
func (p *countingPool) Close() error            { return nil }

// A Release and the session's teardown releasing one loan at once: the slice is given back once, after the
// engines let go of its region, and neither answers an error.
func TestOneLoanReleasedTwiceAtOnceIsFreedOnce(t *testing.T) {
	eng := regiontabletest.NewDrainingEngine()
	tab := regiontable.New(regiontable.Config{Node: "node-a", Engine: eng, Refusals: refusals.New(),
		Limits: regiontable.Limits{MaxRegions: 4, MaxRegisteredBytes: 1 << 20}})
	pool := &countingPool{lent: map[string]bool{"s1": true}}
	lender := New(Config{Pool: pool, Table: tab, Refusals: refusals.New()})
	sess := &regiontable.Session{ID: 1, Caller: identity.Caller{Key: "pod-a", Namespace: "infer"}, Regions: map[uint64]*regiontable.Region{}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r, err := tab.AddRegion(ctx, sess, agentv1.MemoryKind_MEMORY_KIND_HOST,
		engines.MemoryDesc{Size: 4096, Location: engines.Location{Kind: engines.LocationHost}}, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &Allocation{id: "s1-1", slice: &poolmem.Slice{ID: "s1"}, region: r}
	loans := Loans{a.id: a}
	errs := make(chan error, 2)
	go func() { errs <- lender.ReleaseAllocation(ctx, loans, a) }()
	<-eng.Started
	go func() { errs <- lender.ReleaseAllocation(ctx, loans, a) }()
	time.Sleep(50 * time.Millisecond) // the second is waiting for the first's removal
	pool.mu.Lock()
	early := pool.frees
	pool.mu.Unlock()
	if early != 0 {
		t.Fatal("the slice was given back while its region's registration was still being undone")
	}
	close(eng.LetGo)
	for range 2 {
		if err := <-errs; err != nil {
			t.Errorf("release: %v", err)
		}
	}
	if pool.frees != 1 || len(loans) != 0 {
		t.Errorf("%d frees of the slice, %d loans left; want 1 and none", pool.frees, len(loans))
	}
}
