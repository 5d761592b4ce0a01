// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
)

func testRegistry(t testing.TB, sizes map[MemoryID]uint64, remote ...MemoryID) *Registry {
	t.Helper()
	r := NewRegistry("node-a", 0)
	for id, size := range sizes {
		d := MemoryDesc{ID: id, Node: "node-a", Location: Location{Kind: LocationHost}, Size: size}
		var err error
		if slices.Contains(remote, id) {
			d.Node = "node-b"
			err = r.AddRemote(d)
		} else {
			err = r.AddLocal(d)
		}
		if err != nil {
			t.Fatalf("adding %s: %v", id, err)
		}
	}
	return r
}

func always(*MemoryDesc, *MemoryDesc) (bool, string) { return true, "" }

func TestPlannerSplitsAtLimits(t *testing.T) {
	reg := testRegistry(t, map[MemoryID]uint64{"a/1": 1 << 20, "a/2": 1 << 20})
	p := NewPlanner("test", reg, Limits{MaxSegmentBytes: 100, MaxPlanSegments: 4}, always)
	items := []Item{
		{Src: "a/1", Dst: "a/2", SrcOffset: 0, DstOffset: 0, Size: 250, Tag: 1},        // 3 segments
		{Src: "a/1", Dst: "a/2", SrcOffset: 1000, DstOffset: 1000, Size: 50, Tag: 2},   // 1: plan 1 full (4)
		{Src: "a/1", Dst: "a/2", SrcOffset: 2000, DstOffset: 2000, Size: 50, Tag: 3},   // new plan
		{Src: "a/1", Dst: "a/2", SrcOffset: 3000, DstOffset: 3000, Size: 1000, Tag: 4}, // 10 pieces: plan of its own
		{Src: "a/1", Dst: "a/2", SrcOffset: 5000, DstOffset: 5000, Size: 10, Tag: 5},
	}
	for _, it := range items {
		if err := p.Add(it); err != nil {
			t.Fatal(err)
		}
	}
	ps := p.Build()
	var got [][]Tag
	for _, pl := range ps.Plans {
		got = append(got, pl.Tags)
		for _, s := range pl.Segments {
			if s.Size > 100 {
				t.Fatalf("segment %+v over the limit", s)
			}
		}
	}
	want := [][]Tag{{1, 2}, {3}, {4}, {5}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("plan tags %v, want %v", got, want)
	}
	if n := len(ps.Plans[2].Segments); n != 10 {
		t.Fatalf("1000-byte run split into %d segments, want 10", n)
	}
}

func TestPlannerRefusesTwoRemoteSidesAndRefusedPairs(t *testing.T) {
	reg := testRegistry(t, map[MemoryID]uint64{"a/1": 64, "b/1": 64, "b/2": 64}, "b/1", "b/2")
	p := NewPlanner("test", reg, Limits{}, func(src, dst *MemoryDesc) (bool, string) { return false, "no wire" })
	err := p.Add(Item{Src: "b/1", Dst: "b/2", Size: 1, Tag: 1})
	var ue *UnplannableError
	if !errors.As(err, &ue) || ue.Refusals[0].Reason != "neither region belongs to this node" {
		t.Fatalf("remote->remote: %v", err)
	}
	err = p.Add(Item{Src: "a/1", Dst: "b/2", Size: 1, Tag: 2})
	if !errors.As(err, &ue) || ue.Refusals[0].Reason != "no wire" || !errors.Is(err, ErrUnplannable) {
		t.Fatalf("refused pair: %v", err)
	}
}

