// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package enginetest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Pair is a source and a destination region the engine under test serves, registered (or imported) already.
type Pair struct {
	Src, Dst engines.MemoryID
	Size     uint64
	// Fill writes b into the source at off; Read returns n bytes of the destination at off.
	Fill func(off uint64, b []byte)
	Read func(off, n uint64) []byte
}

// Harness tells the suite how to drive one engine.
type Harness struct {
	Engine engines.Engine
	// Directions the engine serves; the suite runs the data tests once per direction.
	Directions []engines.Direction
	// NewPair makes two fresh regions of size bytes for dir and registers them; cleanup is the harness's.
	NewPair func(t testing.TB, dir engines.Direction, size uint64) Pair
	// Gate stalls the engine's data path until release is called or the stalled transfer's context ends. Nil
	// skips the cancel, deadline and deregister-in-flight tests (with a reason).
	Gate func(t testing.TB) (release func())
	// Limits the engine plans with, for the splitting test.
	Limits engines.Limits
	// SetDstNotify installs fn as the notification handler of the node that owns a dir pair's destination.
	// Nil skips the notification test.
	SetDstNotify func(dir engines.Direction, fn engines.NotifyFunc)
}

// waitLimit bounds every wait in the suite.
const waitLimit = 10 * time.Second

// Run runs the contract suite.
func Run(t *testing.T, h Harness) {
	if len(h.Directions) == 0 {
		t.Fatal("harness serves no direction")
	}
	for _, dir := range h.Directions {
		t.Run(dir.String(), func(t *testing.T) {
			t.Run("RejectsUnknownAndDeregistered", func(t *testing.T) { testUnknown(t, h, dir) })
			t.Run("RejectsOutOfBounds", func(t *testing.T) { testBounds(t, h, dir) })
			t.Run("DropsEmpty", func(t *testing.T) { testEmpty(t, h, dir) })
			t.Run("EveryItemOnceCoalescedDeterministic", func(t *testing.T) { testAccounting(t, h, dir) })
			t.Run("RejectsOverlappingDestinations", func(t *testing.T) { testOverlap(t, h, dir) })
			t.Run("SplitsAtLimits", func(t *testing.T) { testSplit(t, h, dir) })
			t.Run("MovesBytes", func(t *testing.T) { testData(t, h, dir) })
			t.Run("WaitIdempotentAndResubmit", func(t *testing.T) { testWaitIdempotent(t, h, dir) })
			t.Run("FailuresMappedToTags", func(t *testing.T) { testFailureTags(t, h, dir) })
			t.Run("Cancel", func(t *testing.T) { testCancel(t, h, dir) })
			t.Run("Deadline", func(t *testing.T) { testDeadline(t, h, dir) })
			t.Run("DeregisterWaitsForInFlight", func(t *testing.T) { testDeregisterGraceful(t, h, dir) })
			t.Run("DeregisterCancelsInFlight", func(t *testing.T) { testDeregisterForced(t, h, dir) })
			t.Run("Notification", func(t *testing.T) { testNotify(t, h, dir) })
			t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, h, dir) })
		})
	}
	t.Run("RefusesForeignPlanSet", func(t *testing.T) {
		if _, err := h.Engine.Submit(context.Background(), &engines.PlanSet{}, engines.SubmitOptions{}); !errors.Is(err, engines.ErrForeignPlan) {
			t.Fatalf("Submit(foreign plan set) = %v, want ErrForeignPlan", err)
		}
	})
}

func mustReject(t *testing.T, b engines.PlanBuilder, it engines.Item, want error) {
	t.Helper()
	err := b.Add(it)
	var ie *engines.ItemError
	if !errors.As(err, &ie) || ie.Item.Tag != it.Tag || !errors.Is(err, want) {
		t.Fatalf("Add(%+v) = %v, want *ItemError tag %d wrapping %v", it, err, it.Tag, want)
	}
}

