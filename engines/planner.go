package engines

import (
	"cmp"
	"fmt"
	"slices"
)

// Limits are an engine's planning limits. Zero means no limit.
type Limits struct {
	// MaxSegmentBytes splits longer segments (RDMA: an SGE length is 32 bits).
	MaxSegmentBytes uint64
	// MaxPlanSegments cuts plans with more segments. Plans are cut only between coalesced runs, so an item
	// always lands in one plan; a single run longer than the limit gets a plan of its own.
	MaxPlanSegments int
}

// CanHandleFunc is an engine's pair test.
type CanHandleFunc func(src, dst *MemoryDesc) (bool, string)

// NewPlanner returns the plan builder engines use: items are checked against reg (known, same registration,
// in bounds, at least one side local, claimed by can) as they are added, and Build groups them per
// (source, destination) pair, rejects overlapping destinations, coalesces, splits at lim and orders the plans.
func NewPlanner(engine string, reg *Registry, lim Limits, can CanHandleFunc) PlanBuilder {
	return &planner{engine: engine, reg: reg, lim: lim, can: can, pairs: map[[2]MemoryID]pairVerdict{}}
}

type planner struct {
	engine string
	reg    *Registry
	lim    Limits
	can    CanHandleFunc

	pairs    map[[2]MemoryID]pairVerdict
	accepted []accepted
	out      PlanSet
	built    bool
}

type pairVerdict struct {
	dir            Direction
	srcGen, dstGen uint64
	err            error
}

type accepted struct {
	item Item
	seq  int
	dir  Direction
	// gens of the regions at Add time
	srcGen, dstGen uint64
	// interned ids, ordered like the ids themselves
	srcKey, dstKey int
}

func (p *planner) Add(it Item) error {
	if p.built {
		return fmt.Errorf("planning for %s: %w: Build already called", p.engine, ErrInvalid)
	}
	if it.Size == 0 {
		p.out.Dropped = append(p.out.Dropped, it.Tag)
		return nil
	}
	key := [2]MemoryID{it.Src, it.Dst}
	v, seen := p.pairs[key]
	if !seen {
		v = p.judgePair(it.Src, it.Dst)
		p.pairs[key] = v
	}
	if v.err != nil {
		return p.reject(it, v.err)
	}
	// Sizes are re-read on every Add: cheap, and the pair verdict holds the generation that matches them.
	src, _, srcGen, err := p.reg.lookup(it.Src)
	if err == nil && srcGen != v.srcGen {
		err = fmt.Errorf("memory %s: %w: registered again during planning", it.Src, ErrUnknownMemory)
	}
	if err != nil {
		return p.reject(it, fmt.Errorf("source: %w", err))
	}
	dst, _, dstGen, err := p.reg.lookup(it.Dst)
	if err == nil && dstGen != v.dstGen {
		err = fmt.Errorf("memory %s: %w: registered again during planning", it.Dst, ErrUnknownMemory)
	}
	if err != nil {
		return p.reject(it, fmt.Errorf("destination: %w", err))
	}
	if err := CheckBounds(it, src.Size, dst.Size); err != nil {
		return p.reject(it, err)
	}
	p.accepted = append(p.accepted, accepted{item: it, seq: len(p.accepted), dir: v.dir, srcGen: srcGen, dstGen: dstGen})
	return nil
}

// CheckBounds rejects an item whose source or destination range falls outside its region.
func CheckBounds(it Item, srcSize, dstSize uint64) error {
	if !fitsIn(it.SrcOffset, it.Size, srcSize) {
		return fmt.Errorf("%w: source range [%d, +%d) outside %s of %d bytes", ErrOutOfBounds, it.SrcOffset, it.Size, it.Src, srcSize)
	}
	if !fitsIn(it.DstOffset, it.Size, dstSize) {
		return fmt.Errorf("%w: destination range [%d, +%d) outside %s of %d bytes", ErrOutOfBounds, it.DstOffset, it.Size, it.Dst, dstSize)
	}
	return nil
}

// PairDirection returns the direction of a pair given which sides are local; ok is false when neither is.
func PairDirection(srcLocal, dstLocal bool) (Direction, bool) {
	switch {
	case srcLocal && dstLocal:
		return DirLocal, true
	case srcLocal:
		return DirWrite, true
	case dstLocal:
		return DirRead, true
	}
	return 0, false
}

func (p *planner) judgePair(srcID, dstID MemoryID) pairVerdict {
	src, srcLocal, srcGen, err := p.reg.lookup(srcID)
	if err != nil {
		return pairVerdict{err: fmt.Errorf("source: %w", err)}
	}
	dst, dstLocal, dstGen, err := p.reg.lookup(dstID)
	if err != nil {
		return pairVerdict{err: fmt.Errorf("destination: %w", err)}
	}
	dir, ok := PairDirection(srcLocal, dstLocal)
	if !ok {
		return pairVerdict{err: &UnplannableError{Src: srcID, Dst: dstID,
			Refusals: []Refusal{{Engine: p.engine, Reason: "neither region belongs to this node"}}}}
	}
	if ok, reason := p.can(src, dst); !ok {
		return pairVerdict{err: &UnplannableError{Src: srcID, Dst: dstID, Refusals: []Refusal{{Engine: p.engine, Reason: reason}}}}
	}
	return pairVerdict{dir: dir, srcGen: srcGen, dstGen: dstGen}
}