func TestPlannerRefusesReRegisteredRegionAtSubmit(t *testing.T) {
	reg := testRegistry(t, map[MemoryID]uint64{"a/1": 64, "a/2": 64})
	p := NewPlanner("test", reg, Limits{}, always)
	if err := p.Add(Item{Src: "a/1", Dst: "a/2", Size: 64, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ps := p.Build()
	if err := reg.Remove(t.Context(), "a/2"); err != nil {
		t.Fatal(err)
	}
	if err := reg.AddLocal(MemoryDesc{ID: "a/2", Node: "node-a", Location: Location{Kind: LocationHost}, Size: 8}); err != nil {
		t.Fatal(err)
	}
	tr, work, err := reg.Begin(t.Context(), "test", ps, SubmitOptions{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(work) != 0 {
		t.Fatal("a plan checked against a 64-byte region was handed out for its 8-byte successor")
	}
	if err := tr.Wait(t.Context()); !errors.Is(err, ErrUnknownMemory) {
		t.Fatalf("Wait = %v, want ErrUnknownMemory", err)
	}
}

// maxPlannerFuzzInput is the longest input FuzzPlanner plans.
const maxPlannerFuzzInput = 256

// FuzzPlanner feeds random items with offsets near the bounds (up to 2^64) and repeated tags, and checks that
// nothing out of bounds is planned and every item is accounted for exactly once.
func FuzzPlanner(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 16, 1, 2, 3})
	f.Add(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, math.MaxUint64), math.MaxUint64-1))
	seed := []byte{}
	for i := 0; i < 20; i++ {
		seed = append(seed, byte(i*37), byte(i*11), byte(i), byte(255-i), 0, 1, byte(i%3), byte(i%5), 0, 0, 0, byte(i))
	}
	f.Add(seed)
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 1, 2, 3, 4, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		// Inputs are bounded: when an input finds new coverage, go's fuzzer minimizes it by trying to remove
		// every span of bytes, about len²/2 runs of this function (~100 µs each with 200 items), and it keeps
		// no count of them until it is done. A 3.8 KiB input kept one worker minimizing for the whole of
		// -fuzzminimizetime (60 s), reporting 0 execs/s throughout. 256 bytes still make 15-40 items, enough to
		// coalesce, overlap and split plans, and minimize in a few seconds at most.
		if len(data) > maxPlannerFuzzInput {
			return
		}
		sizes := map[MemoryID]uint64{"a/1": 4096, "a/2": 1 << 20, "b/1": math.MaxUint64, "b/2": 1}
		reg := testRegistry(t, sizes, "b/1", "b/2")
		ids := []MemoryID{"a/1", "a/2", "b/1", "b/2", "x/unknown"}
		p := NewPlanner("fuzz", reg, Limits{MaxSegmentBytes: 777, MaxPlanSegments: 5}, always)

		next := func(n int) uint64 {
			var v uint64
			for i := 0; i < n; i++ {
				v <<= 8
				if len(data) > 0 {
					v |= uint64(data[0])
					data = data[1:]
				}
			}
			return v
		}
		nearBound := func(size uint64) uint64 {
			switch next(1) % 4 {
			case 0:
				return next(2) % 8192
			case 1:
				return size - next(1)%16
			case 2:
				return math.MaxUint64 - next(1)%16
			default:
				return next(8)
			}
		}
		added := map[Tag]int{}
		type rec struct {
			it       Item
			accepted bool
		}
		var recs []rec
		for len(data) > 0 && len(recs) < 200 {
			src, dst := ids[next(1)%uint64(len(ids))], ids[next(1)%uint64(len(ids))]
			size := nearBound(sizes[dst]) % (1 << 21)
			if next(1)%8 == 0 {
				size = nearBound(math.MaxUint64)
			}
			it := Item{Src: src, Dst: dst, SrcOffset: nearBound(sizes[src]), DstOffset: nearBound(sizes[dst]), Size: size, Tag: Tag(next(1) % 8)}
			err := p.Add(it)
			added[it.Tag]++
			inBounds := func(off, size, total uint64) bool {
				end, carry := bits.Add64(off, size, 0)
				return carry == 0 && end <= total
			}
			_, srcKnown := sizes[src]
			_, dstKnown := sizes[dst]
			valid := it.Size == 0 || (srcKnown && dstKnown && inBounds(it.SrcOffset, it.Size, sizes[src]) &&
				inBounds(it.DstOffset, it.Size, sizes[dst]) && !(src[0] == 'b' && dst[0] == 'b'))
			if valid != (err == nil) {
				t.Fatalf("Add(%+v) = %v, but the item is valid=%v", it, err, valid)
			}
			if err != nil {
				var ie *ItemError
				if !errors.As(err, &ie) || ie.Item != it {
					t.Fatalf("Add error %v does not carry the item", err)
				}
			}
			recs = append(recs, rec{it, err == nil && it.Size > 0})
		}
		ps := p.Build()
		seen := map[Tag]int{}
		var planned uint64
		for _, pl := range ps.Plans {
			var segBytes uint64
			for _, s := range pl.Segments {
				if s.Size == 0 || s.Size > 777 {
					t.Fatalf("segment %+v violates limits", s)
				}
				if !fitsIn(s.SrcOffset, s.Size, sizes[pl.Src]) || !fitsIn(s.DstOffset, s.Size, sizes[pl.Dst]) {
					t.Fatalf("segment %+v of %s -> %s out of bounds", s, pl.Src, pl.Dst)
				}
				segBytes += s.Size
			}
			if segBytes != pl.Bytes {
				t.Fatalf("plan bytes %d != segment bytes %d", pl.Bytes, segBytes)
			}
			planned += pl.Bytes
			for _, tag := range pl.Tags {
				seen[tag]++
			}
		}
		var overlapBytes, acceptedBytes uint64
		for _, r := range ps.Rejected {
			seen[r.Item.Tag]++
			if errors.Is(r, ErrOverlap) {
				overlapBytes += r.Item.Size
			}
		}
		for _, tag := range ps.Dropped {
			seen[tag]++
		}
		for _, r := range recs {
			if r.accepted {
				acceptedBytes += r.it.Size
			}
		}
		if !mapsEqual(seen, added) {
			t.Fatalf("tags accounted %v, added %v", seen, added)
		}
		if planned != acceptedBytes-overlapBytes {
			t.Fatalf("planned %d bytes, accepted %d minus overlapping %d", planned, acceptedBytes, overlapBytes)
		}
	})
}

