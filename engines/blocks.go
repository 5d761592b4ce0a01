// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// BlockPair is one (source, destination) region pair of a block batch.
type BlockPair struct {
	Src, Dst MemoryID
}

// Blocks asks for the same block moves between several region pairs, the data model of a paged KV cache (every
// layer's K and V tensor cut into numbered blocks of one size): for every pair p and every i, BlockBytes bytes
// move from block SrcIDs[i] of Pairs[p].Src to block DstIDs[i] of Pairs[p].Dst.
type Blocks struct {
	Pairs          []BlockPair
	BlockBytes     uint64
	SrcIDs, DstIDs []uint32
	Tag            Tag

	// shape is what the composite found checking the batch, handed to the engine planner with it; deferred
	// says the composite left the ids to the engine (RunChecker), which plans the batch Unchecked.
	shape    *blockShape
	deferred bool
}

// BlockList is a plan in block form: segment i copies BlockBytes bytes from offset SrcIDs[i]*BlockBytes of the
// plan's source to offset DstIDs[i]*BlockBytes of its destination. The plans of one batch share it; nobody
// writes it after planning.
type BlockList struct {
	BlockBytes     uint64
	SrcIDs, DstIDs []uint32
	// The smallest and largest id of each side, found at planning (zero while Unchecked).
	SrcMin, SrcMax, DstMin, DstMax uint32
	// Unchecked: planning left the ids to the engine that runs the list (RunChecker). Every id must then be
	// below SrcBlocks / DstBlocks (the smallest region of each side, in blocks) and no destination id may
	// repeat; whoever runs the list checks that before moving anything, on the device or with Check.
	Unchecked            bool
	SrcBlocks, DstBlocks uint32

	checkOnce sync.Once
	checkErr  error
}

// RunChecker is implemented by engines that can check a block batch's ids themselves as they run it (on the
// GPU, beside the copy), so planning skips its passes over the ids. The composite asks per pair, with the
// batch's id count (a short list is checked faster on the host than by a second kernel launch).
type RunChecker interface {
	ChecksBlocksAtRun(src, dst *MemoryDesc, blockBytes uint64, ids int) bool
}

// Check checks an Unchecked list on the host (ids in range, no repeated destination) and fills its id ranges,
// once however many plans of the list call it, concurrently or not; a list planning checked passes.
func (l *BlockList) Check() error {
	if !l.Unchecked {
		return nil
	}
	l.checkOnce.Do(func() { l.checkErr = l.check() })
	return l.checkErr
}

func (l *BlockList) check() error {
	l.SrcMin, l.SrcMax = idRange(l.SrcIDs)
	l.DstMin, l.DstMax = idRange(l.DstIDs)
	if len(l.SrcIDs) > 0 && l.SrcMax >= l.SrcBlocks {
		i := slices.IndexFunc(l.SrcIDs, func(v uint32) bool { return v >= l.SrcBlocks })
		return fmt.Errorf("%w: source block %d (entry %d) is outside the source's %d blocks", ErrOutOfBounds, l.SrcIDs[i], i, l.SrcBlocks)
	}
	if len(l.DstIDs) > 0 && l.DstMax >= l.DstBlocks {
		i := slices.IndexFunc(l.DstIDs, func(v uint32) bool { return v >= l.DstBlocks })
		return fmt.Errorf("%w: destination block %d (entry %d) is outside the destination's %d blocks", ErrOutOfBounds, l.DstIDs[i], i, l.DstBlocks)
	}
	var scratch dupScratch
	if i, ok := firstDuplicate(l.DstIDs, l.DstMax, &scratch); ok {
		return fmt.Errorf("%w: destination block %d is named twice (entry %d)", ErrOverlap, l.DstIDs[i], i)
	}
	return nil
}

// Bytes is the size of one plan of the list.
func (l *BlockList) Bytes() uint64 { return uint64(len(l.SrcIDs)) * l.BlockBytes }

// BlockAdder is implemented by plan builders that take block batches whole, without an item per block: the
// composite, and the planner of an engine whose Limits set BlockPlans. A builder takes either items or one block
// batch: mixing them, or a second batch, is refused (the overlap check covers one batch).
type BlockAdder interface {
	// AddBlocks accepts the batch (nil) or rejects it whole with an *ItemError naming the first bad pair (also
	// recorded in PlanSet.Rejected). Empty id lists are dropped.
	AddBlocks(b Blocks) error
}

