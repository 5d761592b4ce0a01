// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Workload is one point of a sweep: what every operation moves.
type Workload struct {
	// Pattern is "contiguous" (Batch items of Size bytes, kept apart so they do not coalesce) or
	// "scattered" (Batch blocks of Size bytes at random offsets of both regions).
	Pattern string
	Size    uint64
	Batch   int
}

// BytesPerOp is what one operation moves.
func (w Workload) BytesPerOp() uint64 { return w.Size * uint64(w.Batch) }

// window is the span of each region one thread uses.
func (w Workload) window() uint64 {
	if w.Pattern == "contiguous" && w.Batch == 1 {
		return w.Size
	}
	return 2 * w.Size * uint64(w.Batch)
}

// items returns thread's items inside its window at base.
func (w Workload) items(t *Target, base uint64, seed uint64) []engines.Item {
	items := make([]engines.Item, w.Batch)
	if w.Pattern == "scattered" {
		rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
		slots := 2 * w.Batch
		srcSlots, dstSlots := rng.Perm(slots), rng.Perm(slots)
		for i := range items {
			items[i] = engines.Item{Src: t.Src, Dst: t.Dst, SrcOffset: base + uint64(srcSlots[i])*w.Size,
				DstOffset: base + uint64(dstSlots[i])*w.Size, Size: w.Size, Tag: engines.Tag(i)}
		}
		return items
	}
	stride := w.Size
	if w.Batch > 1 {
		stride = 2 * w.Size
	}
	for i := range items {
		off := base + uint64(i)*stride
		items[i] = engines.Item{Src: t.Src, Dst: t.Dst, SrcOffset: off, DstOffset: off, Size: w.Size, Tag: engines.Tag(i)}
	}
	return items
}

// Result is one measured point.
type Result struct {
	Engine     string  `json:"engine"`
	Op         string  `json:"op"`
	Pattern    string  `json:"pattern"`
	ItemSize   uint64  `json:"item_size"`
	Items      int     `json:"items_per_op"`
	BytesPerOp uint64  `json:"bytes_per_op"`
	Threads    int     `json:"threads"`
	Plans      int     `json:"plans_per_op"`
	PlanUs     float64 `json:"plan_us"`
	Ops        int     `json:"ops"`
	Seconds    float64 `json:"seconds"`
	GBps       float64 `json:"gb_per_s"`
	P50Us      float64 `json:"p50_us"`
	P99Us      float64 `json:"p99_us"`
	OpsPerSec  float64 `json:"ops_per_s"`
	Baseline   *Phase  `json:"baseline,omitempty"`
	// Ratio is GBps over the baseline's GBps.
	Ratio float64 `json:"ratio,omitempty"`
}

// Phase is the aggregate of one side (engine or baseline) of a point.
type Phase struct {
	Name      string  `json:"name"`
	Ops       int     `json:"ops"`
	Seconds   float64 `json:"seconds"`
	GBps      float64 `json:"gb_per_s"`
	P50Us     float64 `json:"p50_us"`
	P99Us     float64 `json:"p99_us"`
	OpsPerSec float64 `json:"ops_per_s"`
}

// RunConfig bounds the measurement of each point.
type RunConfig struct {
	Threads  int
	MinIters int
	MinTime  time.Duration
	// Rounds alternates engine and baseline phases, so drift on a shared machine hits both alike.
	Rounds  int
	Timeout time.Duration
	Seed    uint64
}

type sample struct {
	lat   []time.Duration
	ops   int
	bytes uint64
	wall  time.Duration
}

func (s *sample) add(o sample) {
	s.lat = append(s.lat, o.lat...)
	s.ops += o.ops
	s.bytes += o.bytes
	s.wall += o.wall
}

func (s *sample) phase(name string) *Phase {
	p := &Phase{Name: name, Ops: s.ops, Seconds: s.wall.Seconds()}
	if s.wall > 0 {
		p.GBps = float64(s.bytes) / s.wall.Seconds() / 1e9
		p.OpsPerSec = float64(s.ops) / s.wall.Seconds()
	}
	p.P50Us, p.P99Us = percentile(s.lat, 0.50), percentile(s.lat, 0.99)
	return p
}

func percentile(lat []time.Duration, q float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return float64(s[i].Nanoseconds()) / 1e3
}