func testUnknown(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 4096)
	b := h.Engine.NewPlan()
	mustReject(t, b, engines.Item{Src: "no-such-node/1", Dst: p.Dst, Size: 8, Tag: 1}, engines.ErrUnknownMemory)
	mustReject(t, b, engines.Item{Src: p.Src, Dst: "no-such-node/2", Size: 8, Tag: 2}, engines.ErrUnknownMemory)
	dereg := h.NewPair(t, dir, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := h.Engine.Deregister(ctx, dereg.Dst); err != nil {
		t.Fatalf("Deregister(%s): %v", dereg.Dst, err)
	}
	mustReject(t, b, engines.Item{Src: dereg.Src, Dst: dereg.Dst, Size: 8, Tag: 3}, engines.ErrUnknownMemory)
	if err := h.Engine.Deregister(ctx, dereg.Dst); !errors.Is(err, engines.ErrUnknownMemory) {
		t.Fatalf("second Deregister(%s) = %v, want ErrUnknownMemory", dereg.Dst, err)
	}
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, Size: 8, Tag: 4}); err != nil {
		t.Fatalf("valid item after rejections: %v", err)
	}
	ps := b.Build()
	if got := rejectedTags(ps); !slices.Equal(got, []engines.Tag{1, 2, 3}) {
		t.Fatalf("Rejected tags = %v, want [1 2 3]", got)
	}
	if got := planTags(ps); !slices.Equal(got, []engines.Tag{4}) {
		t.Fatalf("planned tags = %v, want [4]", got)
	}
}

func testBounds(t *testing.T, h Harness, dir engines.Direction) {
	const size = 4096
	p := h.NewPair(t, dir, size)
	b := h.Engine.NewPlan()
	bad := []engines.Item{
		{SrcOffset: size - 7, Size: 8},
		{DstOffset: size - 7, Size: 8},
		{SrcOffset: size, Size: 1},
		{DstOffset: size + 1, Size: 1},
		{Size: size + 1},
		{SrcOffset: math.MaxUint64 - 3, Size: 8},
		{DstOffset: math.MaxUint64, Size: 1},
		{SrcOffset: 8, Size: math.MaxUint64 - 3},
		{DstOffset: 1, Size: math.MaxUint64},
	}
	for i, it := range bad {
		it.Src, it.Dst, it.Tag = p.Src, p.Dst, engines.Tag(100+i)
		mustReject(t, b, it, engines.ErrOutOfBounds)
	}
	// Exactly at the bounds is fine.
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: size - 8, DstOffset: 0, Size: 8, Tag: 1}); err != nil {
		t.Fatalf("item ending at the source's last byte: %v", err)
	}
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: 0, DstOffset: size - 8, Size: 8, Tag: 2}); err != nil {
		t.Fatalf("item ending at the destination's last byte: %v", err)
	}
	ps := b.Build()
	if len(ps.Rejected) != len(bad) {
		t.Fatalf("%d rejected, want %d", len(ps.Rejected), len(bad))
	}
	for _, pl := range ps.Plans {
		for _, s := range pl.Segments {
			if s.SrcOffset+s.Size > size || s.DstOffset+s.Size > size {
				t.Fatalf("plan segment %+v exceeds %d bytes", s, size)
			}
		}
	}
}

func testEmpty(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 4096)
	b := h.Engine.NewPlan()
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, Size: 0, Tag: 7}); err != nil {
		t.Fatalf("empty item: %v", err)
	}
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, Size: 16, Tag: 8}); err != nil {
		t.Fatal(err)
	}
	ps := b.Build()
	if !slices.Equal(ps.Dropped, []engines.Tag{7}) || !slices.Equal(planTags(ps), []engines.Tag{8}) {
		t.Fatalf("Dropped %v, planned %v; want [7], [8]", ps.Dropped, planTags(ps))
	}
}

