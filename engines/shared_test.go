// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// TestSharedRegistryIsTheOnlyTable: a region registered through the composite is in one table, the one every
// engine plans and submits against, with the handles all engines filled; it leaves that table once.
func TestSharedRegistryIsTheOnlyTable(t *testing.T) {
	c := newCluster(t)
	l := c.localRegion(t, make([]byte, 64))
	r := c.remoteRegion(t, make([]byte, 64))
	table := c.a.Registry()
	want, _, err := table.Lookup(l.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want.Handles.TCP == "" || want.Handles.Host == nil {
		t.Fatalf("the table's descriptor lacks handles the engines filled: %+v", want.Handles)
	}
	for _, e := range c.a.Engines() {
		pe, ok := e.(engines.Planned)
		if !ok {
			t.Fatalf("engine %s does not expose its registry", e.Name())
		}
		if pe.Registry() != table {
			t.Fatalf("engine %s keeps a registry of its own beside the composite's", e.Name())
		}
		if got, _, err := pe.Registry().Lookup(l.ID); err != nil || got != want {
			t.Fatalf("engine %s sees %p (%v), want the composite's descriptor %p", e.Name(), got, err, want)
		}
	}
	for _, id := range []engines.MemoryID{l.ID, r.ID} {
		if err := c.a.Deregister(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		if _, _, err := table.Describe(id); !errors.Is(err, engines.ErrUnknownMemory) {
			t.Fatalf("%s still in the table after Deregister: %v", id, err)
		}
		if err := c.a.Deregister(context.Background(), id); !errors.Is(err, engines.ErrUnknownMemory) {
			t.Fatalf("second Deregister(%s) = %v, want ErrUnknownMemory", id, err)
		}
	}
	// The id is free again: registering it anew works.
	if _, err := c.a.Register(context.Background(), hostDesc(string(l.ID), "node-a", make([]byte, 64))); err != nil {
		t.Fatalf("registering %s again: %v", l.ID, err)
	}
}

// exactlyOneWins runs call twice at once and fails t unless exactly one succeeds and the other fails with loser.
func exactlyOneWins(t *testing.T, what string, loser error, call func() error) {
	t.Helper()
	var wg sync.WaitGroup
	var ok atomic.Int32
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := call(); err == nil {
				ok.Add(1)
			} else if !errors.Is(err, loser) {
				t.Errorf("losing %s: %v, want %v", what, err, loser)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d of 2 concurrent attempts (%s) succeeded, want 1", ok.Load(), what)
	}
}

// TestSharedRegistryConcurrentRegistration: of two registrations of one id at once, exactly one succeeds, and
// the loser leaves no trace (the winner deregisters and the id registers again).
func TestSharedRegistryConcurrentRegistration(t *testing.T) {
	c := newCluster(t)
	for round := range 20 {
		id := fmt.Sprintf("node-a/race-%d", round)
		exactlyOneWins(t, "registration of "+id, engines.ErrInvalid, func() error {
			_, err := c.a.Register(context.Background(), hostDesc(id, "node-a", make([]byte, 64)))
			return err
		})
		if err := c.a.Deregister(context.Background(), engines.MemoryID(id)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedRegistryConcurrentDeregistration: of two deregistrations of one region at once, exactly one
// succeeds (and releases the engines' state of it); the other finds the memory unknown.
func TestSharedRegistryConcurrentDeregistration(t *testing.T) {
	c := newCluster(t)
	for range 20 {
		d := c.localRegion(t, make([]byte, 64))
		exactlyOneWins(t, "deregistration of "+string(d.ID), engines.ErrUnknownMemory, func() error {
			return c.a.Deregister(context.Background(), d.ID)
		})
	}
}

// TestSharedRegistryRefusesForeignEngine: a composite given a registry refuses an engine built on another one,
// and engines sharing one registry refuse each other's plan sets.
func TestSharedRegistryRefusesForeignEngine(t *testing.T) {
	regions := engines.NewRegistry("node-a", 0)
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	if _, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: regions}, x); !errors.Is(err, engines.ErrInvalid) {
		t.Fatalf("composite over an engine with its own registry: %v, want ErrInvalid", err)
	}
	if _, err := xgmi.New(xgmi.Options{Node: "node-b", Registry: regions}, xgmi.NewHostBackend()); !errors.Is(err, engines.ErrInvalid) {
		t.Fatalf("engine of node-b on node-a's registry: %v, want ErrInvalid", err)
	}

	c := newCluster(t)
	s, d := c.localRegion(t, make([]byte, 64)), c.localRegion(t, make([]byte, 64))
	var xe, te engines.Engine
	for _, e := range c.a.Engines() {
		switch e.Name() {
		case engines.EngineXGMI:
			xe = e
		case engines.EngineTCP:
			te = e
		}
	}
	b := xe.NewPlan()
	if err := b.Add(engines.Item{Src: s.ID, Dst: d.ID, Size: 8}); err != nil {
		t.Fatal(err)
	}
	if _, err := te.Submit(context.Background(), b.Build(), engines.SubmitOptions{}); !errors.Is(err, engines.ErrForeignPlan) {
		t.Fatalf("tcp submitting xgmi's plan set over the shared registry: %v, want ErrForeignPlan", err)
	}
}

// countingEngine counts the plan builders asked of the engine it wraps.
type countingEngine struct {
	*xgmi.Engine
	builders *atomic.Int32
}

func (e countingEngine) NewPlan() engines.PlanBuilder {
	e.builders.Add(1)
	return e.Engine.NewPlan()
}

// TestCompositePlansOnce: with a shared registry the composite plans items and block batches itself, never
// through an engine's planner; built over engines with their own registries it does (the counter counts).
func TestCompositePlansOnce(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			var regions *engines.Registry
			if shared {
				regions = engines.NewRegistry("node-a", 0)
			}
			x, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: regions}, xgmi.NewHostBackend())
			if err != nil {
				t.Fatal(err)
			}
			counted := countingEngine{x, &atomic.Int32{}}
			comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: regions}, counted)
			if err != nil {
				t.Fatal(err)
			}
			defer comp.Close()
			reg := func(id string, buf []byte) engines.MemoryID {
				d, err := comp.Register(context.Background(), hostDesc(id, "node-a", buf))
				if err != nil {
					t.Fatal(err)
				}
				return d.ID
			}
			srcBuf, dstBuf := make([]byte, 4096), make([]byte, 4096)
			for i := range srcBuf {
				srcBuf[i] = byte(i)
			}
			s, d := reg("node-a/s", srcBuf), reg("node-a/d", dstBuf)
			p := comp.NewPlan()
			for i := range 4 {
				if err := p.Add(engines.Item{Src: s, Dst: d, SrcOffset: uint64(i) * 100, DstOffset: uint64(i) * 100, Size: 100, Tag: engines.Tag(i)}); err != nil {
					t.Fatal(err)
				}
			}
			ps := p.Build()
			if len(ps.Plans) != 1 || len(ps.Plans[0].Segments) != 1 || ps.Plans[0].Bytes != 400 {
				t.Fatalf("plans %+v, want one coalesced segment of 400 bytes", ps.Plans)
			}
			tr, err := comp.Submit(context.Background(), ps, engines.SubmitOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			bp := comp.NewPlan()
			if err := bp.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{{Src: s, Dst: d}},
				BlockBytes: 512, SrcIDs: []uint32{7, 1}, DstIDs: []uint32{4, 5}}); err != nil {
				t.Fatal(err)
			}
			bps := bp.Build()
			if tr, err = comp.Submit(context.Background(), bps, engines.SubmitOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := tr.Wait(context.Background()); err != nil {
				t.Fatal(err)
			}
			if string(dstBuf[:400]) != string(srcBuf[:400]) || string(dstBuf[4*512:5*512]) != string(srcBuf[7*512:8*512]) ||
				string(dstBuf[5*512:6*512]) != string(srcBuf[512:1024]) {
				t.Fatal("bytes did not land")
			}
			n := counted.builders.Load()
			if shared && n != 0 {
				t.Fatalf("the engine's planner was asked %d times for composite batches, want 0 (planned once, by the composite)", n)
			}
			if !shared && n != 2 {
				t.Fatalf("the engine's planner was asked %d times, want 2 (once per batch)", n)
			}
		})
	}
}

