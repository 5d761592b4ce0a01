// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// Mode is how a Copier moves scattered items.
type Mode string

// Copy modes.
const (
	// ModeKernel: one scatter-kernel launch per submission.
	ModeKernel Mode = "kernel"
	// ModeBatch: the driver's cuMemcpyBatchAsync.
	ModeBatch Mode = "driver-batch"
	// ModePerItem: one cuMemcpyAsync per item.
	ModePerItem Mode = "driver-per-item"
)

// Options tune a Copier; the zero value is the production default.
type Options struct {
	// NVRTC compiles the kernels; nil means it is not available.
	NVRTC *cuda.NVRTC
	// CacheDir holds compiled kernels between runs; empty disables the cache.
	CacheDir string
	// CopyEngineMin sends items at least this large to the copy engine
	// instead of the kernel (default 16 MiB: per-call overhead is a few
	// microseconds, and the copy engine runs a large copy at full memory speed
	// without occupying SMs).
	CopyEngineMin uint64
	// MaxPiece cuts items into pieces of at most this many bytes for the
	// kernel, one warp each (default 32 KiB).
	MaxPiece uint64
	// UploadDescriptors copies the descriptors to device memory before the
	// kernel runs. By default the kernel reads them from pinned host memory:
	// on an H200 that made 15,360 x 720 B blocks take 17-19 µs of GPU time
	// instead of 22-28 µs, because each block reads its descriptors once and
	// the upload's own latency is gone.
	UploadDescriptors bool
	// ResidentLayouts is how many recent descriptor sets of equal-sized,
	// aligned blocks stay in device memory (default 8, negative: none). A
	// submission whose descriptors match one exactly (the same block list,
	// whatever the base addresses: the next layer of a KV transfer) launches
	// from there and skips the PCIe read of its descriptors; the launch that
	// first ran a set writes its device copy as a side effect.
	ResidentLayouts int
	// Force picks a mode instead of the best available (benchmarks).
	Force Mode
	// TimeDevice records GPU-side timing of every submission (Pending.DeviceTime).
	// The stream then waits on a host word until the whole submission is
	// queued (cuStreamWaitValue32), so the timing is the GPU's alone and not
	// the host's driver calls between the two events; where the driver lacks
	// stream memory operations the timing includes them (Copier.TimingGated).
	TimeDevice bool
	// SpinWait is how long Wait polls the GPU on the caller's goroutine
	// before handing over to a watcher thread (default 200µs).
	SpinWait time.Duration
	// PollGap spaces Wait's polls of the completion event where the copier has no done word (default 5µs;
	// negative: none). A poll is a driver call of about
	// 2 µs on the H200 VM, and polls back to back from the waiter of one copy slowed the queueing of the next
	// copies by the same process: eight 64 MiB copies in flight took 78 µs each, against 36 for torch.
	PollGap time.Duration
	// SleepRate (bytes/s) bounds how long Wait polls a large copy before
	// handing it to a watcher: SpinWait plus bytes/SleepRate. Set it above
	// the fastest copy of the GPU (default 3e12).
	SleepRate float64
	// Observe, when set, receives every completed copy of a Backend.
	Observe func(CopyStats)
	// MappingEpoch, when set, counts the mappings released so far (the Backend sets it): copy-engine ranges
	// copied more than once are then replayed from instantiated graphs (copyReplays), all dropped whenever
	// it moves. Unset, every copy-engine copy is a cuMemcpyAsync.
	MappingEpoch func() uint64
	// FeatureOff, when set, is told of each feature a copier starts without (copy replays only where
	// MappingEpoch asks for them) and of each one that turns off later (a refused write of the done word, a
	// failed capture): an agent logs it. It may run under the copier's lock, so it must not call the copier.
	FeatureOff func(ordinal int, f Feature, why string)
}

// CopyStats describes one completed Backend copy.
type CopyStats struct {
	Ordinal  int
	Segments int
	Bytes    uint64
	Mode     Mode
	// Device is the GPU time (Options.TimeDevice), Host the time Copy took.
	Device, Host time.Duration
	// Queueing is the host time between the device timing's two events being
	// queued: when it nears Device, the GPU waited on the host.
	Queueing time.Duration
}

