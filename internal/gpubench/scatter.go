// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpubench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
)

// itemSets are distinct random block choices; repetitions rotate through
// them so no run finds the previous one's blocks in L2.
const itemSets = 4

func (b *bench) scatter(sc ScatterCase) error {
	pool := uint64(sc.PoolBlocks) * sc.Size
	src, dst, srcID, dstID, free, err := b.regions(pool, 2)
	if err != nil {
		return err
	}
	defer free()
	r := rand.New(rand.NewPCG(uint64(sc.Count), sc.Size))
	pick := func() ([]engines.Item, []cudacopy.Segment) {
		var items []engines.Item
		var segs []cudacopy.Segment
		from, to := r.Perm(sc.PoolBlocks)[:sc.Count], r.Perm(sc.PoolBlocks)[:sc.Count]
		for i := range from {
			it := engines.Item{Src: srcID, SrcOffset: uint64(from[i]) * sc.Size, Dst: dstID, DstOffset: uint64(to[i]) * sc.Size,
				Size: sc.Size, Tag: engines.Tag(i)}
			items = append(items, it)
			segs = append(segs, cudacopy.Segment{Src: uint64(src) + it.SrcOffset, Dst: uint64(dst) + it.DstOffset, Size: sc.Size})
		}
		return items, segs
	}
	sets := make([][]engines.Item, itemSets)
	segs := make([][]cudacopy.Segment, itemSets)
	for k := range sets {
		sets[k], segs[k] = pick()
	}
	bytes := uint64(sc.Count) * sc.Size
	c := fmt.Sprintf("%d x %d B", sc.Count, sc.Size)

	// Through the engine, the whole host path with a block list it has never
	// seen each time: its descriptors cross PCIe.
	newList := sets[0]
	err = b.engineSeries(c, bytes, "xgmi engine (plan+submit+wait), new block list", "new block list each time: descriptors read across PCIe", 2,
		func(i int) ([]engines.Item, *engines.PlanSet) {
			if i > -2 {
				newList, _ = pick()
			}
			return newList, nil
		})
	if err != nil {
		return err
	}
	if err := b.check(src, dst, newList); err != nil {
		return fmt.Errorf("engine result, new block list: %w", err)
	}
	// Planned sets submitted again: their descriptors stay on the GPU.
	planned := make([]*engines.PlanSet, itemSets)
	for k := range planned {
		if _, planned[k], err = b.engineRun(sets[k], nil); err != nil {
			return err
		}
	}
	err = b.engineSeries(c, bytes, "xgmi engine (submit+wait), planned set again",
		fmt.Sprintf("%d planned sets in turn, submitted again: descriptors kept on the GPU", itemSets), itemSets,
		func(i int) ([]engines.Item, *engines.PlanSet) { return nil, planned[(i+itemSets)%itemSets] })
	if err != nil {
		return err
	}
	if err := b.check(src, dst, sets[(b.cfg.Reps-1+itemSets)%itemSets]); err != nil {
		return fmt.Errorf("engine result, planned set again: %w", err)
	}
	if err := b.layers(sc, c, bytes); err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	// Several planned submissions in flight: host staging of one overlaps the
	// GPU work of another (the sets write different random blocks).
	var flight []time.Duration
	for i := -1; i < b.cfg.Reps; i++ {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var trs []engines.Transfer
		for k := range planned {
			tr, err := b.eng.Submit(ctx, planned[k], engines.SubmitOptions{})
			if err != nil {
				cancel()
				return err
			}
			trs = append(trs, tr)
		}
		for _, tr := range trs {
			if err := tr.Wait(ctx); err != nil {
				cancel()
				return err
			}
		}
		cancel()
		if i >= 0 {
			flight = append(flight, time.Since(start))
		}
	}
	b.add(summarize(c, fmt.Sprintf("xgmi engine, %d planned in flight", itemSets), bytes*itemSets, flight, "host wall clock for all of them"))

	// The kernel alone: descriptors uploaded beforehand, launches timed.
	if b.kern.Mode() == cudacopy.ModeKernel {
		preps := make([]*cudacopy.Prepared, itemSets)
		for k := range preps {
			if preps[k], err = b.kern.Prepare(segs[k]); err != nil {
				return err
			}
			defer preps[k].Release()
		}
		t, err := b.deviceTime(b.kern.Stream(), 2, b.cfg.Reps, func(i int) error { return preps[(i+itemSets)%itemSets].Launch() })
		if err != nil {
			return err
		}
		b.add(summarize(c, "kernel only (descriptors resident)", bytes, t, "device events"))
		// The same, events queued around the launch as it is made: the
		// host's launch call is inside the timing, as in a plain event pair.
		t, err = b.deviceTimeGated(false, b.kern.Stream(), 2, b.cfg.Reps, func(i int) error { return preps[(i+itemSets)%itemSets].Launch() })
		if err != nil {
			return err
		}
		b.add(summarize(c, "kernel only (descriptors resident)", bytes, t, "device events, stream not held: host launch call included"))
		// Host cost of one submission: planning the descriptors, staging and queueing.
		var host []time.Duration
		for i := -2; i < b.cfg.Reps; i++ {
			start := time.Now()
			p, err := b.kern.Submit(segs[(i+itemSets)%itemSets])
			d := time.Since(start)
			if err != nil {
				return err
			}
			if err := waitPending(p); err != nil {
				return err
			}
			if i >= 0 {
				host = append(host, d)
			}
		}
		b.add(summarize(c, "copier Submit call (host only)", bytes, host, "host wall clock, returns before the GPU is done"))
	}

	// The copier alone, GPU time it records: descriptor upload (if any) plus kernel.
	for _, m := range []struct {
		name string
		c    *cudacopy.Copier
	}{{"copier: upload + kernel", b.kern}, {"copier: kernel reading host descriptors", b.hostD}} {
		t, err := b.copierDeviceTimes(m.c, segs)
		if err != nil {
			return err
		}
		b.add(summarize(c, m.name, bytes, t, "device events recorded by the copier after host staging"))
	}

	// A copier that keeps descriptor sets, given a new block list each time:
	// what a first launch costs when it also writes the device copy.
	keeper, err := cudacopy.NewCopier(b.drv, 0, cudacopy.Options{NVRTC: b.nvrtc, TimeDevice: true})
	if err != nil {
		return err
	}
	defer keeper.Close()
	fresh := make([][]cudacopy.Segment, b.cfg.Reps+2)
	for k := range fresh {
		_, fresh[k] = pick()
	}
	t, err := b.copierDeviceTimes(keeper, fresh)
	if err != nil {
		return err
	}
	b.add(summarize(c, "copier: host descriptors, new list, keeping them", bytes, t, "device events recorded by the copier"))

	// The same blocks in source and in destination order: which side the GPU prefers sorted decides the order
	// a plan's segments should come in.
	for _, o := range []struct {
		name string
		key  func(cudacopy.Segment) uint64
	}{{"source", func(s cudacopy.Segment) uint64 { return s.Src }}, {"destination", func(s cudacopy.Segment) uint64 { return s.Dst }}} {
		sorted := make([][]cudacopy.Segment, itemSets)
		for k := range segs {
			sorted[k] = slices.Clone(segs[k])
			slices.SortFunc(sorted[k], func(x, y cudacopy.Segment) int { return cmp.Compare(o.key(x), o.key(y)) })
		}
		t, err := b.copierDeviceTimes(b.hostD, sorted)
		if err != nil {
			return err
		}
		b.add(summarize(c, "copier: host descriptors, blocks in "+o.name+" order", bytes, t, "device events recorded by the copier"))
	}

	if b.cfg.SkipDriver {
		// The copier loops above ran last, ending with this set.
		return b.check(src, dst, sets[(b.cfg.Reps-1+itemSets)%itemSets])
	}
	// Driver copies, event-bracketed (their host calls are the work).
	for _, m := range []struct {
		name string
		c    *cudacopy.Copier
		reps int
	}{
		{"driver batch (cuMemcpyBatchAsync)", b.batch, b.cfg.SlowReps},
		{"driver per block (cuMemcpyAsync)", b.per, b.cfg.SlowReps},
	} {
		{
			t, err := b.timeCopier(m.c, segs, m.reps)
			if err != nil {
				b.add(Row{Case: c, Method: m.name, Bytes: bytes, Median: 1, Min: 1, Note: "FAILED: " + err.Error()})
				continue
			}
			b.add(summarize(c, m.name, bytes, t, fmt.Sprintf("device events; mode %s %s", m.c.Mode(), m.c.Reason())))
		}
	}
	return b.check(src, dst, sets[(b.cfg.SlowReps-1+itemSets)%itemSets])
}