func mapsEqual(a, b map[Tag]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestFastSortMatchesGeneralSort: the packed-key sort orders exactly like the comparison sort whenever it
// takes a batch.
func TestFastSortMatchesGeneralSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 300; trial++ {
		n := rng.IntN(200) + 2
		es := make([]entry, n)
		seqs := rng.Perm(4 * n) // unique, with gaps, as after rejections
		for i := range es {
			es[i] = entry{srcOff: uint64(rng.IntN(50)) * 64, dstOff: uint64(rng.IntN(1000)) * 64, size: 64, seq: int32(seqs[i])}
		}
		if trial%3 == 0 {
			es[0].srcOff = 1 << 50 // beyond packed keys: general sort
		}
		fast, general := slices.Clone(es), slices.Clone(es)
		off := func(e *entry) uint64 { return e.srcOff }
		tie := func(e *entry) uint64 { return e.dstOff }
		group := func(*entry) int32 { return 0 }
		for _, needTie := range []bool{false, true} {
			var tf func(*entry) uint64
			if needTie {
				tf = tie
			}
			if !fastSort(fast, &sortScratch{}, group, off, needTie) {
				continue
			}
			slices.SortFunc(general, func(x, y entry) int {
				if c := compareU64(x.srcOff, y.srcOff); c != 0 {
					return c
				}
				if tf != nil {
					if c := compareU64(x.dstOff, y.dstOff); c != 0 {
						return c
					}
				}
				return int(x.seq - y.seq)
			})
			if !slices.Equal(fast, general) {
				t.Fatalf("fast sort differs from the general sort (tie=%v)", needTie)
			}
			fast, general = slices.Clone(es), slices.Clone(es)
		}
	}
}

func TestRadixSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{0, 1, 255, 256, 1000, 20000} {
		for _, width := range []uint{1, 12, 40, 64} {
			keys := make([]uint64, n)
			for i := range keys {
				keys[i] = rng.Uint64() >> (64 - width)
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			radixSort(keys, make([]uint64, len(keys)))
			if !slices.Equal(keys, want) {
				t.Fatalf("radixSort of %d keys of %d bits differs from slices.Sort", n, width)
			}
		}
	}
}