const (
	defaultCopyEngineMin = 16 << 20
	defaultMaxPiece      = 32 << 10
	threadsPerBlock      = 256
	warpsPerBlock        = threadsPerBlock / 32
	blocksPerSM          = 8 // 2048 resident threads per SM on Hopper
	// defaultSleepRate (bytes/s) is above what any copy path reaches on current
	// GPUs (an H200 copies 2.1e12 B/s device to device).
	defaultSleepRate = 3e12
	// defaultResidentLayouts and maxResidentBytes bound the kept descriptor
	// sets: 8 sets of up to 2 MiB (262,144 blocks) each, in pinned host and
	// device memory.
	defaultResidentLayouts = 8
	maxResidentBytes       = 2 << 20
	// maxGatedOps is the most driver operations a timed submission queues
	// behind its held stream.
	maxGatedOps = 64
)

// Copier executes copies on one device's stream in its primary context.
type Copier struct {
	drv     *cuda.Driver
	ordinal int
	dev     cuda.Device
	ctx     cuda.Context
	sms     int
	stream  cuda.Stream
	kernels *Kernels
	mode    Mode
	reason  string
	opts    Options

	mu       sync.Mutex // serializes submissions on the stream
	closed   bool       // Close ran (c.mu): the stream is gone, so a watcher records no event on it
	last     *Pending   // the latest submission (c.mu): the next one ends after it
	slots    *gpushare.Staging[*slot]
	resident *gpushare.Resident[*slot]
	// bounce is device memory staged chunks pass through (SubmitBounced), grown to the largest chunk; one
	// serves every submission, since they run in order on the stream.
	bounce     cuda.DevicePtr
	bounceSize uint64
	iota       []uint32 // 0, 1, 2, ...: the packed positions of staged blocks (iotaLocked)

	events gpushare.Events[cuda.Event] // idle completion events

	// With Options.TimeDevice: a mapped pinned word the stream waits on before
	// each timed submission, raised once the submission is queued.
	gate       *cuda.StreamGate // nil: timings not held
	gateReason string

	// done is the word the stream writes behind each submission, which its waiter polls instead of the
	// driver (nil where the driver cannot, or once a write was refused: waiters then ask the driver).
	done       *cuda.DoneWord
	doneOff    bool // a write was refused: done stays allocated until Close, unused
	doneReason string
	// signalCount is the device word the kernels count their finished blocks in when they write the done word
	// themselves (fx_signal); 0: the stream writes the word behind every submission.
	signalCount cuda.DevicePtr

	// replays keeps repeated copy-engine ranges as graphs (nil: off); captures go to captureStream.
	replays       *copyReplays
	captureStream cuda.Stream

	check checkScratch // device memory of block lists checked on the GPU
	ids   *idBuffers   // the backend's pinned id buffers, read in place (nil for a Copier of its own)
}

// getEvent reuses an idle event (creating one costs a driver round trip per
// submission); the Copier's context must be current.
func (c *Copier) getEvent(timing bool) (cuda.Event, error) {
	if ev, ok := c.events.Get(timing); ok {
		return ev, nil
	}
	return c.drv.EventCreate(timing)
}