// copierDeviceTimes submits the sets in turn (two warm-ups, then Reps timed) and returns the GPU time the
// copier recorded for each timed one.
func (b *bench) copierDeviceTimes(c *cudacopy.Copier, sets [][]cudacopy.Segment) ([]time.Duration, error) {
	var t []time.Duration
	for i := -2; i < b.cfg.Reps; i++ {
		p, err := c.Submit(sets[(i+2*len(sets))%len(sets)])
		if err != nil {
			return nil, err
		}
		if err := waitPending(p); err != nil {
			return nil, err
		}
		if i >= 0 {
			t = append(t, p.DeviceTime())
		}
	}
	return t, nil
}

// timeCopier event-times Submit on the copier's own stream; the events
// bracket everything the submission queues.
func (b *bench) timeCopier(c *cudacopy.Copier, segs [][]cudacopy.Segment, reps int) ([]time.Duration, error) {
	s := c.Stream()
	var prev *cudacopy.Pending
	// deviceTime synchronizes each repetition before the next, so the previous
	// submission is complete and Wait only hands its staging back.
	reap := func() error {
		if prev == nil {
			return nil
		}
		err := waitPending(prev)
		prev = nil
		return err
	}
	// Not held: the host's calls are these copies' cost, and thousands of
	// them would fill the driver's queue behind a held stream.
	t, err := b.deviceTimeGated(false, s, 1, reps, func(i int) error {
		if err := reap(); err != nil {
			return err
		}
		p, err := c.Submit(segs[(i+itemSets)%itemSets])
		prev = p
		return err
	})
	return t, errors.Join(err, reap())
}