// SegmentsOf returns the plan's segments, expanding a block list (for backends that copy segments).
func SegmentsOf(p *Plan) []Segment {
	if p.Blocks == nil {
		return p.Segments
	}
	l := p.Blocks
	segs := make([]Segment, len(l.SrcIDs))
	for i := range segs {
		segs[i] = Segment{SrcOffset: uint64(l.SrcIDs[i]) * l.BlockBytes, DstOffset: uint64(l.DstIDs[i]) * l.BlockBytes, Size: l.BlockBytes}
	}
	return segs
}

// InSegments returns p as segments: p itself when it has no block list, else a copy whose block list is
// expanded (for backends that copy segments only).
func InSegments(p *Plan) *Plan {
	if p.Blocks == nil {
		return p
	}
	q := *p
	q.Segments, q.Blocks = SegmentsOf(p), nil
	return &q
}

// blockShape is what checking a batch's ids found.
type blockShape struct {
	minSrc, maxSrc, minDst, maxDst uint32
}

// dupScratch is a reusable bitmap for the duplicate-destination check.
type dupScratch struct{ words []uint64 }

// shortIDList is the longest id list checked for duplicates pair by pair (at most 120 comparisons).
const shortIDList = 16

// maxBitmapIDs bounds the bitmap of the duplicate check (2 MiB); sparser id lists are sorted instead.
const maxBitmapIDs = 1 << 24

// checkBlockIDs checks a batch's geometry and ids once: equal counts, a block size, distinct destination
// regions and (with checkDup) distinct destination ids. It returns the largest ids for the bounds checks.
func checkBlockIDs(b *Blocks, scratch *dupScratch, checkDup bool) (blockShape, error) {
	var sh blockShape
	switch {
	case len(b.SrcIDs) != len(b.DstIDs):
		return sh, fmt.Errorf("%w: %d source block ids and %d destination block ids", ErrInvalid, len(b.SrcIDs), len(b.DstIDs))
	case b.BlockBytes == 0:
		return sh, fmt.Errorf("%w: block size 0", ErrInvalid)
	case len(b.Pairs) == 0:
		return sh, fmt.Errorf("%w: no region pairs", ErrInvalid)
	}
	if dst, dup := repeatedDestination(b.Pairs); dup {
		return sh, fmt.Errorf("%w: destination region %s appears twice in the batch", ErrOverlap, dst)
	}
	if b.deferred {
		return sh, nil
	}
	if b.shape != nil {
		sh = *b.shape
	} else {
		sh.minSrc, sh.maxSrc = idRange(b.SrcIDs)
		sh.minDst, sh.maxDst = idRange(b.DstIDs)
	}
	if !checkDup {
		return sh, nil
	}
	if i, ok := firstDuplicate(b.DstIDs, sh.maxDst, scratch); ok {
		return sh, fmt.Errorf("%w: destination block %d is named twice (entry %d)", ErrOverlap, b.DstIDs[i], i)
	}
	return sh, nil
}

// repeatedDestination returns a destination region two pairs name, if any: pair by pair for a few pairs (a
// layout of a tensor or two, the usual batch: no map to allocate), through a map for more.
func repeatedDestination(pairs []BlockPair) (MemoryID, bool) {
	if len(pairs) <= 16 {
		for i := 1; i < len(pairs); i++ {
			for j := range i {
				if pairs[j].Dst == pairs[i].Dst {
					return pairs[i].Dst, true
				}
			}
		}
		return "", false
	}
	seen := make(map[MemoryID]struct{}, len(pairs))
	for _, p := range pairs {
		if _, dup := seen[p.Dst]; dup {
			return p.Dst, true
		}
		seen[p.Dst] = struct{}{}
	}
	return "", false
}