// phaseRun runs op on every thread until each did minIters and minTime passed.
func phaseRun(ctx context.Context, rc RunConfig, minTime time.Duration, bytesPerOp uint64,
	op func(ctx context.Context, thread int) error) (sample, error) {
	var mu sync.Mutex
	var total sample
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for th := range rc.Threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for i := 0; i < rc.MinIters || time.Since(start) < minTime; i++ {
				octx, cancel := context.WithTimeout(ctx, rc.Timeout)
				t0 := time.Now()
				err := op(octx, th)
				d := time.Since(t0)
				cancel()
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				lat = append(lat, d)
			}
			mu.Lock()
			total.lat = append(total.lat, lat...)
			total.ops += len(lat)
			mu.Unlock()
		}()
	}
	wg.Wait()
	total.wall = time.Since(start)
	total.bytes = uint64(total.ops) * bytesPerOp
	return total, firstErr
}

// measure runs one point: plans each thread's batch once (a prepared batch), then alternates engine and
// baseline phases.
func measure(ctx context.Context, t *Target, w Workload, op string, rc RunConfig) (*Result, error) {
	res := &Result{Engine: t.Engine.Name(), Op: op, Pattern: w.Pattern, ItemSize: w.Size, Items: w.Batch,
		BytesPerOp: w.BytesPerOp(), Threads: rc.Threads}
	sets := make([]*engines.PlanSet, rc.Threads)
	for th := range rc.Threads {
		items := w.items(t, uint64(th)*w.window(), rc.Seed+uint64(th))
		t0 := time.Now()
		b := t.Engine.NewPlan()
		for _, it := range items {
			if err := b.Add(it); err != nil {
				return nil, fmt.Errorf("planning: %w", err)
			}
		}
		ps := b.Build()
		if th == 0 {
			res.PlanUs = float64(time.Since(t0).Nanoseconds()) / 1e3
			res.Plans = len(ps.Plans)
		}
		if len(ps.Rejected) > 0 {
			return nil, fmt.Errorf("planning: %v", ps.Rejected[0])
		}
		sets[th] = ps
	}
	engineOp := func(ctx context.Context, th int) error {
		tr, err := t.Engine.Submit(ctx, sets[th], engines.SubmitOptions{})
		if err != nil {
			return err
		}
		return tr.Wait(ctx)
	}
	var baseOp func(ctx context.Context, th int) error
	if t.Baseline != nil {
		baseOp = func(ctx context.Context, th int) error {
			return t.Baseline(ctx, th, uint64(th)*w.window(), w.BytesPerOp())
		}
	}
	// Warm up both paths (connections, page tables, caches).
	warm := rc
	warm.MinIters = 2
	if _, err := phaseRun(ctx, warm, 0, 0, engineOp); err != nil {
		return nil, fmt.Errorf("%s %s: %w", res.Engine, op, err)
	}
	if baseOp != nil {
		if _, err := phaseRun(ctx, warm, 0, 0, baseOp); err != nil {
			return nil, fmt.Errorf("baseline %s: %w", t.BaselineName, err)
		}
	}
	var eng, base sample
	per := rc.MinTime / time.Duration(rc.Rounds)
	iters := rc
	iters.MinIters = max(1, (rc.MinIters+rc.Rounds-1)/rc.Rounds)
	for range rc.Rounds {
		s, err := phaseRun(ctx, iters, per, w.BytesPerOp(), engineOp)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", res.Engine, op, err)
		}
		eng.add(s)
		if baseOp != nil {
			s, err := phaseRun(ctx, iters, per, w.BytesPerOp(), baseOp)
			if err != nil {
				return nil, fmt.Errorf("baseline %s: %w", t.BaselineName, err)
			}
			base.add(s)
		}
	}
	p := eng.phase(res.Engine)
	res.Ops, res.Seconds, res.GBps, res.P50Us, res.P99Us, res.OpsPerSec = p.Ops, p.Seconds, p.GBps, p.P50Us, p.P99Us, p.OpsPerSec
	if baseOp != nil {
		res.Baseline = base.phase(t.BaselineName)
		if res.Baseline.GBps > 0 {
			res.Ratio = res.GBps / res.Baseline.GBps
		}
	}
	return res, nil
}