// TestSharedDeregisterWaitsAcrossEngines: one region used by transfers of two engines (xgmi and tcp) at once is
// drained across both: Deregister waits for both, or cancels both with ErrDeregistered when its context ends.
func TestSharedDeregisterWaitsAcrossEngines(t *testing.T) {
	for _, forced := range []bool{false, true} {
		t.Run(fmt.Sprintf("forced=%v", forced), func(t *testing.T) {
			c := newCluster(t)
			src := c.localRegion(t, make([]byte, 1<<16))
			local := c.localRegion(t, make([]byte, 1<<16))
			remote := c.remoteRegion(t, make([]byte, 1<<16))
			release := c.gate.Shut(t)
			defer release()
			p := c.a.NewPlan()
			for i, dst := range []engines.MemoryID{local.ID, remote.ID} {
				if err := p.Add(engines.Item{Src: src.ID, Dst: dst, Size: 1 << 16, Tag: engines.Tag(i)}); err != nil {
					t.Fatal(err)
				}
			}
			ps := p.Build()
			if len(ps.Plans) != 2 || ps.Plans[0].Engine != engines.EngineXGMI || ps.Plans[1].Engine != engines.EngineTCP {
				t.Fatalf("plans %+v, want one of xgmi and one of tcp", ps.Plans)
			}
			tr, err := c.a.Submit(context.Background(), ps, engines.SubmitOptions{})
			if err != nil {
				t.Fatal(err)
			}
			limit := 10 * time.Second
			if forced {
				limit = 100 * time.Millisecond
			}
			result := make(chan error, 1)
			var doneAtReturn atomic.Bool
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				defer cancel()
				err := c.a.Deregister(ctx, src.ID)
				select {
				case <-tr.Done():
					doneAtReturn.Store(true)
				default:
				}
				result <- err
			}()
			if !forced {
				select {
				case err := <-result:
					t.Fatalf("Deregister returned (%v) while transfers of both engines used the region", err)
				case <-time.After(200 * time.Millisecond):
				}
				release()
			}
			if err := <-result; err != nil {
				t.Fatalf("Deregister: %v", err)
			}
			if !doneAtReturn.Load() {
				t.Fatal("Deregister returned before the transfer using the region was done")
			}
			err = tr.Wait(context.Background())
			var te *engines.TransferError
			switch {
			case !forced && err != nil:
				t.Fatalf("transfer waited for by Deregister: %v", err)
			case forced && (!errors.As(err, &te) || len(te.Failures) != 2):
				t.Fatalf("transfer cancelled by Deregister: %v, want both plans failed", err)
			case forced:
				for _, f := range te.Failures {
					if !errors.Is(f.Err, engines.ErrDeregistered) {
						t.Errorf("%s plan failed with %v, want ErrDeregistered", f.Engine, f.Err)
					}
				}
			}
			if _, _, err := c.a.Registry().Describe(src.ID); !errors.Is(err, engines.ErrUnknownMemory) {
				t.Fatalf("region still in the table: %v", err)
			}
		})
	}
}