// idRange returns the smallest and largest id (0, 0 for none), four lanes at a time.
func idRange(ids []uint32) (lo, hi uint32) {
	if len(ids) == 0 {
		return 0, 0
	}
	l0, l1, l2, l3 := ids[0], ids[0], ids[0], ids[0]
	var h0, h1, h2, h3 uint32
	i := 0
	for ; i+4 <= len(ids); i += 4 {
		a, b, c, d := ids[i], ids[i+1], ids[i+2], ids[i+3]
		l0, l1, l2, l3 = min(l0, a), min(l1, b), min(l2, c), min(l3, d)
		h0, h1, h2, h3 = max(h0, a), max(h1, b), max(h2, c), max(h3, d)
	}
	for ; i < len(ids); i++ {
		l0, h0 = min(l0, ids[i]), max(h0, ids[i])
	}
	return min(l0, l1, l2, l3), max(h0, h1, h2, h3)
}

// firstDuplicate returns the index of the first id seen before: by comparing each id with those before it when
// the list is short, with a bitmap when the ids are dense enough, and with a sort otherwise.
func firstDuplicate(ids []uint32, maxID uint32, scratch *dupScratch) (int, bool) {
	if len(ids) <= shortIDList {
		for i := 1; i < len(ids); i++ {
			if slices.Contains(ids[:i], ids[i]) {
				return i, true
			}
		}
		return 0, false
	}
	if uint64(maxID) < maxBitmapIDs {
		n := int(maxID/64) + 1
		if cap(scratch.words) < n {
			scratch.words = make([]uint64, n)
		}
		w := scratch.words[:n]
		dup := -1
		for i, id := range ids {
			m, x := uint64(1)<<(id&63), w[id>>6]
			if x&m != 0 {
				dup = i
				break
			}
			w[id>>6] = x | m
		}
		// The bitmap is reused, so it is left empty: a few ids in a large pool unset their own words (a clear of
		// the whole map would cost a call of 16 ids among 2^24 blocks 2 MiB of writes), many ids clear it at once.
		set := ids
		if dup >= 0 {
			set = ids[:dup]
		}
		if len(set) < n/4 {
			for _, id := range set {
				w[id>>6] = 0
			}
		} else {
			clear(w)
		}
		return dup, dup >= 0
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return slices.Index(ids, sorted[i]), true
		}
	}
	return 0, false
}

// blockFits reports whether blocks up to maxID of size bs lie inside a region of size bytes.
func blockFits(maxID uint32, bs, size uint64) bool {
	hi, end := bits.Mul64(uint64(maxID)+1, bs)
	return hi == 0 && end <= size
}

// checkBlockBounds rejects a pair whose largest block falls outside either region.
func checkBlockBounds(b *Blocks, sh blockShape, p BlockPair, srcSize, dstSize uint64) error {
	if !blockFits(sh.maxSrc, b.BlockBytes, srcSize) {
		return fmt.Errorf("%w: source block %d of %d bytes ends outside %s of %d bytes", ErrOutOfBounds, sh.maxSrc, b.BlockBytes, p.Src, srcSize)
	}
	if !blockFits(sh.maxDst, b.BlockBytes, dstSize) {
		return fmt.Errorf("%w: destination block %d of %d bytes ends outside %s of %d bytes", ErrOutOfBounds, sh.maxDst, b.BlockBytes, p.Dst, dstSize)
	}
	return nil
}

// blockItem names a pair of a batch in an ItemError: the first block of the pair.
func blockItem(b *Blocks, p BlockPair) Item {
	it := Item{Src: p.Src, Dst: p.Dst, Size: b.BlockBytes, Tag: b.Tag}
	if len(b.SrcIDs) > 0 {
		it.SrcOffset, it.DstOffset = uint64(b.SrcIDs[0])*b.BlockBytes, uint64(b.DstIDs[0])*b.BlockBytes
	}
	return it
}

// expandBlocks adds a batch's blocks as items, for planners that take no block batches.
func expandBlocks(pb PlanBuilder, b *Blocks, pairs []BlockPair) error {
	for _, p := range pairs {
		for i := range b.SrcIDs {
			if err := pb.Add(Item{Src: p.Src, Dst: p.Dst, SrcOffset: uint64(b.SrcIDs[i]) * b.BlockBytes,
				DstOffset: uint64(b.DstIDs[i]) * b.BlockBytes, Size: b.BlockBytes, Tag: b.Tag}); err != nil {
				return err
			}
		}
	}
	return nil
}

