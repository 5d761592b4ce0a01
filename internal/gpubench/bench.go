// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpubench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// Config says what to measure.
type Config struct {
	// Reps is how many timed repetitions the fast methods get (median reported).
	Reps int
	// SlowReps is the repetitions for per-item and batch driver copies.
	SlowReps int
	// SkipDriver leaves the per-item and batch driver copies out (they take most of a run's time, which
	// drowns the engine's host path in a CPU profile).
	SkipDriver bool
	// ContigBytes is the contiguous copy size (0: skip).
	ContigBytes uint64
	// Scatter cases as count x block size.
	Scatter []ScatterCase
	// CacheDir for compiled kernels ("" = none).
	CacheDir string
	// EngineUploadDescriptors sets the engine backend's Options.UploadDescriptors.
	EngineUploadDescriptors bool
}

// ScatterCase is count blocks of size bytes, scattered in pools of PoolBlocks.
type ScatterCase struct {
	Count      int
	Size       uint64
	PoolBlocks int
}

// Row is one measurement.
type Row struct {
	Case, Method string
	Bytes        uint64
	Median       time.Duration
	Min          time.Duration
	Note         string
}

// GBps is bytes (counted once) per second, in 10^9.
func (r Row) GBps() float64 { return float64(r.Bytes) / r.Median.Seconds() / 1e9 }

type bench struct {
	drv *cuda.Driver
	// gate holds streams in deviceTime until the timed work is queued.
	gate   *cuda.StreamGate
	nvrtc  *cuda.NVRTC
	ctx    cuda.Context
	kern   *cudacopy.Copier
	hostD  *cudacopy.Copier
	batch  *cudacopy.Copier
	per    *cudacopy.Copier
	eng    *xgmi.Engine
	back   *cudacopy.Backend
	cfg    Config
	rows   []Row
	out    io.Writer
	nextID int
	// stats are the engine's own per-copy timings (Options.Observe).
	mu    sync.Mutex
	stats []cudacopy.CopyStats
}

func (b *bench) resetStats() {
	b.mu.Lock()
	b.stats = nil
	b.mu.Unlock()
}

// engineDevice summarizes the GPU time of the engine copies observed since
// stats was last cleared; what says which submissions they were ("" for
// plain ones).
func (b *bench) engineDevice(c string, bytes uint64, what string) (Row, bool) {
	var t, q []time.Duration
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, st := range b.stats {
		if st.Bytes == bytes && st.Device > 0 {
			t, q = append(t, st.Device), append(q, st.Queueing)
		}
	}
	b.stats = nil
	if len(t) == 0 {
		return Row{}, false
	}
	note := "device events the engine records (staging upload + kernel or copy engine)"
	if what != "" {
		note += "; " + what
	}
	slices.Sort(q)
	note += fmt.Sprintf("; host queueing between the events: median %.1f µs", float64(q[len(q)/2].Nanoseconds())/1e3)
	return summarize(c, "xgmi engine, GPU time of its copy", bytes, t, note), true
}