// NewCopier opens ordinal's primary context, creates a stream and loads the
// kernels; when they cannot be loaded it falls back to driver copies and
// Reason says why.
func NewCopier(drv *cuda.Driver, ordinal int, opts Options) (*Copier, error) {
	if opts.CopyEngineMin == 0 {
		opts.CopyEngineMin = defaultCopyEngineMin
	}
	if opts.MaxPiece == 0 {
		opts.MaxPiece = defaultMaxPiece
	}
	switch {
	case opts.PollGap == 0:
		opts.PollGap = 5 * time.Microsecond
	case opts.PollGap < 0:
		opts.PollGap = 0
	}
	if opts.SpinWait == 0 {
		opts.SpinWait = 200 * time.Microsecond
	}
	if opts.SleepRate <= 0 {
		opts.SleepRate = defaultSleepRate
	}
	if opts.ResidentLayouts == 0 {
		opts.ResidentLayouts = defaultResidentLayouts
	}
	if opts.MaxPiece&(opts.MaxPiece-1) != 0 {
		return nil, fmt.Errorf("piece size %d is not a power of two", opts.MaxPiece)
	}
	dev, err := drv.DeviceGet(ordinal)
	if err != nil {
		return nil, fmt.Errorf("opening GPU %d: %w", ordinal, err)
	}
	ctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		return nil, fmt.Errorf("retaining GPU %d's primary context: %w", ordinal, err)
	}
	c := &Copier{drv: drv, ordinal: ordinal, dev: dev, ctx: ctx, opts: opts}
	c.slots = newSlots(drv)
	if opts.MappingEpoch != nil && drv.HasGraphs() {
		c.replays = newCopyReplays(opts.MappingEpoch, c.captureCopy, func(x cuda.GraphExec) { _ = drv.GraphExecDestroy(x) })
		c.replays.stopped = func(why string) { c.reportOff(FeatureCopyReplay, why) }
	}
	c.resident = &gpushare.Resident[*slot]{Max: max(opts.ResidentLayouts, 0), MaxBytes: maxResidentBytes,
		Host: (*slot).host, Put: c.slots.Put}
	err = drv.WithContext(ctx, func() error {
		if c.sms, err = drv.DeviceAttribute(dev, cuda.AttrMultiprocessorCount); err != nil {
			return err
		}
		if c.stream, err = drv.StreamCreate(); err != nil {
			return err
		}
		if opts.TimeDevice {
			if c.gate, err = cuda.NewStreamGate(drv); err != nil {
				c.gateReason = err.Error()
			}
		}
		if c.done, err = cuda.NewDoneWord(drv); err != nil {
			c.doneReason = err.Error()
		}
		c.chooseMode()
		if c.mode == ModeKernel && c.done != nil {
			c.signalCount = c.newSignalCount()
		}
		return nil
	})
	if err != nil {
		_ = drv.PrimaryContextRelease(dev)
		return nil, fmt.Errorf("setting up GPU %d: %w", ordinal, err)
	}
	c.reportOffAtStart()
	return c, nil
}

// newSignalCount allocates the kernels' zeroed block counter; 0 where it cannot (the stream then writes the done
// word, as without kernels). The context is current.
func (c *Copier) newSignalCount() cuda.DevicePtr {
	p, err := c.drv.MemAlloc(16)
	if err != nil {
		return 0
	}
	if err := c.drv.MemsetD8(p, 0, 16); err != nil {
		_ = c.drv.MemFree(p)
		return 0
	}
	return p
}

func (c *Copier) chooseMode() {
	switch c.opts.Force {
	case ModeBatch, ModePerItem:
		c.mode, c.reason = c.opts.Force, "forced by options"
		if c.mode == ModeBatch && !c.drv.HasBatchCopy() {
			c.mode, c.reason = ModePerItem, "forced batch copy, but the driver has no cuMemcpyBatchAsync"
		}
		return
	}
	k, err := LoadKernels(c.drv, c.opts.NVRTC, c.dev, c.opts.CacheDir)
	if err == nil {
		c.kernels, c.mode = k, ModeKernel
		return
	}
	c.mode, c.reason = ModePerItem, err.Error()
	if c.drv.HasBatchCopy() {
		c.mode = ModeBatch
	}
}

// Mode is how scattered items move; Reason says why it is not ModeKernel.
func (c *Copier) Mode() Mode { return c.mode }

// Reason explains a fallback from the kernel ("" when the kernel is used).
func (c *Copier) Reason() string { return c.reason }

// TimingGated reports whether device timings (Options.TimeDevice) leave out
// the host's queueing, and if not, why.
func (c *Copier) TimingGated() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gate != nil, c.gateReason
}

// Kernels describes the loaded kernels (nil in a driver mode).
func (c *Copier) Kernels() *Kernels { return c.kernels }

// Context is the device's primary context the Copier runs in.
func (c *Copier) Context() cuda.Context { return c.ctx }

// Device is the Copier's device.
func (c *Copier) Device() cuda.Device { return c.dev }

// Stream is the stream copies are queued on.
func (c *Copier) Stream() cuda.Stream { return c.stream }

// Driver is the driver the Copier uses.
func (c *Copier) Driver() *cuda.Driver { return c.drv }

// Route says which hardware may touch a submission's memory.
type Route int

const (
	// RouteAuto: the kernel for scattered items, the copy engine for large ones.
	RouteAuto Route = iota
	// RouteDriver: driver copies only, for memory the GPU cannot address
	// (pageable host memory, which the driver stages).
	RouteDriver
)