// blockPlans are the block batch of a planner: the pairs it accepted and the shared list.
type blockPlans struct {
	pairs []pairInfo
	list  *BlockList
	tag   Tag
	added bool
}

// AddBlocks implements BlockAdder for engines whose Limits set BlockPlans; for the others it adds one item per
// block, so every engine planner takes a batch.
func (p *planner) AddBlocks(b Blocks) error {
	if p.built || len(p.b.entries) > 0 || p.blocks.added {
		return p.reject(blockItem(&b, firstPair(b)), fmt.Errorf("%w: a plan takes one block batch and no items beside it", ErrInvalid))
	}
	if len(b.SrcIDs) == 0 && len(b.DstIDs) == 0 {
		p.out.Dropped = append(p.out.Dropped, b.Tag)
		return nil
	}
	if !p.lim.BlockPlans {
		return expandBlocks(p, &b, b.Pairs)
	}
	p.blocks.added = true
	sh, err := checkBlockIDs(&b, &p.b.dup, true)
	if err != nil {
		return p.reject(blockItem(&b, firstPair(b)), err)
	}
	infos := make([]pairInfo, 0, len(b.Pairs))
	srcBlocks, dstBlocks := uint64(math.MaxUint32), uint64(math.MaxUint32)
	for _, bp := range b.Pairs {
		info := p.judgePair(bp.Src, bp.Dst)
		info.src, info.dst = bp.Src, bp.Dst
		if info.err == nil && !b.deferred {
			info.err = checkBlockBounds(&b, sh, bp, info.srcSize, info.dstSize)
		}
		if info.err != nil {
			return p.reject(blockItem(&b, bp), info.err)
		}
		srcBlocks, dstBlocks = min(srcBlocks, info.srcSize/b.BlockBytes), min(dstBlocks, info.dstSize/b.BlockBytes)
		infos = append(infos, info)
	}
	p.blocks.pairs, p.blocks.tag = infos, b.Tag
	p.blocks.list = &BlockList{BlockBytes: b.BlockBytes, SrcIDs: b.SrcIDs, DstIDs: b.DstIDs,
		SrcMin: sh.minSrc, SrcMax: sh.maxSrc, DstMin: sh.minDst, DstMax: sh.maxDst,
		Unchecked: b.deferred, SrcBlocks: uint32(srcBlocks), DstBlocks: uint32(dstBlocks)}
	return nil
}

func firstPair(b Blocks) BlockPair {
	if len(b.Pairs) == 0 {
		return BlockPair{}
	}
	return b.Pairs[0]
}

// buildBlocks emits one plan per accepted pair of the block batch, in the order the pairs were given.
func (p *planner) buildBlocks() {
	for _, info := range p.blocks.pairs {
		p.out.Plans = append(p.out.Plans, Plan{Engine: p.engine, Direction: info.dir, Src: info.src, Dst: info.dst,
			srcGen: info.srcGen, dstGen: info.dstGen, Blocks: p.blocks.list, Tags: []Tag{p.blocks.tag}, Bytes: p.blocks.list.Bytes()})
	}
}

// compositeBlocks is the composite planner's block batch: the pairs by the engine that moves them.
type compositeBlocks struct {
	batch  Blocks
	engine []int // per pair; nil when the composite plans for the engines (infos has it)
	// infos is, per pair, what judging it found (engine, sizes, generations, direction), kept in the planner's
	// pooled batch when the composite plans for the engines.
	infos []pairInfo
	shape blockShape
	added bool
	// dupChecked: the destination ids were checked for repeats, with dupErr the outcome.
	dupChecked bool
	dupErr     error
}