// limitedHost is the host backend planning with other limits (segments, no block plans).
type limitedHost struct {
	*xgmi.HostBackend
	lim engines.Limits
}

func (h limitedHost) Limits() engines.Limits { return h.lim }

// TestSharedPlanningMatchesEnginePlanners: the composite planning for engines that share its registry makes the
// plan sets their own planners made, item and block batches alike, with limits and with refusals.
func TestSharedPlanningMatchesEnginePlanners(t *testing.T) {
	lims := []engines.Limits{{BlockPlans: true}, {}, {MaxSegmentBytes: 96, MaxPlanSegments: 3}}
	type batch struct {
		name   string
		items  []engines.Item
		blocks *engines.Blocks
	}
	const size = 4096
	batches := []batch{
		{name: "items", items: []engines.Item{
			{Src: "node-a/s1", Dst: "node-a/d2", SrcOffset: 0, DstOffset: 500, Size: 100, Tag: 1},
			{Src: "node-a/s1", Dst: "node-a/d1", SrcOffset: 100, DstOffset: 0, Size: 300, Tag: 2},
			{Src: "node-a/s1", Dst: "node-a/d1", SrcOffset: 400, DstOffset: 300, Size: 300, Tag: 3},
			{Src: "node-a/s2", Dst: "node-a/d1", SrcOffset: 0, DstOffset: 2000, Size: 64, Tag: 4},
			{Src: "node-a/s1", Dst: "node-a/d1", SrcOffset: 0, DstOffset: 200, Size: 10, Tag: 5},  // overlaps tag 2
			{Src: "node-a/s1", Dst: "node-a/d2", SrcOffset: 0, DstOffset: size, Size: 1, Tag: 6},  // out of bounds
			{Src: "node-a/s1", Dst: "node-a/xx", SrcOffset: 0, DstOffset: 0, Size: 1, Tag: 7},     // unknown
			{Src: "node-a/s1", Dst: "node-a/d2", SrcOffset: 0, DstOffset: 0, Size: 0, Tag: 8},     // empty
			{Src: "node-a/s2", Dst: "node-a/d2", SrcOffset: 100, DstOffset: 0, Size: 500, Tag: 9}, // overlaps tag 1's
			{Src: "node-a/s2", Dst: "node-a/d2", SrcOffset: 600, DstOffset: 1000, Size: 200, Tag: 10},
		}},
		{name: "blocks", blocks: &engines.Blocks{Pairs: []engines.BlockPair{{Src: "node-a/s1", Dst: "node-a/d1"}, {Src: "node-a/s2", Dst: "node-a/d2"}},
			BlockBytes: 64, SrcIDs: []uint32{3, 4, 5, 9}, DstIDs: []uint32{0, 1, 2, 7}, Tag: 11}},
		{name: "blocks with a repeated destination", blocks: &engines.Blocks{Pairs: []engines.BlockPair{{Src: "node-a/s1", Dst: "node-a/d1"}},
			BlockBytes: 64, SrcIDs: []uint32{3, 4, 5}, DstIDs: []uint32{6, 1, 6}, Tag: 12}},
	}
	build := func(t *testing.T, shared bool, lim engines.Limits) *engines.Composite {
		var regions *engines.Registry
		if shared {
			regions = engines.NewRegistry("node-a", 0)
		}
		x, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: regions}, limitedHost{xgmi.NewHostBackend(), lim})
		if err != nil {
			t.Fatal(err)
		}
		te, err := tcp.New(tcp.Options{Node: "node-a", Registry: regions})
		if err != nil {
			t.Fatal(err)
		}
		comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: regions}, x, te)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { comp.Close() })
		for _, id := range []string{"node-a/s1", "node-a/s2", "node-a/d1", "node-a/d2"} {
			if _, err := comp.Register(context.Background(), hostDesc(id, "node-a", make([]byte, size))); err != nil {
				t.Fatal(err)
			}
		}
		return comp
	}
	plan := func(t *testing.T, c *engines.Composite, b batch) *engines.PlanSet {
		p := c.NewPlan()
		for _, it := range b.items {
			_ = p.Add(it)
		}
		if b.blocks != nil {
			_ = p.(engines.BlockAdder).AddBlocks(*b.blocks)
		}
		return p.Build()
	}
	for _, lim := range lims {
		shared, separate := build(t, true, lim), build(t, false, lim)
		for _, b := range batches {
			t.Run(fmt.Sprintf("%s/%+v", b.name, lim), func(t *testing.T) {
				got, want := describePlans(plan(t, shared, b)), describePlans(plan(t, separate, b))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("planned once by the composite:\n%v\nby the engine's planner:\n%v", got, want)
				}
				if len(got) < 2 {
					t.Fatalf("nothing planned: %v", got)
				}
			})
		}
	}
}