// testAccounting: a shuffled batch with contiguous runs and gaps; every tag in exactly one plan, runs
// coalesced into one segment each, and the same plans whatever the order the items were added in.
func testAccounting(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 1<<20)
	var items []engines.Item
	tag := engines.Tag(0)
	// Run A: 8 blocks of 512 B contiguous on both sides; run B: 4 blocks contiguous on the source only.
	for i := uint64(0); i < 8; i++ {
		tag++
		items = append(items, engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: 4096 + i*512, DstOffset: 65536 + i*512, Size: 512, Tag: tag})
	}
	for i := uint64(0); i < 4; i++ {
		tag++
		items = append(items, engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: 200000 + i*512, DstOffset: 300000 + i*1024, Size: 512, Tag: tag})
	}
	build := func(order []engines.Item) *engines.PlanSet {
		b := h.Engine.NewPlan()
		for _, it := range order {
			if err := b.Add(it); err != nil {
				t.Fatalf("Add(%+v): %v", it, err)
			}
		}
		return b.Build()
	}
	ref := build(items)
	got := planTags(ref)
	slices.Sort(got)
	want := make([]engines.Tag, len(items))
	for i := range want {
		want[i] = engines.Tag(i + 1)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("planned tags %v, want each of %v exactly once", got, want)
	}
	var segs []engines.Segment
	for _, pl := range ref.Plans {
		segs = append(segs, pl.Segments...)
		var n uint64
		for _, s := range pl.Segments {
			n += s.Size
		}
		if n != pl.Bytes {
			t.Fatalf("plan Bytes %d, segments sum to %d", pl.Bytes, n)
		}
		engineOK := pl.Engine == h.Engine.Name()
		if h.Engine.Name() == engines.CompositeName {
			_, engineOK = engines.EngineRank(pl.Engine)
		}
		if !engineOK || pl.Direction != dir {
			t.Fatalf("plan engine %q direction %v, want %q %v", pl.Engine, pl.Direction, h.Engine.Name(), dir)
		}
	}
	if h.Limits.MaxSegmentBytes == 0 || h.Limits.MaxSegmentBytes >= 4096 {
		if !slices.Contains(segs, engines.Segment{SrcOffset: 4096, DstOffset: 65536, Size: 4096}) {
			t.Fatalf("run of 8 contiguous blocks not coalesced into one segment: %+v", segs)
		}
		if len(segs) != 5 {
			t.Fatalf("%d segments, want 5 (one coalesced run + 4 blocks contiguous on one side only): %+v", len(segs), segs)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5 {
		shuffled := slices.Clone(items)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if other := build(shuffled); !samePlans(ref, other) {
			t.Fatalf("plans depend on the order items were added:\n%+v\n%+v", ref.Plans, other.Plans)
		}
	}
}

func testOverlap(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 8192)
	b := h.Engine.NewPlan()
	for _, it := range []engines.Item{
		{SrcOffset: 0, DstOffset: 0, Size: 100, Tag: 1},
		{SrcOffset: 100, DstOffset: 99, Size: 10, Tag: 2},    // starts inside tag 1's destination
		{SrcOffset: 0, DstOffset: 100, Size: 100, Tag: 3},    // adjacent: fine, reads overlap freely
		{SrcOffset: 500, DstOffset: 1000, Size: 100, Tag: 4}, // disjoint
	} {
		it.Src, it.Dst = p.Src, p.Dst
		if err := b.Add(it); err != nil {
			t.Fatalf("Add(%+v): %v", it, err)
		}
	}
	ps := b.Build()
	if len(ps.Rejected) != 1 || ps.Rejected[0].Item.Tag != 2 || !errors.Is(ps.Rejected[0], engines.ErrOverlap) {
		t.Fatalf("Rejected = %v, want only tag 2 with ErrOverlap", ps.Rejected)
	}
	got := planTags(ps)
	slices.Sort(got)
	if !slices.Equal(got, []engines.Tag{1, 3, 4}) {
		t.Fatalf("planned tags %v, want [1 3 4]", got)
	}
}

func testSplit(t *testing.T, h Harness, dir engines.Direction) {
	m := h.Limits.MaxSegmentBytes
	if m == 0 {
		t.Skip("engine has no segment size limit; the planner's splitting is tested in package engines")
	}
	size := m*2 + m/2
	p := h.NewPair(t, dir, size)
	b := h.Engine.NewPlan()
	if err := b.Add(engines.Item{Src: p.Src, Dst: p.Dst, Size: size, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ps := b.Build()
	if len(ps.Plans) != 1 || len(ps.Plans[0].Segments) != 3 {
		t.Fatalf("%d plans, want 1 plan of 3 segments: %+v", len(ps.Plans), ps.Plans)
	}
	for _, s := range ps.Plans[0].Segments {
		if s.Size > m {
			t.Fatalf("segment of %d bytes exceeds the %d-byte limit", s.Size, m)
		}
	}
}