// AddBlocks implements BlockAdder: the batch is checked once (geometry, bounds, a route per pair) and handed to
// each engine's planner with the pairs that engine moves. Destination ids are checked for duplicates by the
// engine planners (block form, or the item planner's overlap check); distinct destination regions keep engines
// from overlapping one another.
func (p *compositePlanner) AddBlocks(b Blocks) error {
	if p.built || len(p.b.entries) > 0 || p.blocks.added {
		return p.reject(blockItem(&b, firstPair(b)), fmt.Errorf("planning: %w: a plan takes one block batch and no items beside it", ErrInvalid), 0)
	}
	if len(b.SrcIDs) == 0 && len(b.DstIDs) == 0 {
		p.out.Dropped = append(p.out.Dropped, b.Tag)
		return nil
	}
	p.blocks.added = true
	b.deferred = p.checkedAtRun(&b)
	sh, err := checkBlockIDs(&b, &p.b.dup, false)
	if err != nil {
		return p.reject(blockItem(&b, firstPair(b)), err, 0)
	}
	var engs []int
	infos := p.b.pairs[:0]
	if !p.c.shared {
		engs = make([]int, len(b.Pairs))
	}
	for i, bp := range b.Pairs {
		info := p.judgePair(bp.Src, bp.Dst)
		if info.err == nil && !b.deferred {
			info.err = checkBlockBounds(&b, sh, bp, info.srcSize, info.dstSize)
		}
		if info.err != nil {
			return p.reject(blockItem(&b, bp), info.err, info.dir)
		}
		if p.c.shared {
			info.src, info.dst = bp.Src, bp.Dst
			infos = append(infos, info)
		} else {
			engs[i] = info.engine
		}
	}
	p.b.pairs = infos
	p.blocks.batch, p.blocks.engine, p.blocks.infos, p.blocks.shape = b, engs, infos, sh
	if !b.deferred {
		p.blocks.batch.shape = &p.blocks.shape // the planner's own copy: sh stays on the stack
	}
	return nil
}

// checkedAtRun reports whether every pair of b routes to an engine that checks block ids as it runs them
// (RunChecker), so that planning may leave the passes over the ids to it.
func (p *compositePlanner) checkedAtRun(b *Blocks) bool {
	if len(b.Pairs) == 0 || len(b.SrcIDs) != len(b.DstIDs) || b.BlockBytes == 0 {
		return false
	}
	for _, bp := range b.Pairs {
		src, _, err := p.c.reg.Lookup(bp.Src)
		if err != nil {
			return false
		}
		dst, _, err := p.c.reg.Lookup(bp.Dst)
		if err != nil {
			return false
		}
		r := p.c.routeFor(src, dst)
		if r.engine < 0 {
			return false
		}
		rc, ok := p.c.engines[r.engine].(RunChecker)
		if !ok || !rc.ChecksBlocksAtRun(src, dst, b.BlockBytes, len(b.SrcIDs)) {
			return false
		}
	}
	return true
}

// buildBlocks hands the batch to the engines' planners, in engine order, each with its pairs in the order given.
func (p *compositePlanner) buildBlocks(out *PlanSet) {
	b := &p.blocks.batch
	if p.c.shared {
		var planned [4]bool // at most one engine of each kind
		for i := range p.blocks.infos {
			planned[p.blocks.infos[i].engine] = true
		}
		for eng, ok := range planned {
			if ok {
				p.addPart(out, p.planBlocks(eng))
			}
		}
		return
	}
	for eng := range p.c.engines {
		var pairs []BlockPair
		for i, e := range p.blocks.engine {
			if e == eng {
				pairs = append(pairs, b.Pairs[i])
			}
		}
		if len(pairs) == 0 {
			continue
		}
		pb := p.c.engines[eng].NewPlan()
		sub := *b
		sub.Pairs = pairs
		if ba, ok := pb.(BlockAdder); ok {
			_ = ba.AddBlocks(sub) // a refusal is recorded in the part's Rejected
		} else {
			_ = expandBlocks(pb, &sub, pairs)
		}
		p.addPart(out, pb.Build())
	}
}

// blockPart is an engine's part of a composite block batch in block form, with what its plans point to.
type blockPart struct {
	PlanSet
	list  BlockList
	plans [1]Plan
	tags  [1]Tag
}