// Run measures everything in cfg on GPU 0 and writes a table to out.
func Run(out io.Writer, cfg Config) ([]Row, error) {
	if cfg.Reps <= 0 {
		cfg.Reps = 20
	}
	if cfg.SlowReps <= 0 {
		cfg.SlowReps = 3
	}
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	nv, nvErr := cuda.LoadNVRTC()
	if nvErr != nil {
		fmt.Fprintln(out, "NVRTC:", nvErr)
	}
	b := &bench{drv: drv, cfg: cfg, out: out, nvrtc: nv}
	opts := cudacopy.Options{NVRTC: nv, CacheDir: cfg.CacheDir}
	opts.TimeDevice = true
	// The copiers measured on their own keep no descriptor sets: their rows
	// are the paths themselves (the engine's backend keeps its default).
	copts := opts
	copts.ResidentLayouts = -1
	kopts := copts
	kopts.UploadDescriptors = true
	if b.kern, err = cudacopy.NewCopier(drv, 0, kopts); err != nil {
		return nil, err
	}
	defer b.kern.Close()
	b.ctx = b.kern.Context()
	err = drv.WithContext(b.ctx, func() (err error) { b.gate, err = cuda.NewStreamGate(drv); return err })
	if err != nil {
		return nil, err
	}
	defer drv.WithContext(b.ctx, b.gate.Close)
	if b.hostD, err = cudacopy.NewCopier(drv, 0, copts); err != nil {
		return nil, err
	}
	defer b.hostD.Close()
	if b.batch, err = cudacopy.NewCopier(drv, 0, cudacopy.Options{Force: cudacopy.ModeBatch}); err != nil {
		return nil, err
	}
	defer b.batch.Close()
	if b.per, err = cudacopy.NewCopier(drv, 0, cudacopy.Options{Force: cudacopy.ModePerItem}); err != nil {
		return nil, err
	}
	defer b.per.Close()
	bopts := opts
	bopts.UploadDescriptors = cfg.EngineUploadDescriptors
	bopts.Observe = func(st cudacopy.CopyStats) {
		b.mu.Lock()
		b.stats = append(b.stats, st)
		b.mu.Unlock()
	}
	if b.back, err = cudacopy.NewBackend(drv, bopts); err != nil {
		return nil, err
	}
	defer b.back.Close()
	if b.eng, err = xgmi.New(xgmi.Options{Node: "bench"}, b.back, xgmi.NewHostBackend()); err != nil {
		return nil, err
	}
	defer b.eng.Close()
	dev, _ := drv.DeviceGet(0)
	name, _ := drv.DeviceName(dev)
	gated, why := b.hostD.TimingGated()
	fmt.Fprintf(out, "copier GPU timings leave out host queueing: %v %s\n", gated, why)
	mode, reason, _ := b.back.Mode(0)
	fmt.Fprintf(out, "device %s, driver %d, engine copy mode %s %s, kernels %+v\n", name, drv.Version(), mode, reason, b.kern.Kernels())

	if cfg.ContigBytes > 0 {
		if err := b.contiguous(); err != nil {
			return b.rows, fmt.Errorf("contiguous: %w", err)
		}
	}
	if n, err := drv.DeviceCount(); err == nil && n >= 2 && cfg.ContigBytes > 0 {
		if err := b.peer(cfg.ContigBytes); err != nil {
			return b.rows, fmt.Errorf("peer: %w", err)
		}
	} else {
		fmt.Fprintf(out, "peer copies: skipped, %d GPU(s) visible\n", n)
	}
	for _, sc := range cfg.Scatter {
		if err := b.scatter(sc); err != nil {
			return b.rows, fmt.Errorf("scatter %dx%d: %w", sc.Count, sc.Size, err)
		}
	}
	return b.rows, nil
}

func (b *bench) add(r Row) {
	b.rows = append(b.rows, r)
	fmt.Fprintf(b.out, "%-22s %-34s %12.3f ms %10.2f GB/s  (min %.3f ms) %s\n", r.Case, r.Method,
		float64(r.Median.Microseconds())/1000, r.GBps(), float64(r.Min.Microseconds())/1000, r.Note)
}

func summarize(c, m string, bytes uint64, times []time.Duration, note string) Row {
	slices.Sort(times)
	return Row{Case: c, Method: m, Bytes: bytes, Median: times[len(times)/2], Min: times[0], Note: note}
}

// deviceTime runs fn (which queues work on s) reps times after warmups and
// returns the event-timed durations. Like the copier's own timings, the
// stream is held until the events and fn's work are all queued, so the
// durations are the GPU's alone.
func (b *bench) deviceTime(s cuda.Stream, warm, reps int, fn func(i int) error) ([]time.Duration, error) {
	return b.deviceTimeGated(true, s, warm, reps, fn)
}