// Planners recycle their working memory through the registry: a later planner must not see anything of an
// earlier one (pairs, the remembered last pair, entries), and plans already built must not change.
func TestPlannersReusingMemoryStayIndependent(t *testing.T) {
	reg := testRegistry(t, map[MemoryID]uint64{"a/1": 1 << 20, "a/2": 1 << 20, "a/3": 1 << 20})
	first := NewPlanner("test", reg, Limits{}, always)
	for i := range uint64(1000) {
		if err := first.Add(Item{Src: "a/1", Dst: "a/2", SrcOffset: i * 512, DstOffset: (999 - i) * 512, Size: 512, Tag: Tag(i)}); err != nil {
			t.Fatal(err)
		}
	}
	built := first.Build()
	want := slices.Clone(built.Plans[0].Segments)
	for round := range 3 {
		p := NewPlanner("test", reg, Limits{}, always)
		// Same ids in the other direction, then a third region: a stale pair index would file these under a/1→a/2.
		if err := p.Add(Item{Src: "a/2", Dst: "a/3", SrcOffset: 0, DstOffset: 4096, Size: 100, Tag: 7}); err != nil {
			t.Fatal(err)
		}
		if err := p.Add(Item{Src: "a/3", Dst: "a/1", SrcOffset: 8192, DstOffset: 0, Size: 50, Tag: 8}); err != nil {
			t.Fatal(err)
		}
		ps := p.Build()
		if len(ps.Plans) != 2 {
			t.Fatalf("round %d: %d plans, want 2", round, len(ps.Plans))
		}
		for _, pl := range ps.Plans {
			if len(pl.Segments) != 1 || len(pl.Tags) != 1 {
				t.Fatalf("round %d: plan %s→%s has %d segments, tags %v: entries of another planner leaked in", round, pl.Src, pl.Dst, len(pl.Segments), pl.Tags)
			}
			switch {
			case pl.Src == "a/2" && pl.Dst == "a/3" && pl.Tags[0] == 7 && pl.Segments[0] == (Segment{SrcOffset: 0, DstOffset: 4096, Size: 100}):
			case pl.Src == "a/3" && pl.Dst == "a/1" && pl.Tags[0] == 8 && pl.Segments[0] == (Segment{SrcOffset: 8192, DstOffset: 0, Size: 50}):
			default:
				t.Fatalf("round %d: unexpected plan %+v", round, pl)
			}
		}
	}
	if !slices.Equal(built.Plans[0].Segments, want) {
		t.Fatal("a built plan changed after its planner's memory was reused")
	}
}

// Items contiguous on both sides become one segment whatever order they were added in; items contiguous on one
// side only stay apart; each pair coalesces on its own.
func TestPlannerCoalescesRunsContiguousOnBothSides(t *testing.T) {
	reg := testRegistry(t, map[MemoryID]uint64{"a/1": 1 << 20, "a/2": 1 << 20, "a/3": 1 << 20})
	p := NewPlanner("test", reg, Limits{}, always)
	items := []Item{
		{Src: "a/1", Dst: "a/2", SrcOffset: 200, DstOffset: 1200, Size: 100, Tag: 3}, // run A, third
		{Src: "a/3", Dst: "a/2", SrcOffset: 0, DstOffset: 5000, Size: 10, Tag: 10},   // other pair, run C
		{Src: "a/1", Dst: "a/2", SrcOffset: 0, DstOffset: 1000, Size: 100, Tag: 1},   // run A, first
		{Src: "a/1", Dst: "a/2", SrcOffset: 300, DstOffset: 9000, Size: 50, Tag: 4},  // src follows A, dst does not
		{Src: "a/3", Dst: "a/2", SrcOffset: 10, DstOffset: 5010, Size: 10, Tag: 11},  // run C, second
		{Src: "a/1", Dst: "a/2", SrcOffset: 100, DstOffset: 1100, Size: 100, Tag: 2}, // run A, second
	}
	for _, it := range items {
		if err := p.Add(it); err != nil {
			t.Fatal(err)
		}
	}
	ps := p.Build()
	got := map[[2]MemoryID][]Segment{}
	tags := map[[2]MemoryID][]Tag{}
	for _, pl := range ps.Plans {
		got[[2]MemoryID{pl.Src, pl.Dst}] = append(got[[2]MemoryID{pl.Src, pl.Dst}], pl.Segments...)
		tags[[2]MemoryID{pl.Src, pl.Dst}] = append(tags[[2]MemoryID{pl.Src, pl.Dst}], pl.Tags...)
	}
	a := got[[2]MemoryID{"a/1", "a/2"}]
	slices.SortFunc(a, func(x, y Segment) int { return int(x.SrcOffset) - int(y.SrcOffset) })
	if want := []Segment{{SrcOffset: 0, DstOffset: 1000, Size: 300}, {SrcOffset: 300, DstOffset: 9000, Size: 50}}; !slices.Equal(a, want) {
		t.Errorf("a/1→a/2 segments %+v, want %+v", a, want)
	}
	if c, want := got[[2]MemoryID{"a/3", "a/2"}], []Segment{{SrcOffset: 0, DstOffset: 5000, Size: 20}}; !slices.Equal(c, want) {
		t.Errorf("a/3→a/2 segments %+v, want %+v", c, want)
	}
	at := tags[[2]MemoryID{"a/1", "a/2"}]
	slices.Sort(at)
	if !slices.Equal(at, []Tag{1, 2, 3, 4}) {
		t.Errorf("a/1→a/2 tags %v", at)
	}
}