// describePlans is what a plan set says, in comparable form.
func describePlans(ps *engines.PlanSet) []string {
	var out []string
	for _, p := range ps.Plans {
		s := fmt.Sprintf("plan %s %s %s->%s %d bytes tags %v segments %v", p.Engine, p.Direction, p.Src, p.Dst, p.Bytes, p.Tags, p.Segments)
		if l := p.Blocks; l != nil {
			s += fmt.Sprintf(" blocks %d %v %v [%d %d] [%d %d] unchecked %v %d %d", l.BlockBytes, l.SrcIDs, l.DstIDs,
				l.SrcMin, l.SrcMax, l.DstMin, l.DstMax, l.Unchecked, l.SrcBlocks, l.DstBlocks)
		}
		out = append(out, s)
	}
	for _, r := range ps.Rejected {
		out = append(out, "rejected "+r.Error())
	}
	out = append(out, fmt.Sprintf("dropped %v", ps.Dropped))
	return out
}

// TestSharedRegistryEngineCloseStopsOnlyItsTransfers: closing one engine of a shared registry cancels its
// transfers and refuses its submissions; another engine's transfer on the same table goes on.
func TestSharedRegistryEngineCloseStopsOnlyItsTransfers(t *testing.T) {
	c := newCluster(t)
	src := c.localRegion(t, make([]byte, 1<<16))
	local := c.localRegion(t, make([]byte, 1<<16))
	remote := c.remoteRegion(t, make([]byte, 1<<16))
	release := c.gate.Shut(t)
	defer release()
	submit := func(dst engines.MemoryID) engines.Transfer {
		t.Helper()
		p := c.a.NewPlan()
		if err := p.Add(engines.Item{Src: src.ID, Dst: dst, Size: 1 << 16}); err != nil {
			t.Fatal(err)
		}
		tr, err := c.a.Submit(context.Background(), p.Build(), engines.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	byXGMI, byTCP := submit(local.ID), submit(remote.ID)
	var xe engines.Engine
	for _, e := range c.a.Engines() {
		if e.Name() == engines.EngineXGMI {
			xe = e
		}
	}
	if err := xe.Close(); err != nil {
		t.Fatal(err)
	}
	if err := byXGMI.Wait(context.Background()); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("transfer of the closed engine: %v, want ErrClosed", err)
	}
	select {
	case <-byTCP.Done():
		t.Fatalf("closing xgmi ended the tcp transfer: %v", byTCP.Wait(context.Background()))
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if err := byTCP.Wait(context.Background()); err != nil {
		t.Fatalf("tcp transfer: %v", err)
	}
	if err := submit(local.ID).Wait(context.Background()); !errors.Is(err, engines.ErrClosed) {
		t.Fatalf("submitting to the closed engine: %v, want ErrClosed", err)
	}
	if _, _, err := c.a.Registry().Lookup(src.ID); err != nil {
		t.Fatalf("the table lost a region when one engine closed: %v", err)
	}
}