func (p *planner) reject(it Item, err error) error {
	ie := &ItemError{Item: it, Err: err}
	p.out.Rejected = append(p.out.Rejected, ie)
	return ie
}

func (p *planner) Build() *PlanSet {
	if p.built {
		return &PlanSet{owner: p.reg}
	}
	p.built = true
	out := &p.out
	out.owner = p.reg
	acc := p.accepted
	p.accepted = nil
	if len(acc) == 0 {
		return out
	}
	internIDs(acc)
	acc = rejectOverlaps(acc, func(it Item, err error) { p.reject(it, err) })

	// Group by pair, then order by source offset so runs contiguous on both sides meet.
	slices.SortFunc(acc, func(a, b accepted) int {
		return cmp.Or(cmp.Compare(a.srcKey, b.srcKey), cmp.Compare(a.dstKey, b.dstKey),
			cmp.Compare(a.item.SrcOffset, b.item.SrcOffset), cmp.Compare(a.item.DstOffset, b.item.DstOffset),
			cmp.Compare(a.seq, b.seq))
	})
	for start := 0; start < len(acc); {
		end := start + 1
		for end < len(acc) && acc[end].srcKey == acc[start].srcKey && acc[end].dstKey == acc[start].dstKey {
			end++
		}
		p.planPair(acc[start:end])
		start = end
	}
	return out
}

// internIDs numbers the distinct ids in their sort order, so sorting compares integers.
func internIDs(acc []accepted) {
	set := map[MemoryID]int{}
	for i := range acc {
		set[acc[i].item.Src] = 0
		set[acc[i].item.Dst] = 0
	}
	ids := make([]MemoryID, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i, id := range ids {
		set[id] = i
	}
	for i := range acc {
		acc[i].srcKey, acc[i].dstKey = set[acc[i].item.Src], set[acc[i].item.Dst]
	}
}

// rejectOverlaps drops every item whose destination range starts inside the range of an item before it in
// destination order (ties broken by the order items were added), calling reject for each.
func rejectOverlaps(acc []accepted, reject func(Item, error)) []accepted {
	slices.SortFunc(acc, func(a, b accepted) int {
		return cmp.Or(cmp.Compare(a.dstKey, b.dstKey), cmp.Compare(a.item.DstOffset, b.item.DstOffset), cmp.Compare(a.seq, b.seq))
	})
	kept := acc[:0]
	var end uint64
	lastKey := -1
	for _, a := range acc {
		if a.dstKey != lastKey {
			lastKey, end = a.dstKey, 0
		} else if a.item.DstOffset < end {
			reject(a.item, fmt.Errorf("%w: [%d, +%d) of %s", ErrOverlap, a.item.DstOffset, a.item.Size, a.item.Dst))
			continue
		}
		end = max(end, a.item.DstOffset+a.item.Size) // cannot overflow: bounds were checked
		kept = append(kept, a)
	}
	return kept
}

// planPair turns one pair's items (sorted) into plans.
func (p *planner) planPair(acc []accepted) {
	first := acc[0]
	newPlan := func() Plan {
		return Plan{Engine: p.engine, Direction: first.dir, Src: first.item.Src, Dst: first.item.Dst,
			srcGen: first.srcGen, dstGen: first.dstGen}
	}
	plan := newPlan()
	for start := 0; start < len(acc); {
		// A run: items contiguous on both sides.
		run := Segment{SrcOffset: acc[start].item.SrcOffset, DstOffset: acc[start].item.DstOffset, Size: acc[start].item.Size}
		end := start + 1
		for end < len(acc) {
			it := acc[end].item
			if it.SrcOffset != run.SrcOffset+run.Size || it.DstOffset != run.DstOffset+run.Size {
				break
			}
			run.Size += it.Size
			end++
		}
		pieces := 1
		if m := p.lim.MaxSegmentBytes; m > 0 {
			pieces = int((run.Size + m - 1) / m)
		}
		if p.lim.MaxPlanSegments > 0 && len(plan.Segments) > 0 && len(plan.Segments)+pieces > p.lim.MaxPlanSegments {
			p.out.Plans = append(p.out.Plans, plan)
			plan = newPlan()
		}
		appendSplit(&plan, run, p.lim.MaxSegmentBytes)
		for _, a := range acc[start:end] {
			plan.Tags = append(plan.Tags, a.item.Tag)
		}
		plan.Bytes += run.Size
		start = end
	}
	p.out.Plans = append(p.out.Plans, plan)
}

func appendSplit(plan *Plan, run Segment, maxBytes uint64) {
	for run.Size > 0 {
		n := run.Size
		if maxBytes > 0 && n > maxBytes {
			n = maxBytes
		}
		plan.Segments = append(plan.Segments, Segment{SrcOffset: run.SrcOffset, DstOffset: run.DstOffset, Size: n})
		run.SrcOffset += n
		run.DstOffset += n
		run.Size -= n
	}
}