// Submit queues segs on the stream and returns without waiting for the GPU.
// Every segment must be non-empty and reachable from this device.
func (c *Copier) Submit(segs []Segment) (*Pending, error) {
	return c.SubmitRoute(segs, RouteAuto)
}

// SubmitRoute is Submit with a route.
func (c *Copier) SubmitRoute(segs []Segment, route Route) (*Pending, error) {
	if len(segs) == 0 {
		return nil, errors.New("nothing to copy")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var nbytes, largest uint64
	for _, s := range segs {
		nbytes += s.Size
		largest = max(largest, s.Size)
	}
	small := segs
	var big []Segment
	switch {
	case route == RouteDriver:
		small, big = nil, segs
	case c.mode == ModeKernel && largest >= c.opts.CopyEngineMin:
		small, big = scatter.SplitBySize(segs, c.opts.CopyEngineMin)
	}
	var kw kernelWork
	switch {
	case len(small) == 1 && c.mode == ModeKernel:
		// One range needs no descriptors: its addresses are the launch's arguments, and the GPU reads nothing
		// across PCIe before it starts.
		kw.contig, small = small[0], nil
	case len(small) > 0 && c.mode == ModeKernel:
		kernelSegs := small // the closure must not see small cleared below
		kw.stage = func() (scatter.Layout, *slot, uint64, error) { return c.stageDescriptors(kernelSegs) }
		kw.resident = true
		small = nil
	}
	p, err := c.submitLocked(nbytes, kw, small, big, nil, route, route == RouteAuto)
	if err != nil {
		return nil, fmt.Errorf("queueing %d segments on GPU %d: %w", len(segs), c.dev, err)
	}
	return p, nil
}

// SubmitBlocks queues a block list over several region pairs (block srcIDs[i] of pair p's source to block
// dstIDs[i] of its destination, bs bytes each) as one kernel launch whose descriptors are written from the ids,
// with no segment per block. src and dst are the ids' ranges (every id must lie within them). Lists the flat kernels cannot take, blocks for the copy engine and copiers without
// kernels go as segments.
func (c *Copier) SubmitBlocks(pairs []scatter.BlockBases, bs uint64, srcIDs, dstIDs []uint32, src, dst scatter.IDRange) (*Pending, error) {
	if len(srcIDs) != len(dstIDs) {
		return nil, fmt.Errorf("%d source ids and %d destination ids", len(srcIDs), len(dstIDs))
	}
	l, ok := scatter.PlanBlocks(pairs, bs, len(srcIDs), src, dst, c.opts.MaxPiece)
	if !ok || c.mode != ModeKernel || bs >= c.opts.CopyEngineMin || len(pairs)*len(srcIDs) == 1 {
		segs := make([]Segment, 0, len(pairs)*len(srcIDs))
		for _, p := range pairs {
			for i := range srcIDs {
				segs = append(segs, Segment{Src: p.Src + uint64(srcIDs[i])*bs, Dst: p.Dst + uint64(dstIDs[i])*bs, Size: bs})
			}
		}
		return c.SubmitRoute(segs, RouteAuto)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	// A block list covers every layer in one launch, so there is no next layer to keep its descriptors for, and
	// hashing them would cost more than reading them once.
	p, err := c.submitLocked(uint64(l.Pieces)*bs, kernelWork{stage: c.blockStage(l, pairs, bs, srcIDs, dstIDs)}, nil, nil, nil, RouteAuto, false)
	if err != nil {
		return nil, fmt.Errorf("queueing %d blocks of %d region pairs on GPU %d: %w", len(srcIDs), len(pairs), c.dev, err)
	}
	return p, nil
}

// blockStage writes a block list's descriptors (PlanBlocks' layout l) from the ids into a staging slot.
func (c *Copier) blockStage(l scatter.Layout, pairs []scatter.BlockBases, bs uint64, srcIDs, dstIDs []uint32) func() (scatter.Layout, *slot, uint64, error) {
	return func() (scatter.Layout, *slot, uint64, error) {
		s, err := c.slots.Get(uint64(l.Bytes()))
		if err != nil {
			return l, nil, 0, err
		}
		scatter.WriteBlocks(s.host(), l, pairs, bs, srcIDs, dstIDs)
		descs := uint64(s.hostPtr)
		if c.opts.UploadDescriptors {
			descs = uint64(s.devPtr)
		}
		return l, s, descs, nil
	}
}

// kernelWork is what a submission's kernel moves: the descriptors stage writes (kept in device memory when
// resident is set and the set repeats), or one range, contig, whose addresses are the launch's arguments.
type kernelWork struct {
	stage    stageFunc
	resident bool
	contig   Segment
}

func (kw kernelWork) any() bool { return kw.stage != nil || kw.contig.Size > 0 }

// submitLocked queues one submission: kw's kernel, with big on the copy engine before it (replayed from kept
// graphs where replay allows: the caller's memory, not the copier's own) and after behind it, and driver as
// driver copies. c.mu is held.
func (c *Copier) submitLocked(nbytes uint64, kw kernelWork, driver, big, after []Segment, route Route, replay bool) (*Pending, error) {
	p := &Pending{c: c, bytes: nbytes}
	p.end.Start()
	err := c.drv.WithContextKept(c.ctx, func() error {
		// Host work first (descriptors), so a device timing covers only the GPU.
		var st staged
		kernel := kw.any()
		if kw.stage != nil {
			var err error
			if st.layout, p.slot, st.descs, err = kw.stage(); err != nil {
				return err
			}
			if kw.resident {
				c.findResident(p, &st)
			}
		}
		if c.opts.TimeDevice {
			// Only a few driver calls are held: thousands of per-item copies
			// would fill the driver's queue behind a held stream, and a copy
			// to or from pageable memory returns only once it has run.
			ops := len(big) + 2
			if !kernel && c.mode == ModePerItem {
				ops += len(driver)
			}
			if c.gate != nil && ops <= maxGatedOps && route != RouteDriver {
				// The stream holds the timed work until all of it is queued,
				// so the GPU time leaves out the host's driver calls.
				if open, err := c.gate.Hold(c.stream); err != nil {
					c.gateReason = err.Error()
					_ = c.gate.Close() // nothing waits on it: the wait was not queued
					c.gate = nil
				} else {
					defer open()
				}
			}
			ev, err := c.getEvent(true)
			if err != nil {
				return err
			}
			p.start = ev
			p.timedFrom = time.Now()
			if err := c.drv.EventRecord(ev, c.stream); err != nil {
				return err
			}
		}
		for _, s := range big {
			if err := c.copyEngine(s, replay); err != nil {
				return err
			}
		}
		// The kernel writes the done word itself when nothing is queued behind it.
		var sig scatter.Signal
		if kernel && len(after) == 0 {
			sig = c.kernelSignal()
		}
		switch {
		case kw.contig.Size > 0:
			if err := c.launchContig(kw.contig, sig); err != nil {
				return err
			}
		case kernel:
			if err := c.launchStaged(p, st, sig); err != nil {
				return err
			}
		case len(driver) > 0:
			if err := c.queueDriver(driver); err != nil {
				return err
			}
		}
		for _, s := range after {
			if err := c.drv.MemcpyAsync(s.Dst, s.Src, s.Size, c.stream); err != nil {
				return err
			}
		}
		err := c.queueEndAfter(p, sig)
		p.queued = time.Now()
		if !p.timedFrom.IsZero() {
			p.queueing = p.queued.Sub(p.timedFrom)
		}
		return err
	})
	if err != nil {
		// Work already queued may still run; wait it out so the staging slot and
		// the caller's buffers are not reused under it.
		_ = c.drv.WithContext(c.ctx, func() error { return c.drv.StreamSynchronize(c.stream) })
		c.release(p)
		return nil, err
	}
	if c.last != nil {
		p.prev.Store(c.last)
	}
	c.last = p
	return p, nil
}

// copyEngine queues s on the copy engine: from its kept graph where replay allows and the range repeats, else as
// a cuMemcpyAsync. c.mu is held and the context current.
func (c *Copier) copyEngine(s Segment, replay bool) error {
	if replay && c.replays != nil {
		if x, ok := c.replays.lookup(copyRange{dst: s.Dst, src: s.Src, size: s.Size}); ok {
			err := c.drv.GraphLaunch(x, c.stream)
			if err == nil {
				c.replays.launched++
				return nil
			}
			c.replays.stop(err)
		}
	}
	return c.drv.MemcpyAsync(s.Dst, s.Src, s.Size, c.stream)
}

// captureCopy instantiates r's copy, captured on a stream of its own (c.stream keeps running what is queued on
// it). c.mu is held and the context current.
func (c *Copier) captureCopy(r copyRange) (cuda.GraphExec, error) {
	if c.captureStream == 0 {
		s, err := c.drv.StreamCreate()
		if err != nil {
			return 0, fmt.Errorf("creating the capture stream: %w", err)
		}
		c.captureStream = s
	}
	x, err := c.drv.CaptureCopy(r.dst, r.src, r.size, c.captureStream)
	if err != nil {
		return 0, fmt.Errorf("capturing a copy of %d bytes: %w", r.size, err)
	}
	return x, nil
}

// queueEnd queues what tells p's waiters that it ended: the done word's next number and, only where there is no
// word or the GPU time is measured, a completion event. A waiter that blocks records an event then (watch): a
// recorded event per submission cost about 1.3 µs of driver time on the H200 VM, for the few copies that outlast
// the waiter's spin. c.mu is held and the context current.
func (c *Copier) queueEnd(p *Pending) error {
	if !c.opts.TimeDevice {
		if p.doneSeq = c.signalDone(); p.doneSeq != 0 {
			return nil
		}
	}
	ev, err := c.getEvent(c.opts.TimeDevice)
	if err != nil {
		return err
	}
	p.event = ev
	if err := c.drv.EventRecord(ev, c.stream); err != nil {
		return err
	}
	if c.opts.TimeDevice {
		p.doneSeq = c.signalDone()
	}
	return nil
}

// kernelSignal is the signal a kernel launched next passes to write the done word itself (the zero Signal, which
// signals nothing, when the stream must write it: timed submissions record an event first, and a copier without
// the word or the kernels' block counter has none). c.mu is held.
func (c *Copier) kernelSignal() scatter.Signal {
	if c.opts.TimeDevice || c.done == nil || c.doneOff || c.signalCount == 0 {
		return scatter.Signal{}
	}
	return scatter.Signal{Done: uint64(c.done.Addr()), Count: uint64(c.signalCount), Seq: c.done.Next()}
}

// queueEndAfter is queueEnd for a submission whose last launch passed sig: a kernel that writes the done word
// itself leaves nothing to queue.
func (c *Copier) queueEndAfter(p *Pending, sig scatter.Signal) error {
	if sig.Done == 0 {
		return c.queueEnd(p)
	}
	c.done.Advance(sig.Seq)
	p.doneSeq, p.byKernel = sig.Seq, true
	return nil
}

// recordBehindQueued records an event of its own behind everything the stream holds (a waiter's, which puts it
// back once it completed); errCopierClosed once Close ran, when there is no stream to record on.
func (c *Copier) recordBehindQueued() (cuda.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errCopierClosed
	}
	var ev cuda.Event
	err := c.drv.WithContext(c.ctx, func() error {
		var err error
		if ev, err = c.getEvent(false); err != nil {
			return err
		}
		return c.drv.EventRecord(ev, c.stream)
	})
	return ev, err
}

// signalDone queues the write of the done word behind what the stream holds and returns its sequence number, 0
// when there is no word (waiters then ask the driver). A refused write turns the word off for good. c.mu is
// held and the context current.
func (c *Copier) signalDone() uint32 {
	if c.done == nil || c.doneOff {
		return 0
	}
	seq, err := c.done.Signal(c.stream)
	if err != nil {
		c.doneOff, c.doneReason = true, err.Error()
		c.reportOff(FeatureDoneWord, c.doneReason)
		return 0
	}
	return seq
}

// DoneWord reports whether waiters poll a word the stream writes (true) or the driver, and why not.
func (c *Copier) DoneWord() (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done != nil && !c.doneOff, c.doneReason
}

// queueDriver queues segs as driver copies: one batch call where the driver
// has it (and the mode allows), else one call per segment.
func (c *Copier) queueDriver(segs []Segment) error {
	if c.mode == ModeBatch {
		dsts := make([]cuda.DevicePtr, len(segs))
		srcs := make([]cuda.DevicePtr, len(segs))
		sizes := make([]uint64, len(segs))
		for i, s := range segs {
			dsts[i], srcs[i], sizes[i] = cuda.DevicePtr(s.Dst), cuda.DevicePtr(s.Src), s.Size
		}
		return c.drv.MemcpyBatchAsync(dsts, srcs, sizes, c.stream)
	}
	for _, s := range segs {
		if err := c.drv.MemcpyAsync(s.Dst, s.Src, s.Size, c.stream); err != nil {
			return err
		}
	}
	return nil
}

// stageDescriptors writes segs' descriptors into a staging slot and returns
// the address the kernel will read them from.
func (c *Copier) stageDescriptors(segs []Segment) (scatter.Layout, *slot, uint64, error) {
	layout, err := scatter.Plan(segs, c.opts.MaxPiece)
	if err != nil {
		return layout, nil, 0, err
	}
	s, err := c.slots.Get(uint64(layout.Bytes()))
	if err != nil {
		return layout, nil, 0, err
	}
	scatter.Write(s.host(), segs, layout, c.opts.MaxPiece)
	descs := uint64(s.hostPtr)
	if c.opts.UploadDescriptors {
		descs = uint64(s.devPtr)
	}
	return layout, s, descs, nil
}

// staged is where a submission's kernel reads its descriptors.
type staged struct {
	layout scatter.Layout
	descs  uint64 // the address the kernel reads
	// A set that may be kept: its key, and whether an identical one was found.
	keepable   bool
	key        uint64
	kind       [2]uint64
	fromDevice bool
}

// findResident looks for a kept device copy of p's staged descriptors. It is
// host work (a hash and a compare of the bytes), done before a device timing
// starts.
func (c *Copier) findResident(p *Pending, st *staged) {
	l := st.layout
	b := p.slot.host()[:l.Bytes()]
	// The whole staging buffer is what a kept set holds out of the pool.
	if !l.Flat16 || !c.resident.Keeps(len(b)) || !c.resident.Keeps(int(p.slot.size)) {
		return
	}
	// Equal bytes mean equal copies only under the same piece size and
	// offset encoding.
	st.keepable = true
	st.kind = [2]uint64{l.PieceSize<<8 | uint64(l.Shift), l.Unit<<16 | uint64(l.SrcBits)<<8 | uint64(l.DstBits)}
	st.key = c.resident.Key(st.kind, b)
	if e := c.resident.Lookup(st.key, st.kind, b); e != nil {
		p.resident, p.reused = e, true
		st.descs, st.fromDevice = uint64(e.Buf.devPtr), true
		c.slots.Put(p.slot) // nothing on the GPU reads this staging
		p.slot = nil
	}
}

// launchStaged queues the kernel over st's descriptors, uploading them first
// with Options.UploadDescriptors; a set that may be kept and was not found
// has its device copy written by this launch and is kept.
func (c *Copier) launchStaged(p *Pending, st staged, sig scatter.Signal) error {
	if st.fromDevice {
		return c.launch(st.layout, st.descs, 0, sig)
	}
	var keep uint64
	if c.opts.UploadDescriptors {
		if err := c.drv.MemcpyHtoDAsync(p.slot.devPtr, p.slot.hostPtr, uint64(st.layout.Bytes()), c.stream); err != nil {
			return err
		}
	} else if st.keepable {
		keep = uint64(p.slot.devPtr)
	}
	if err := c.launch(st.layout, st.descs, keep, sig); err != nil {
		return err
	}
	if st.keepable {
		p.resident = c.resident.Adopt(st.key, st.kind, st.layout.Bytes(), p.slot)
		p.slot = nil
	}
	return nil
}

// launch queues the scatter kernel over descriptors already in place; the
// flat kernel also copies them to keep (device memory) unless it is 0. One
// launch is at most one full wave of resident blocks.
func (c *Copier) launch(layout scatter.Layout, descs, keep uint64, sig scatter.Signal) error {
	kind, grid := scatter.Shape(layout, threadsPerBlock, warpsPerBlock, uint64(c.sms*blocksPerSM))
	cfg := cuda.LaunchConfig{GridX: grid, BlockX: threadsPerBlock, Stream: c.stream}
	var args scatter.Args
	ptrs, n := args.Signalled(kind, layout, descs, keep, sig)
	return c.drv.Launch(c.kernels.copy.ByKind(kind), cfg, ptrs[:n])
}

// launchContig queues the contiguous-copy kernel over one range: a block per 16 KiB (a thread's four 16-byte
// vectors), at most a wave of resident blocks. The context must be current.
func (c *Copier) launchContig(s Segment, sig scatter.Signal) error {
	blocks := min((s.Size+threadsPerBlock*64-1)/(threadsPerBlock*64), uint64(c.sms*blocksPerSM))
	cfg := cuda.LaunchConfig{GridX: uint32(max(blocks, 1)), BlockX: threadsPerBlock, Stream: c.stream}
	var args scatter.Args
	ptrs, n := args.Contig(s.Dst, s.Src, s.Size, sig)
	return c.drv.Launch(c.kernels.copy.Contig, cfg, ptrs[:n])
}

// Prepared is a descriptor set placed once and launchable many times, for
// callers that repeat the same scattered copy (and for measuring the kernel
// alone).
type Prepared struct {
	c      *Copier
	layout scatter.Layout
	slot   *slot
	descs  uint64
}

// Prepare stages and uploads the descriptors for segs (kernel mode only).
func (c *Copier) Prepare(segs []Segment) (*Prepared, error) {
	if c.kernels == nil {
		return nil, errors.New("no copy kernels loaded: " + c.reason)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := &Prepared{c: c}
	err := c.drv.WithContext(c.ctx, func() error {
		var err error
		if p.layout, p.slot, p.descs, err = c.stageDescriptors(segs); err != nil {
			return err
		}
		if !c.opts.UploadDescriptors {
			return nil
		}
		if err := c.drv.MemcpyHtoDAsync(p.slot.devPtr, p.slot.hostPtr, uint64(p.layout.Bytes()), c.stream); err != nil {
			return err
		}
		return c.drv.StreamSynchronize(c.stream)
	})
	if err != nil {
		if p.slot != nil {
			c.slots.Put(p.slot)
		}
		return nil, err
	}
	return p, nil
}

// Launch queues the kernel on the Copier's stream; completion is the
// caller's to observe (stream or event).
func (p *Prepared) Launch() error {
	p.c.mu.Lock()
	defer p.c.mu.Unlock()
	return p.c.drv.WithContext(p.c.ctx, func() error { return p.c.launch(p.layout, p.descs, 0, scatter.Signal{}) })
}

// Release hands the staging back; no launch of p may still be running.
func (p *Prepared) Release() {
	if p.slot != nil {
		p.c.slots.Put(p.slot)
		p.slot = nil
	}
}

// LaunchContiguous queues the contiguous-copy kernel (benchmarks compare it
// with the copy engine). The current context must be the Copier's.
func (c *Copier) LaunchContiguous(dst, src, n uint64) error {
	if c.kernels == nil {
		return errors.New("no copy kernels loaded: " + c.reason)
	}
	return c.launchContig(Segment{Src: src, Dst: dst, Size: n}, scatter.Signal{})
}

func (c *Copier) release(p *Pending) {
	c.events.Put(p.start, true)
	c.events.Put(p.event, c.opts.TimeDevice)
	if p.slot != nil {
		c.slots.Put(p.slot)
	}
	if p.resident != nil {
		c.resident.Done(p.resident)
	}
}

// Close waits for queued work and frees the stream, staging memory and kernels.
func (c *Copier) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	err := c.drv.WithContext(c.ctx, func() error {
		errs := []error{c.drv.StreamSynchronize(c.stream)}
		c.resident.Drain()
		errs = append(errs, c.freeScratch(), c.freeBounce(), c.slots.Close(), c.drv.StreamDestroy(c.stream))
		if c.replays != nil {
			c.replays.dropAll()
		}
		if c.captureStream != 0 {
			errs = append(errs, c.drv.StreamDestroy(c.captureStream))
		}
		if c.gate != nil {
			errs = append(errs, c.gate.Close())
		}
		if c.done != nil {
			errs = append(errs, c.done.Close())
		}
		if c.signalCount != 0 {
			errs = append(errs, c.drv.MemFree(c.signalCount))
		}
		errs = append(errs, c.events.Destroy(c.drv.EventDestroy)...)
		if c.kernels != nil {
			errs = append(errs, c.drv.ModuleUnload(c.kernels.module))
		}
		return errors.Join(errs...)
	})
	return errors.Join(err, c.drv.PrimaryContextRelease(c.dev))
}