// planBlocks plans engine eng's pairs of the checked block batch, for an engine sharing the composite's
// registry, as its own planner would have: in block form when its limits take block plans (the destination
// ids checked for repeats once per batch, however many engines take it), else one entry per block through the
// overlap check and the coalescing of items.
func (p *compositePlanner) planBlocks(eng int) *PlanSet {
	b := &p.blocks.batch
	lim := p.c.limits[eng]
	infos := p.blocks.infos
	if lim.BlockPlans {
		// The part, its block list, its plan (one per pair: usually one) and their tags in one allocation; the
		// plans share the tags, which nothing writes.
		bp := &blockPart{PlanSet: PlanSet{owner: p.c.reg, planner: p.c.engines[eng].Name()}, tags: [1]Tag{b.Tag}}
		part := &bp.PlanSet
		part.Plans = bp.plans[:0]
		first := -1
		srcBlocks, dstBlocks := uint64(math.MaxUint32), uint64(math.MaxUint32)
		for i := range infos {
			if infos[i].engine == eng {
				if first < 0 {
					first = i
				}
				srcBlocks, dstBlocks = min(srcBlocks, infos[i].srcSize/b.BlockBytes), min(dstBlocks, infos[i].dstSize/b.BlockBytes)
			}
		}
		if err := p.blocksDuplicate(); err != nil {
			part.Rejected = append(part.Rejected, &ItemError{Item: blockItem(b, BlockPair{Src: infos[first].src, Dst: infos[first].dst}), Err: err})
			return part
		}
		sh := p.blocks.shape
		list := &bp.list
		*list = BlockList{BlockBytes: b.BlockBytes, SrcIDs: b.SrcIDs, DstIDs: b.DstIDs,
			SrcMin: sh.minSrc, SrcMax: sh.maxSrc, DstMin: sh.minDst, DstMax: sh.maxDst,
			Unchecked: b.deferred, SrcBlocks: uint32(srcBlocks), DstBlocks: uint32(dstBlocks)}
		for i := range infos {
			if info := &infos[i]; info.engine == eng {
				part.Plans = append(part.Plans, Plan{Engine: part.planner, Direction: info.dir, Src: info.src, Dst: info.dst,
					srcGen: info.srcGen, dstGen: info.dstGen, Blocks: list, Tags: bp.tags[:], Bytes: list.Bytes()})
			}
		}
		return part
	}
	part := p.c.newPart(eng)
	// One entry per block, in the order an engine planner fed block by block would have taken them. The
	// batch's pairs were checked; the entries are bounded by the batch's shape, or checked one by one when the
	// ids were left to the engine (as its planner's Add did, stopping at the first refusal).
	bt := p.c.reg.getBatch()
	defer p.c.reg.putBatch(bt)
	for i := range infos {
		if infos[i].engine == eng {
			bt.pairs = append(bt.pairs, infos[i])
		}
	}
expand:
	for k := range bt.pairs {
		pi := &bt.pairs[k]
		for i := range b.SrcIDs {
			it := Item{Src: pi.src, Dst: pi.dst, SrcOffset: uint64(b.SrcIDs[i]) * b.BlockBytes,
				DstOffset: uint64(b.DstIDs[i]) * b.BlockBytes, Size: b.BlockBytes, Tag: b.Tag}
			if b.deferred {
				if err := CheckBounds(it, pi.srcSize, pi.dstSize); err != nil {
					part.Rejected = append(part.Rejected, &ItemError{Item: it, Err: err})
					break expand
				}
			}
			bt.accept(int32(k), it)
		}
	}
	if len(bt.entries) == 0 {
		return part
	}
	bt.intern()
	bt.rejectOverlaps(func(it Item, err error) { part.Rejected = append(part.Rejected, &ItemError{Item: it, Err: err}) })
	bt.groupByPair()
	bt.eachPair(func(es []entry) { planPair(part, part.planner, lim, &bt.pairs[es[0].pair], es) })
	return part
}

// blocksDuplicate checks the batch's destination ids for repeats, once per batch (nil when planning left the
// ids to the engine that runs them).
func (p *compositePlanner) blocksDuplicate() error {
	bl := &p.blocks
	if bl.batch.deferred {
		return nil
	}
	if !bl.dupChecked {
		bl.dupChecked = true
		if i, ok := firstDuplicate(bl.batch.DstIDs, bl.shape.maxDst, &p.b.dup); ok {
			bl.dupErr = fmt.Errorf("%w: destination block %d is named twice (entry %d)", ErrOverlap, bl.batch.DstIDs[i], i)
		}
	}
	return bl.dupErr
}