// kvLayers is how many layers the per-layer case spreads over, each its own
// region as large as the case's pool, so a layer's blocks are not in L2 when
// its turn comes again.
const kvLayers = 4

// layers moves one block list layer after layer, as a KV transfer does: the
// same blocks of every layer's cache, planned and submitted per layer. After
// the first layer the descriptors are already on the GPU.
func (b *bench) layers(sc ScatterCase, c string, bytes uint64) error {
	region := uint64(sc.PoolBlocks) * sc.Size
	src, dst, srcID, dstID, free, err := b.regions(kvLayers*region, 3)
	if err != nil {
		return err
	}
	defer free()
	r := rand.New(rand.NewPCG(uint64(sc.Count)+1, sc.Size))
	from, to := r.Perm(sc.PoolBlocks)[:sc.Count], r.Perm(sc.PoolBlocks)[:sc.Count]
	layer := func(l int) []engines.Item {
		items := make([]engines.Item, len(from))
		base := uint64(l) * region
		for i := range from {
			items[i] = engines.Item{Src: srcID, SrcOffset: base + uint64(from[i])*sc.Size, Dst: dstID,
				DstOffset: base + uint64(to[i])*sc.Size, Size: sc.Size, Tag: engines.Tag(i)}
		}
		return items
	}
	var last []engines.Item
	err = b.engineSeries(c, bytes, "xgmi engine (plan+submit+wait), next layer",
		fmt.Sprintf("one block list over %d layers in turn: descriptors kept on the GPU", kvLayers), kvLayers,
		func(i int) ([]engines.Item, *engines.PlanSet) {
			last = layer((i + kvLayers) % kvLayers)
			return last, nil
		})
	if err != nil {
		return err
	}
	return b.check(src, dst, last)
}

// regions allocates a source (random bytes from seed) and a destination of n
// bytes and registers both with the engine; free releases the memory.
func (b *bench) regions(n, seed uint64) (src, dst cuda.DevicePtr, srcID, dstID engines.MemoryID, free func(), err error) {
	src, freeS, err := b.alloc(n)
	if err != nil {
		return 0, 0, "", "", nil, err
	}
	dst, freeD, err := b.alloc(n)
	free = func() { freeD(); freeS() }
	if err == nil {
		err = b.fillRandom(src, n, seed)
	}
	if err == nil {
		srcID, err = b.register(src, n)
	}
	if err == nil {
		dstID, err = b.register(dst, n)
	}
	if err != nil {
		free()
		return 0, 0, "", "", nil, err
	}
	return src, dst, srcID, dstID, free, nil
}

// engineSeries runs next(i)'s items (planned each time) or planned set through the engine for i from -warm
// (untimed) to Reps, and adds the host wall clock and the engine's GPU time of the timed ones; what says what
// the submissions were.
func (b *bench) engineSeries(c string, bytes uint64, method, what string, warm int,
	next func(i int) ([]engines.Item, *engines.PlanSet)) error {
	var wall []time.Duration
	for i := -warm; i < b.cfg.Reps; i++ {
		if i == 0 {
			b.resetStats()
		}
		items, ps := next(i)
		d, _, err := b.engineRun(items, ps)
		if err != nil {
			return err
		}
		if i >= 0 {
			wall = append(wall, d)
		}
	}
	b.add(summarize(c, method, bytes, wall, "host wall clock"))
	if dr, ok := b.engineDevice(c, bytes, what); ok {
		b.add(dr)
	}
	return nil
}

// waitPending waits for a copier submission, for a minute at most.
func waitPending(p *cudacopy.Pending) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return p.Wait(ctx)
}
