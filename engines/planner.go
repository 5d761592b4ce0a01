// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
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
	// BlockPlans: the engine takes block batches as plans in block form (Plan.Blocks) instead of one segment
	// per block.
	BlockPlans bool
}

// CanHandleFunc is an engine's pair test.
type CanHandleFunc func(src, dst *MemoryDesc) (bool, string)

// NewPlanner returns the plan builder engines use: items are checked against reg (known, same registration,
// in bounds, at least one side local, claimed by can) as they are added, and Build groups them per
// (source, destination) pair, rejects overlapping destinations, coalesces, splits at lim and orders the plans.
func NewPlanner(engine string, reg *Registry, lim Limits, can CanHandleFunc) PlanBuilder {
	return &planner{engine: engine, reg: reg, lim: lim, can: can, b: reg.getBatch()}
}

// pairInfo is what planning knows about one (source, destination) pair of a batch. Sizes and generations are
// read once per pair: a region re-registered during planning is caught at Submit by its generation.
type pairInfo struct {
	src, dst         MemoryID
	dir              Direction
	srcGen, dstGen   uint64
	srcSize, dstSize uint64
	srcKey, dstKey   int32 // ids numbered in sort order, set by intern
	engine           int   // composite: index of the engine that moves the pair
	err              error // the pair is refused
}

// entry is one accepted item, kept small because batches of KV blocks run to tens of thousands.
type entry struct {
	srcOff, dstOff, size uint64
	tag                  Tag
	pair, seq            int32
	srcKey, dstKey       int32
}

// batch holds a plan's items while they are added.
type batch struct {
	pairs   []pairInfo
	index   map[[2]MemoryID]int32
	entries []entry
	scratch sortScratch
	dup     dupScratch
	// last is the pair of the previous item (-1: none): items of one batch mostly share a pair, and comparing
	// two ids is cheaper than hashing them.
	last int32
}