func (b *bench) deviceTimeGated(gated bool, s cuda.Stream, warm, reps int, fn func(i int) error) ([]time.Duration, error) {
	var out []time.Duration
	err := b.drv.WithContext(b.ctx, func() error {
		start, err := b.drv.EventCreate(true)
		if err != nil {
			return err
		}
		defer b.drv.EventDestroy(start)
		end, err := b.drv.EventCreate(true)
		if err != nil {
			return err
		}
		defer b.drv.EventDestroy(end)
		for i := -warm; i < reps; i++ {
			open := func() {}
			if gated {
				var err error
				if open, err = b.gate.Hold(s); err != nil {
					return err
				}
			}
			err := b.drv.EventRecord(start, s)
			if err == nil {
				err = fn(i)
			}
			if err == nil {
				err = b.drv.EventRecord(end, s)
			}
			open()
			if err != nil {
				return err
			}
			if err := b.drv.EventSynchronize(end); err != nil {
				return err
			}
			ms, err := b.drv.EventElapsed(start, end)
			if err != nil {
				return err
			}
			if i >= 0 {
				out = append(out, time.Duration(float64(ms)*1e6))
			}
		}
		return nil
	})
	return out, err
}

func (b *bench) alloc(n uint64) (cuda.DevicePtr, func(), error) {
	var p cuda.DevicePtr
	err := b.drv.WithContext(b.ctx, func() (err error) { p, err = b.drv.MemAlloc(n); return })
	return p, func() { _ = b.drv.WithContext(b.ctx, func() error { return b.drv.MemFree(p) }) }, err
}

func (b *bench) register(p cuda.DevicePtr, n uint64) (engines.MemoryID, error) {
	b.nextID++
	id := engines.MemoryID(fmt.Sprintf("bench/%d", b.nextID))
	_, err := b.eng.Register(context.Background(), engines.MemoryDesc{ID: id, Node: "bench", Size: n,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles:  engines.Handles{Ptr: uintptr(p)}})
	return id, err
}

// engineRun plans, submits and waits for items, timing the whole host path
// (planned == nil) or only submit and wait of a prepared plan set.
func (b *bench) engineRun(items []engines.Item, planned *engines.PlanSet) (time.Duration, *engines.PlanSet, error) {
	start := time.Now()
	ps := planned
	if ps == nil {
		pb := b.eng.NewPlan()
		for _, it := range items {
			if err := pb.Add(it); err != nil {
				return 0, nil, err
			}
		}
		ps = pb.Build()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := b.eng.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		return 0, nil, err
	}
	if err := tr.Wait(ctx); err != nil {
		return 0, nil, err
	}
	return time.Since(start), ps, nil
}

