// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontable

import (
	"context"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable/regiontabletest"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// Two removals of one region at once (a session's teardown beside a DeregisterMemory of another connection of
// the same pod): the second must not release the memory, or return, while the first's engines still hold it.
func TestASecondRemovalWaitsForTheEnginesToLetGo(t *testing.T) {
	eng := regiontabletest.NewDrainingEngine()
	tab := New(Config{Node: "node-a", Engine: eng, Limits: Limits{MaxRegions: 4, MaxRegisteredBytes: 1 << 20}, Refusals: refusals.New()})
	sess := &Session{ID: 1, Caller: identity.Caller{Key: "pod-a", Namespace: "infer"}, Regions: map[uint64]*Region{}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r, err := tab.AddRegion(ctx, sess, agentv1.MemoryKind_MEMORY_KIND_HOST,
		engines.MemoryDesc{Size: 4096, Location: engines.Location{Kind: engines.LocationHost}}, "kv", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- tab.RemoveRegion(ctx, r) }()
	<-eng.Started
	second := make(chan error, 1)
	go func() { second <- tab.RemoveRegion(ctx, r) }()
	select {
	case err := <-second:
		t.Fatalf("the second removal returned (%v) while the first's engines still held the region", err)
	case <-time.After(100 * time.Millisecond):
	}
	tab.Lock()
	kept := tab.regions[r.id] == r
	tab.Unlock()
	if !kept {
		t.Fatal("the region left the table while its engines still held it")
	}
	close(eng.LetGo)
	for _, c := range []chan error{first, second} {
		if err := <-c; err != nil {
			t.Fatalf("removal: %v", err)
		}
	}
	tab.Lock()
	defer tab.Unlock()
	if !eng.Drained() || tab.regions[r.id] != nil || tab.callers["pod-a"] != nil || tab.segments[scopedName("infer", "kv")] != nil {
		t.Fatalf("after both removals: drained %v, region %v, usage %v, name %v", eng.Drained(), tab.regions[r.id],
			tab.callers["pod-a"], tab.segments[scopedName("infer", "kv")])
	}
}