// sortScratch is reused by the two sorts of a Build.
type sortScratch struct {
	keys, tmp []uint64
	pos       []int32
	entries   []entry
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// getBatch returns an empty batch, reusing the memory of one a finished planner gave back.
func (r *Registry) getBatch() *batch {
	if b, ok := r.batches.Get().(*batch); ok {
		return b
	}
	return &batch{index: map[[2]MemoryID]int32{}, last: -1}
}

// putBatch takes back a batch whose planner has built; nothing may use it afterwards.
func (r *Registry) putBatch(b *batch) {
	const keepEntries = 1 << 20 // do not hold on to the memory of an exceptional batch
	if cap(b.entries) > keepEntries {
		return
	}
	b.pairs = b.pairs[:0]
	clear(b.index)
	b.entries = b.entries[:0]
	b.last = -1
	r.batches.Put(b)
}

func (b *batch) item(e *entry) Item {
	p := &b.pairs[e.pair]
	return Item{Src: p.src, Dst: p.dst, SrcOffset: e.srcOff, DstOffset: e.dstOff, Size: e.size, Tag: e.tag}
}

// pairOf returns the pair's index, judging it with judge the first time it is seen.
func (b *batch) pairOf(src, dst MemoryID, judge func() pairInfo) int32 {
	if b.last >= 0 && b.pairs[b.last].src == src && b.pairs[b.last].dst == dst {
		return b.last
	}
	key := [2]MemoryID{src, dst}
	if i, ok := b.index[key]; ok {
		b.last = i
		return i
	}
	info := judge()
	info.src, info.dst = src, dst
	i := int32(len(b.pairs))
	b.pairs = append(b.pairs, info)
	b.index[key] = i
	b.last = i
	return i
}

func (b *batch) accept(pair int32, it Item) {
	b.entries = append(b.entries, entry{srcOff: it.SrcOffset, dstOff: it.DstOffset, size: it.Size, tag: it.Tag,
		pair: pair, seq: int32(len(b.entries))})
}

// intern numbers the distinct ids in their sort order, so sorting compares integers.
func (b *batch) intern() {
	var ids []MemoryID
	for _, p := range b.pairs {
		ids = append(ids, p.src, p.dst)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	key := func(id MemoryID) int32 { i, _ := slices.BinarySearch(ids, id); return int32(i) }
	for i := range b.pairs {
		b.pairs[i].srcKey, b.pairs[i].dstKey = key(b.pairs[i].src), key(b.pairs[i].dst)
	}
	for i := range b.entries {
		p := &b.pairs[b.entries[i].pair]
		b.entries[i].srcKey, b.entries[i].dstKey = p.srcKey, p.dstKey
	}
}

// rejectOverlaps drops every entry whose destination range starts inside the range of an entry before it in
// destination order (ties broken by the order items were added), calling reject for each. Call intern first.
func (b *batch) rejectOverlaps(reject func(Item, error)) {
	sortEntries(b.entries, &b.scratch, func(e *entry) int32 { return e.dstKey }, func(e *entry) uint64 { return e.dstOff }, nil)
	kept := b.entries[:0]
	var end uint64
	lastKey := int32(-1)
	for _, e := range b.entries {
		if e.dstKey != lastKey {
			lastKey, end = e.dstKey, 0
		} else if e.dstOff < end {
			it := b.item(&e)
			reject(it, fmt.Errorf("%w: [%d, +%d) of %s", ErrOverlap, it.DstOffset, it.Size, it.Dst))
			continue
		}
		end = max(end, e.dstOff+e.size) // cannot overflow: bounds were checked
		kept = append(kept, e)
	}
	b.entries = kept
}

// sortBySeq puts the entries back in the order their items were added.
func (b *batch) sortBySeq() {
	sortEntries(b.entries, &b.scratch, func(*entry) int32 { return 0 }, func(e *entry) uint64 { return uint64(e.seq) }, nil)
}

// groupByPair orders entries by pair, keeping their order within a pair. Called after rejectOverlaps, each pair's
// entries stay in destination order, where items contiguous on both sides are neighbours: destination ranges no
// longer overlap, so the item starting where another ends is the next one in its destination region. That makes
// a second sort (by source) unnecessary for coalescing.
func (b *batch) groupByPair() {
	if len(b.pairs) < 2 {
		return
	}
	start := make([]int, len(b.pairs)+1)
	for i := range b.entries {
		start[b.entries[i].pair+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	sc := &b.scratch
	sc.entries = grow(sc.entries, len(b.entries))
	for i := range b.entries {
		p := b.entries[i].pair
		sc.entries[start[p]] = b.entries[i]
		start[p]++
	}
	copy(b.entries, sc.entries)
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Packed sort keys: offset above seqBits bits of sequence number.
const (
	seqBits   = 20
	maxPacked = 1 << (64 - seqBits)
)

// sortEntries orders es by (group, off, tie, seq). The common batch (one group, offsets below 16 TiB, fewer
// than a million entries, no equal offsets needing tie) sorts packed integer keys, several times faster than
// comparing structs; anything else takes the general sort.
func sortEntries(es []entry, sc *sortScratch, group func(*entry) int32, off, tie func(*entry) uint64) {
	cmp := func(x, y *entry) int {
		if gx, gy := group(x), group(y); gx != gy {
			return int(gx - gy)
		}
		if c := compareU64(off(x), off(y)); c != 0 {
			return c
		}
		if tie != nil {
			if c := compareU64(tie(x), tie(y)); c != 0 {
				return c
			}
		}
		return int(x.seq - y.seq)
	}
	// An engine's planner fed by the composite gets its entries in destination order already.
	sorted := true
	for i := 1; i < len(es) && sorted; i++ {
		sorted = cmp(&es[i-1], &es[i]) < 0
	}
	if sorted || fastSort(es, sc, group, off, tie != nil) {
		return
	}
	slices.SortFunc(es, func(x, y entry) int {
		if gx, gy := group(&x), group(&y); gx != gy {
			return int(gx - gy)
		}
		if c := compareU64(off(&x), off(&y)); c != 0 {
			return c
		}
		if tie != nil {
			if c := compareU64(tie(&x), tie(&y)); c != 0 {
				return c
			}
		}
		return int(x.seq - y.seq)
	})
}

func fastSort(es []entry, sc *sortScratch, group func(*entry) int32, off func(*entry) uint64, needTie bool) bool {
	if len(es) < 2 || len(es) >= 1<<seqBits {
		return false
	}
	g := group(&es[0])
	maxSeq := int32(0)
	for i := range es {
		maxSeq = max(maxSeq, es[i].seq)
	}
	if maxSeq >= 1<<seqBits {
		return false
	}
	sc.keys = grow(sc.keys, len(es))
	sc.pos = grow(sc.pos, int(maxSeq)+1) // seq -> index in es
	keys, pos := sc.keys, sc.pos
	for i := range es {
		e := &es[i]
		o := off(e)
		if group(e) != g || o >= maxPacked {
			return false
		}
		keys[i] = o<<seqBits | uint64(e.seq)
		pos[e.seq] = int32(i)
	}
	sc.tmp = grow(sc.tmp, len(keys))
	radixSort(keys, sc.tmp)
	if needTie {
		for i := 1; i < len(keys); i++ {
			if keys[i]>>seqBits == keys[i-1]>>seqBits {
				return false // equal offsets: the tie-breaker decides, take the general sort
			}
		}
	}
	sc.entries = grow(sc.entries, len(es))
	sorted := sc.entries
	for i, k := range keys {
		sorted[i] = es[pos[k&(1<<seqBits-1)]]
	}
	copy(es, sorted)
	return true
}

type planner struct {
	engine string
	reg    *Registry
	lim    Limits
	can    CanHandleFunc

	b      *batch
	out    PlanSet
	built  bool
	blocks blockPlans
}

func (p *planner) Add(it Item) error {
	if p.blocks.added {
		return p.reject(it, fmt.Errorf("planning for %s: %w: a plan with a block batch takes no items", p.engine, ErrInvalid))
	}
	if p.built {
		return fmt.Errorf("planning for %s: %w: Build already called", p.engine, ErrInvalid)
	}
	if it.Size == 0 {
		p.out.Dropped = append(p.out.Dropped, it.Tag)
		return nil
	}
	i := p.b.pairOf(it.Src, it.Dst, func() pairInfo { return p.judgePair(it.Src, it.Dst) })
	pi := &p.b.pairs[i]
	if pi.err != nil {
		return p.reject(it, pi.err)
	}
	if err := CheckBounds(it, pi.srcSize, pi.dstSize); err != nil {
		return p.reject(it, err)
	}
	p.b.accept(i, it)
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

func (p *planner) judgePair(srcID, dstID MemoryID) pairInfo {
	src, srcLocal, srcGen, err := p.reg.lookup(srcID)
	if err != nil {
		return pairInfo{err: fmt.Errorf("source: %w", err)}
	}
	dst, dstLocal, dstGen, err := p.reg.lookup(dstID)
	if err != nil {
		return pairInfo{err: fmt.Errorf("destination: %w", err)}
	}
	dir, ok := PairDirection(srcLocal, dstLocal)
	if !ok {
		return pairInfo{err: &UnplannableError{Src: srcID, Dst: dstID,
			Refusals: []Refusal{{Engine: p.engine, Reason: "neither region belongs to this node"}}}}
	}
	if ok, reason := p.can(src, dst); !ok {
		return pairInfo{err: &UnplannableError{Src: srcID, Dst: dstID, Refusals: []Refusal{{Engine: p.engine, Reason: reason}}}}
	}
	return pairInfo{dir: dir, srcGen: srcGen, dstGen: dstGen, srcSize: src.Size, dstSize: dst.Size}
}

func (p *planner) reject(it Item, err error) error {
	ie := &ItemError{Item: it, Err: err}
	p.out.Rejected = append(p.out.Rejected, ie)
	return ie
}

func (p *planner) Build() *PlanSet {
	if p.built {
		return &PlanSet{owner: p.reg, planner: p.engine}
	}
	p.built = true
	out := &p.out
	out.owner, out.planner = p.reg, p.engine
	if p.blocks.added {
		p.buildBlocks()
		p.reg.putBatch(p.b)
		p.b = nil
		return out
	}
	if len(p.b.entries) == 0 {
		return out
	}
	p.b.intern()
	p.b.rejectOverlaps(func(it Item, err error) { p.reject(it, err) })
	p.b.groupByPair()
	p.b.eachPair(func(es []entry) { planPair(out, p.engine, p.lim, &p.b.pairs[es[0].pair], es) })
	p.reg.putBatch(p.b)
	p.b = nil
	return out
}

// eachPair calls fn with each pair's run of entries, in order; call groupByPair first.
func (b *batch) eachPair(fn func(es []entry)) {
	es := b.entries
	for start := 0; start < len(es); {
		end := start + 1
		for end < len(es) && es[end].pair == es[start].pair {
			end++
		}
		fn(es[start:end])
		start = end
	}
}

// planPair turns one pair's entries (sorted by destination) into plans of engine with its limits, appended to
// out. Engine planners and the composite (planning for the engines that share its registry) both call it.
func planPair(out *PlanSet, engine string, lim Limits, info *pairInfo, es []entry) {
	newPlan := func() Plan {
		n := len(es)
		if lim.MaxPlanSegments > 0 {
			n = min(n, lim.MaxPlanSegments)
		}
		return Plan{Engine: engine, Direction: info.dir, Src: info.src, Dst: info.dst, srcGen: info.srcGen, dstGen: info.dstGen,
			Segments: make([]Segment, 0, n), Tags: make([]Tag, 0, n)}
	}
	plan := newPlan()
	for start := 0; start < len(es); {
		// A run: entries contiguous on both sides.
		run := Segment{SrcOffset: es[start].srcOff, DstOffset: es[start].dstOff, Size: es[start].size}
		end := start + 1
		for end < len(es) && es[end].srcOff == run.SrcOffset+run.Size && es[end].dstOff == run.DstOffset+run.Size {
			run.Size += es[end].size
			end++
		}
		pieces := 1
		if m := lim.MaxSegmentBytes; m > 0 {
			pieces = int((run.Size + m - 1) / m)
		}
		if lim.MaxPlanSegments > 0 && len(plan.Segments) > 0 && len(plan.Segments)+pieces > lim.MaxPlanSegments {
			out.Plans = append(out.Plans, plan)
			plan = newPlan()
		}
		appendSplit(&plan, run, lim.MaxSegmentBytes)
		for _, e := range es[start:end] {
			plan.Tags = append(plan.Tags, e.tag)
		}
		plan.Bytes += run.Size
		start = end
	}
	out.Plans = append(out.Plans, plan)
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

// radixSort sorts keys in place with a least-significant-digit radix sort of 11-bit digits, as many passes as
// the largest key needs: several times faster than comparison sorting on the tens of thousands of packed keys
// a KV batch has.
// tmp must be as long as keys.
func radixSort(keys, tmp []uint64) {
	if len(keys) < 256 {
		slices.Sort(keys)
		return
	}
	const bits = 11
	var top uint64
	for _, k := range keys {
		top |= k
	}
	src, dst := keys, tmp
	var count [1 << bits]int
	for shift := uint(0); shift < 64 && top>>shift != 0; shift += bits {
		clear(count[:])
		for _, k := range src {
			count[(k>>shift)&(1<<bits-1)]++
		}
		sum := 0
		for i, c := range count {
			count[i] = sum
			sum += c
		}
		for _, k := range src {
			d := (k >> shift) & (1<<bits - 1)
			dst[count[d]] = k
			count[d]++
		}
		src, dst = dst, src
	}
	if &src[0] != &keys[0] {
		copy(keys, src)
	}
}