func (b *bench) contiguous() error {
	n := b.cfg.ContigBytes
	src, freeS, err := b.alloc(n)
	if err != nil {
		return err
	}
	defer freeS()
	dst, freeD, err := b.alloc(n)
	if err != nil {
		return err
	}
	defer freeD()
	if err := b.fillRandom(src, n, 1); err != nil {
		return err
	}
	c := fmt.Sprintf("contig %d MiB", n>>20)
	s := b.kern.Stream()
	ce, err := b.deviceTime(s, 3, b.cfg.Reps, func(int) error { return b.drv.MemcpyDtoDAsync(dst, src, n, s) })
	if err != nil {
		return err
	}
	raw := summarize(c, "raw copy engine (cuMemcpyDtoDAsync)", n, ce, "device events")
	b.add(raw)
	if b.kern.Kernels() != nil {
		kt, err := b.deviceTime(s, 3, b.cfg.Reps, func(int) error { return b.kern.LaunchContiguous(uint64(dst), uint64(src), n) })
		if err != nil {
			return err
		}
		b.add(summarize(c, "contiguous kernel", n, kt, "device events"))
	}
	srcID, err := b.register(src, n)
	if err != nil {
		return err
	}
	dstID, err := b.register(dst, n)
	if err != nil {
		return err
	}
	var sync []time.Duration
	for i := -3; i < b.cfg.Reps; i++ {
		start := time.Now()
		err := b.drv.WithContext(b.ctx, func() error {
			if err := b.drv.MemcpyDtoDAsync(dst, src, n, s); err != nil {
				return err
			}
			return b.drv.StreamSynchronize(s)
		})
		if err != nil {
			return err
		}
		if i >= 0 {
			sync = append(sync, time.Since(start))
		}
	}
	rawHost := summarize(c, "raw copy engine + stream sync", n, sync, "host wall clock")
	b.add(rawHost)
	// The copier alone (no planning, tracker or goroutines): what the engine adds on top is the rest.
	var cw []time.Duration
	for i := -3; i < b.cfg.Reps; i++ {
		start := time.Now()
		p, err := b.hostD.Submit([]cudacopy.Segment{{Dst: uint64(dst), Src: uint64(src), Size: n}})
		if err != nil {
			return err
		}
		if err := waitPending(p); err != nil {
			return err
		}
		if i >= 0 {
			cw = append(cw, time.Since(start))
		}
	}
	b.add(summarize(c, "copier Submit+Wait", n, cw, "host wall clock"))
	items := []engines.Item{{Src: srcID, Dst: dstID, Size: n, Tag: 1}}
	b.stats = nil
	var et []time.Duration
	for i := -3; i < b.cfg.Reps; i++ {
		if i == 0 {
			b.resetStats()
		}
		d, _, err := b.engineRun(items, nil)
		if err != nil {
			return err
		}
		if i >= 0 {
			et = append(et, d)
		}
	}
	row := summarize(c, "xgmi engine (plan+submit+wait)", n, et, "host wall clock")
	row.Note += fmt.Sprintf("; %.1f%% of raw copy engine + sync (host wall), %.1f%% of raw copy engine (events)",
		100*rawHost.Median.Seconds()/row.Median.Seconds(), 100*raw.Median.Seconds()/row.Median.Seconds())
	b.add(row)
	if dr, ok := b.engineDevice(c, n, ""); ok {
		dr.Note += fmt.Sprintf("; %.1f%% of raw copy engine (events)", 100*raw.Median.Seconds()/dr.Median.Seconds())
		b.add(dr)
	}
	if err := b.check(src, dst, []engines.Item{{Size: n}}); err != nil {
		return err
	}
	return nil
}

// fillRandom writes seeded random bytes to the device.
func (b *bench) fillRandom(p cuda.DevicePtr, n uint64, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const chunk = 64 << 20
	buf := make([]byte, min(n, chunk))
	return b.drv.WithContext(b.ctx, func() error {
		for off := uint64(0); off < n; off += chunk {
			m := min(chunk, n-off)
			w := unsafe.Slice((*uint64)(unsafe.Pointer(&buf[0])), m/8)
			for i := range w {
				w[i] = r.Uint64()
			}
			if err := b.drv.MemcpyHtoD(p+cuda.DevicePtr(off), buf[:m]); err != nil {
				return err
			}
		}
		return nil
	})
}

// check compares each item's destination bytes with its source on the host.
func (b *bench) check(src, dst cuda.DevicePtr, items []engines.Item) error {
	return b.drv.WithContext(b.ctx, func() error {
		var sb, db []byte
		for _, it := range items {
			if uint64(cap(sb)) < it.Size {
				sb, db = make([]byte, it.Size), make([]byte, it.Size)
			}
			sb, db = sb[:it.Size], db[:it.Size]
			if err := b.drv.MemcpyDtoH(sb, src+cuda.DevicePtr(it.SrcOffset)); err != nil {
				return err
			}
			if err := b.drv.MemcpyDtoH(db, dst+cuda.DevicePtr(it.DstOffset)); err != nil {
				return err
			}
			if string(sb) != string(db) {
				return fmt.Errorf("item tag %d: destination differs from source", it.Tag)
			}
		}
		return nil
	})
}

// peer measures GPU 0 → GPU 1 over peer access: the driver's peer copy
// against the engine (which pushes from the source GPU with the copy engine
// or kernel). It runs only where two GPUs are visible.
func (b *bench) peer(n uint64) error {
	dev1, err := b.drv.DeviceGet(1)
	if err != nil {
		return err
	}
	ctx1, err := b.drv.PrimaryContextRetain(dev1)
	if err != nil {
		return err
	}
	defer b.drv.PrimaryContextRelease(dev1)
	src, freeS, err := b.alloc(n)
	if err != nil {
		return err
	}
	defer freeS()
	var dst cuda.DevicePtr
	if err := b.drv.WithContext(ctx1, func() (err error) { dst, err = b.drv.MemAlloc(n); return }); err != nil {
		return err
	}
	defer b.drv.WithContext(ctx1, func() error { return b.drv.MemFree(dst) })
	if err := b.fillRandom(src, n, 3); err != nil {
		return err
	}
	c := fmt.Sprintf("GPU0->GPU1 %d MiB", n>>20)
	s := b.kern.Stream()
	// Without peer access the driver stages a peer copy through host memory; the baseline is the direct one.
	staged, err := b.deviceTime(s, 3, b.cfg.Reps, func(int) error { return b.drv.MemcpyPeerAsync(dst, ctx1, src, b.ctx, n, s) })
	if err != nil {
		return err
	}
	b.add(summarize(c, "raw cuMemcpyPeerAsync, peer access off", n, staged, "device events"))
	if err := b.drv.WithContext(b.ctx, func() error { return b.drv.CtxEnablePeerAccess(ctx1) }); err != nil {
		return fmt.Errorf("enabling peer access GPU 0 -> GPU 1: %w", err)
	}
	raw, err := b.deviceTime(s, 3, b.cfg.Reps, func(int) error { return b.drv.MemcpyPeerAsync(dst, ctx1, src, b.ctx, n, s) })
	if err != nil {
		return err
	}
	rawRow := summarize(c, "raw cuMemcpyPeerAsync, peer access on", n, raw, "device events")
	b.add(rawRow)
	var rawSync []time.Duration
	for i := -3; i < b.cfg.Reps; i++ {
		start := time.Now()
		err := b.drv.WithContext(b.ctx, func() error {
			if err := b.drv.MemcpyPeerAsync(dst, ctx1, src, b.ctx, n, s); err != nil {
				return err
			}
			return b.drv.StreamSynchronize(s)
		})
		if err != nil {
			return err
		}
		if i >= 0 {
			rawSync = append(rawSync, time.Since(start))
		}
	}
	rawSyncRow := summarize(c, "raw cuMemcpyPeerAsync + stream sync", n, rawSync, "host wall clock")
	b.add(rawSyncRow)
	srcID, err := b.register(src, n)
	if err != nil {
		return err
	}
	b.nextID++
	dstID := engines.MemoryID(fmt.Sprintf("bench/%d", b.nextID))
	if _, err := b.eng.Register(context.Background(), engines.MemoryDesc{ID: dstID, Node: "bench", Size: n,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA, Device: 1},
		Handles:  engines.Handles{Ptr: uintptr(dst)}}); err != nil {
		return err
	}
	var et []time.Duration
	for i := -3; i < b.cfg.Reps; i++ {
		if i == 0 {
			b.resetStats()
		}
		d, _, err := b.engineRun([]engines.Item{{Src: srcID, Dst: dstID, Size: n, Tag: 1}}, nil)
		if err != nil {
			return err
		}
		if i >= 0 {
			et = append(et, d)
		}
	}
	row := summarize(c, "xgmi engine P2P (plan+submit+wait)", n, et, "host wall clock")
	row.Note += fmt.Sprintf("; %.1f%% of cuMemcpyPeerAsync + sync (host wall), %.1f%% of cuMemcpyPeerAsync (events)",
		100*rawSyncRow.Median.Seconds()/row.Median.Seconds(), 100*rawRow.Median.Seconds()/row.Median.Seconds())
	b.add(row)
	if dr, ok := b.engineDevice(c, n, ""); ok {
		dr.Note += fmt.Sprintf("; %.1f%% of cuMemcpyPeerAsync (events)", 100*rawRow.Median.Seconds()/dr.Median.Seconds())
		b.add(dr)
	}
	return nil
}
