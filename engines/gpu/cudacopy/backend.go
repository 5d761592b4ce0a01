// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// Backend is the CUDA backend of the xgmi engine: same-node copies where at
// least one side is NVIDIA GPU memory, between GPUs with peer access, inside
// one GPU, and between a GPU and host memory.
type Backend struct {
	drv  *cuda.Driver
	opts Options

	mu      sync.Mutex
	copiers map[int]*Copier // by CUDA ordinal
	ords    gpushare.Ordinals
	regions map[engines.MemoryID]*mapped
	peers   map[[2]int]error // (from, to) ordinals → enabling peer access
	segPool sync.Pool        // *[]Segment
	ids     *idBuffers       // pinned block-id buffers (PinnedIDs)
}

// mapped is how this process reaches one registered region.
type mapped struct {
	ordinal int    // CUDA ordinal; -1 for host memory
	addr    uint64 // address of the region's first byte, in this process
	release func() error
	// pinned host memory can be read by kernels; pageable host memory only by driver copies.
	pinned bool
	// refs counts the tcp engine's staged handles on the mapping (guarded by Backend.mu); when the same-node
	// engine releases it while some remain, dropped is set and the last handle releases it.
	refs    int
	dropped bool
}

// waitAfterCancel bounds how long Copy waits for queued GPU work after its
// context ended: a launched kernel cannot be recalled, and the contract says
// Copy returns only once the hardware has stopped touching the memory.
const waitAfterCancel = 30 * time.Second

// NewBackend returns the CUDA backend; copiers are created per GPU on first use.
func NewBackend(drv *cuda.Driver, opts Options) (*Backend, error) {
	b := &Backend{drv: drv, opts: opts, copiers: map[int]*Copier{}, ords: gpushare.Ordinals{Runtime: "CUDA"},
		regions: map[engines.MemoryID]*mapped{}, peers: map[[2]int]error{}}
	b.segPool.New = func() any { return new([]Segment) }
	b.ids = &idBuffers{bases: map[uintptr]bool{}}
	b.ids.alloc = func(size uint64) (p uintptr, err error) {
		err = b.inSomeContext(func() (err error) { p, err = drv.MemHostAlloc(size); return err })
		return p, err
	}
	b.ids.drop = func(p uintptr) error { return b.inSomeContext(func() error { return drv.MemFreeHost(p) }) }
	n, err := drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("counting CUDA devices: %w", err)
	}
	for i := 0; i < n; i++ {
		dev, err := drv.DeviceGet(i)
		if err != nil {
			return nil, err
		}
		bus, err := drv.DevicePCIBusID(dev)
		if err != nil {
			return nil, err
		}
		b.ords.Add(bus, i)
	}
	return b, nil
}

// Name implements xgmi.Backend.
func (b *Backend) Name() string { return "cuda" }

// Limits implements xgmi.Backend: one launch takes at most 2^32-1 pieces.
func (b *Backend) Limits() engines.Limits {
	return engines.Limits{MaxPlanSegments: 1 << 24, BlockPlans: true}
}

// ordinal maps a location to a CUDA ordinal.
func (b *Backend) ordinal(loc engines.Location) (int, error) { return b.ords.Of(loc) }

func (b *Backend) copier(ordinal int) (*Copier, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.copiers[ordinal]; ok {
		return c, nil
	}
	c, err := NewCopier(b.drv, ordinal, b.opts)
	if err != nil {
		return nil, err
	}
	c.ids = b.ids
	b.copiers[ordinal] = c
	return c, nil
}

// inSomeContext runs fn with the context of a GPU this backend has set up current (for pinned memory, which
// every context reaches); errNoCopier when none is.
func (b *Backend) inSomeContext(fn func() error) error {
	b.mu.Lock()
	var c *Copier
	for _, k := range b.copiers {
		c = k
		break
	}
	b.mu.Unlock()
	if c == nil {
		return errNoCopier
	}
	return b.drv.WithContext(c.ctx, fn)
}

// errNoCopier: no GPU has been set up yet (nothing registered).
var errNoCopier = errors.New("no GPU set up yet")

// Mode reports how scattered items move on GPU ordinal, and why not with the
// kernel when they do not.
func (b *Backend) Mode(ordinal int) (Mode, string, error) {
	c, err := b.copier(ordinal)
	if err != nil {
		return "", "", err
	}
	return c.Mode(), c.Reason(), nil
}

func isNVIDIAGPU(d *engines.MemoryDesc) bool {
	return d.Location.Kind == engines.LocationGPU && d.Location.Vendor == engines.VendorNVIDIA
}

// Claims implements xgmi.Backend.
func (b *Backend) Claims(src, dst *engines.MemoryDesc) (bool, string) {
	b.mu.Lock()
	ms, okS := b.regions[src.ID]
	md, okD := b.regions[dst.ID]
	b.mu.Unlock()
	s, d := gpushare.Side{Mapped: okS, Ordinal: -1}, gpushare.Side{Mapped: okD, Ordinal: -1}
	if okS {
		s.Ordinal = ms.ordinal
	}
	if okD {
		d.Ordinal = md.ordinal
	}
	return gpushare.Claim(engines.VendorNVIDIA, src, dst, s, d, b.enablePeer)
}

// enablePeer makes from's context able to address to's memory (once).
func (b *Backend) enablePeer(from, to int) error {
	b.mu.Lock()
	err, done := b.peers[[2]int{from, to}]
	b.mu.Unlock()
	if done {
		return err
	}
	err = func() error {
		fd, err := b.drv.DeviceGet(from)
		if err != nil {
			return err
		}
		td, err := b.drv.DeviceGet(to)
		if err != nil {
			return err
		}
		ok, err := b.drv.CanAccessPeer(fd, td)
		if err != nil {
			return err
		}
		if !ok {
			return errors.New("no peer access between them (no NVLink or PCIe P2P)")
		}
		fc, err := b.copier(from)
		if err != nil {
			return err
		}
		tc, err := b.copier(to)
		if err != nil {
			return err
		}
		return b.drv.WithContext(fc.Context(), func() error { return b.drv.CtxEnablePeerAccess(tc.Context()) })
	}()
	b.mu.Lock()
	b.peers[[2]int{from, to}] = err
	b.mu.Unlock()
	return err
}

// Register implements xgmi.Backend: GPU memory is mapped into this process
// (imported from a VMM fd or IPC handle when it belongs to another process)
// and checked against the driver's view of its allocation; host memory is
// pinned when the driver allows, so kernels can address it.
func (b *Backend) Register(ctx context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	switch {
	case isNVIDIAGPU(&d):
		m, out, err := b.registerGPU(ctx, d)
		if err != nil {
			return d, err
		}
		b.mu.Lock()
		b.regions[d.ID] = m
		b.mu.Unlock()
		return out, nil
	case d.Location.Kind == engines.LocationHost && d.Handles.Host != nil:
		m := &mapped{ordinal: -1, addr: uint64(uintptr(unsafe.Pointer(&d.Handles.Host[0])))}
		// Pinning is an optimisation: memory the driver will not pin (already
		// pinned elsewhere, limits) still moves, through driver copies.
		if b.ords.Count() > 0 && b.withOrdinal(0, func() error { return b.drv.MemHostRegister(uintptr(m.addr), d.Size) }) == nil {
			m.pinned = true
			m.release = func() error {
				return b.withOrdinal(0, func() error { return b.drv.MemHostUnregister(uintptr(m.addr)) })
			}
		}
		b.mu.Lock()
		b.regions[d.ID] = m
		b.mu.Unlock()
	}
	return d, nil
}

func (b *Backend) registerGPU(ctx context.Context, d engines.MemoryDesc) (*mapped, engines.MemoryDesc, error) {
	ord, err := b.ordinal(d.Location)
	if err != nil {
		return nil, d, err
	}
	c, err := b.copier(ord)
	if err != nil {
		return nil, d, err
	}
	m := &mapped{ordinal: ord}
	err = b.drv.WithContext(c.Context(), func() error {
		switch {
		case d.Handles.Ptr != 0:
			return b.adoptPointer(c, m, &d)
		case d.Handles.VMM != nil:
			return b.importVMM(ctx, c, m, &d)
		case len(d.Handles.IPC) == engines.IPCHandleSize:
			return b.openIPC(m, &d)
		}
		return fmt.Errorf("GPU memory %s has no pointer, VMM fd or IPC handle", d.ID)
	})
	if err != nil {
		return nil, d, fmt.Errorf("mapping %s on GPU %d: %w", d.ID, ord, err)
	}
	return m, d, nil
}

// adoptPointer checks that [Ptr, Ptr+Size) is device memory of this GPU inside
// one allocation (an overrun on a GPU is silent corruption), and exports the
// handles other processes need to reach it.
func (b *Backend) adoptPointer(c *Copier, m *mapped, d *engines.MemoryDesc) error {
	info, err := b.drv.PointerGetInfo(uint64(d.Handles.Ptr))
	if err != nil {
		return fmt.Errorf("pointer %#x is not GPU memory the driver knows: %w", d.Handles.Ptr, err)
	}
	if info.Type != cuda.MemoryTypeDevice || info.Ordinal != m.ordinal {
		return fmt.Errorf("pointer %#x is memory type %d on device %d, not device memory of GPU %d", d.Handles.Ptr, info.Type, info.Ordinal, m.ordinal)
	}
	start := uint64(d.Handles.Ptr)
	if start+d.Size < start || start+d.Size > info.RangeStart+info.RangeSize {
		return fmt.Errorf("region [%#x, +%d) runs past its allocation [%#x, +%d)", start, d.Size, info.RangeStart, info.RangeSize)
	}
	m.addr = start
	types, err := b.drv.PointerHandleTypes(start)
	if err == nil && types&cuda.HandleTypePosixFD != 0 && d.Handles.VMM == nil {
		if h, base, size, err := b.drv.AllocationOf(cuda.DevicePtr(start)); err == nil {
			if fd, err := b.drv.ExportPosixFD(h); err == nil {
				f := newFile(fd, string(d.ID))
				d.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, Offset: start - uint64(base), AllocSize: size}
				m.release = f.Close
			}
			_ = b.drv.MemRelease(h)
		}
	}
	if types == 0 && len(d.Handles.IPC) == 0 {
		// cuMemAlloc memory: a legacy IPC handle names the allocation holding it.
		if h, err := b.drv.IPCGetMemHandle(cuda.DevicePtr(info.RangeStart)); err == nil {
			d.Handles.IPC, d.Handles.IPCOffset = h[:], start-info.RangeStart
		}
	}
	return nil
}

// importVMM imports the allocations another process exported as POSIX fds and maps them back to back, as the
// owner did, readable and writable by every GPU that can reach them: the region is one pointer however many
// allocations it spans.
func (b *Backend) importVMM(ctx context.Context, c *Copier, m *mapped, d *engines.MemoryDesc) error {
	v := d.Handles.VMM
	g, err := b.drv.Granularity(c.Device(), cuda.HandleTypePosixFD)
	if err != nil {
		return fmt.Errorf("reading the VMM granularity: %w", err)
	}
	fds := make([]int, len(v.FDs))
	for i, f := range v.FDs {
		fds[i] = int(f.Fd())
	}
	r, err := cuda.ImportRange(ctx, b.drv, fds, v.AllocSize, g, b.accessors(m.ordinal))
	if err != nil {
		return err
	}
	m.addr = uint64(r.Ptr) + v.Offset
	m.release = func() error {
		return b.withOrdinal(m.ordinal, func() error { return r.Release(b.drv) })
	}
	return nil
}

// The agent's bound on a region's allocations and the one the driver wrapper enforces must agree: this
// constant does not compile when they differ.
const _ = uint(engines.MaxVMMAllocations-cuda.MaxRangeAllocations) + uint(cuda.MaxRangeAllocations-engines.MaxVMMAllocations)

// accessors are the GPUs granted access to memory of GPU owner: itself and
// every GPU with peer access to it.
func (b *Backend) accessors(owner int) []cuda.Device {
	od, _ := b.drv.DeviceGet(owner)
	devs := []cuda.Device{od}
	for i := range b.ords.Count() {
		if i == owner {
			continue
		}
		d, err := b.drv.DeviceGet(i)
		if err != nil {
			continue
		}
		if ok, err := b.drv.CanAccessPeer(d, od); err == nil && ok {
			devs = append(devs, d)
		}
	}
	return devs
}

func (b *Backend) openIPC(m *mapped, d *engines.MemoryDesc) error {
	var h cuda.IPCMemHandle
	copy(h[:], d.Handles.IPC)
	ptr, err := b.drv.IPCOpenMemHandle(h)
	if err != nil {
		return err
	}
	m.addr = uint64(ptr) + d.Handles.IPCOffset
	m.release = func() error { return b.withOrdinal(m.ordinal, func() error { return b.drv.IPCCloseMemHandle(ptr) }) }
	return nil
}

func (b *Backend) withOrdinal(ord int, fn func() error) error {
	c, err := b.copier(ord)
	if err != nil {
		return err
	}
	return b.drv.WithContext(c.Context(), fn)
}

// Release implements xgmi.Backend.
func (b *Backend) Release(_ context.Context, d *engines.MemoryDesc) error {
	b.mu.Lock()
	m, ok := b.regions[d.ID]
	delete(b.regions, d.ID)
	held := ok && m.refs > 0
	if held {
		m.dropped = true // the tcp engine still stages it: its last handle releases the mapping
	}
	b.mu.Unlock()
	if !ok || held || m.release == nil {
		return nil
	}
	if err := m.release(); err != nil {
		return fmt.Errorf("releasing %s: %w", d.ID, err)
	}
	return nil
}

// Copy implements xgmi.Backend: every segment of the plan in one submission
// on the source GPU's stream (the destination's when the source is host
// memory); pushing over NVLink keeps the reads local.
func (b *Backend) Copy(ctx context.Context, w engines.Work) error {
	b.mu.Lock()
	ms, okS := b.regions[w.Src.ID]
	md, okD := b.regions[w.Dst.ID]
	b.mu.Unlock()
	if !okS || !okD {
		return fmt.Errorf("%w: region not mapped by the cuda backend", engines.ErrUnknownMemory)
	}
	ord := ms.ordinal
	if ord < 0 {
		ord = md.ordinal
	}
	c, err := b.copier(ord)
	if err != nil {
		return err
	}
	// The segment list is recycled: a plan of many small blocks would
	// otherwise allocate (and collect) hundreds of kilobytes per copy.
	buf := b.segPool.Get().(*[]Segment)
	defer b.segPool.Put(buf)
	segs := (*buf)[:0]
	for _, s := range engines.SegmentsOf(w.Plan) {
		segs = append(segs, Segment{Src: ms.addr + s.SrcOffset, Dst: md.addr + s.DstOffset, Size: s.Size})
	}
	*buf = segs
	route := RouteAuto
	if (ms.ordinal < 0 && !ms.pinned) || (md.ordinal < 0 && !md.pinned) {
		route = RouteDriver
	}
	start := time.Now()
	p, err := c.SubmitRoute(segs, route)
	if err != nil {
		return err
	}
	if b.opts.Observe != nil {
		defer func() {
			if p.Done() && p.err == nil {
				b.opts.Observe(CopyStats{Ordinal: ord, Segments: len(segs), Bytes: w.Plan.Bytes, Mode: c.Mode(),
					Device: p.DeviceTime(), Host: time.Since(start), Queueing: p.queueing})
			}
		}()
	}
	return waitPending(ctx, p)
}

// StartBlocks implements xgmi.BlockCopier: the block plans of one submission (every region pair of a KV
// layout) go to each source GPU's stream as one launch whose descriptors come from the ids.
func (b *Backend) StartBlocks(ctx context.Context, works []engines.Work) (xgmi.Started, error) {
	type group struct {
		pairs []scatter.BlockBases
		bytes uint64
	}
	groups := map[int]*group{}
	var order []int
	var list *engines.BlockList
	b.mu.Lock()
	for _, w := range works {
		ms, okS := b.regions[w.Src.ID]
		md, okD := b.regions[w.Dst.ID]
		if !okS || !okD {
			b.mu.Unlock()
			return xgmi.Started{}, fmt.Errorf("%w: region not mapped by the cuda backend", engines.ErrUnknownMemory)
		}
		if (ms.ordinal < 0 && !ms.pinned) || (md.ordinal < 0 && !md.pinned) || w.Plan.Blocks == nil ||
			(list != nil && w.Plan.Blocks != list) {
			b.mu.Unlock()
			if err := checkLists(works); err != nil {
				return xgmi.Started{}, err
			}
			// Pageable host memory goes through the driver, segment by segment, when waited for.
			return xgmi.Started{Wait: func(ctx context.Context) error { return b.copyEach(ctx, works) }}, nil
		}
		list = w.Plan.Blocks
		ord := ms.ordinal
		if ord < 0 {
			ord = md.ordinal
		}
		g := groups[ord]
		if g == nil {
			g = &group{}
			groups[ord] = g
			order = append(order, ord)
		}
		g.pairs = append(g.pairs, scatter.BlockBases{Src: ms.addr, Dst: md.addr})
		g.bytes += w.Plan.Bytes
	}
	b.mu.Unlock()
	copiers := make([]*Copier, len(order))
	onDevice := list.Unchecked
	for i, ord := range order {
		c, err := b.copier(ord)
		if err != nil {
			return xgmi.Started{}, err
		}
		copiers[i] = c
		onDevice = onDevice && c.checkable(groups[ord].pairs, list.BlockBytes, len(list.SrcIDs), list.DstBlocks)
	}
	// A list left to the engine is checked here, on the host, when the GPU cannot check it: before anything moves.
	if list.Unchecked && !onDevice {
		if err := list.Check(); err != nil {
			return xgmi.Started{}, err
		}
	}
	var pend []*Pending
	var err error
	for i, ord := range order {
		c := copiers[i]
		var p *Pending
		if onDevice {
			p, err = c.SubmitCheckedBlocks(groups[ord].pairs, list.BlockBytes, list.SrcIDs, list.DstIDs, list.SrcBlocks, list.DstBlocks)
		} else {
			p, err = c.SubmitBlocks(groups[ord].pairs, list.BlockBytes, list.SrcIDs, list.DstIDs,
				scatter.IDRange{Min: list.SrcMin, Max: list.SrcMax}, scatter.IDRange{Min: list.DstMin, Max: list.DstMax})
		}
		if err != nil {
			break
		}
		pend = append(pend, p)
	}
	wait := func(ctx context.Context) error {
		var werr error
		for _, p := range pend {
			if e := waitPending(ctx, p); e != nil && werr == nil {
				werr = e
			}
		}
		return werr
	}
	if err != nil {
		// Every queued launch is waited for first: the caller's memory must be left alone.
		_ = wait(ctx)
		return xgmi.Started{}, err
	}
	poll := func() (bool, error) {
		var perr error
		for _, p := range pend {
			if !p.Done() {
				return false, nil
			}
			if p.err != nil && perr == nil {
				perr = p.err
			}
		}
		return true, perr
	}
	return xgmi.Started{Wait: wait, Poll: poll}, nil
}

// checkLists checks, on the host, every block list of works that planning left unchecked.
func checkLists(works []engines.Work) error {
	for _, w := range works {
		if l := w.Plan.Blocks; l != nil {
			if err := l.Check(); err != nil {
				return err
			}
		}
	}
	return nil
}

// ChecksBlocksAtRun implements engines.RunChecker for the xgmi engine: a block list between two regions this
// backend maps, on a GPU whose copier has the checked kernels, is checked on the GPU as it moves.
func (b *Backend) ChecksBlocksAtRun(src, dst *engines.MemoryDesc, bs uint64, ids int) bool {
	if ids < minCheckedIDs {
		return false
	}
	b.mu.Lock()
	ms, okS := b.regions[src.ID]
	md, okD := b.regions[dst.ID]
	b.mu.Unlock()
	if !okS || !okD || (ms.ordinal < 0 && !ms.pinned) || (md.ordinal < 0 && !md.pinned) || ms.addr%16 != 0 || md.addr%16 != 0 {
		return false
	}
	ord := ms.ordinal
	if ord < 0 {
		ord = md.ordinal
	}
	if ord < 0 {
		return false
	}
	c, err := b.copier(ord)
	return err == nil && c.CanCheckBlocks(bs, uint32(min(dst.Size/max(bs, 1), math.MaxUint32)))
}

// copyEach copies the plans one by one as segments.
func (b *Backend) copyEach(ctx context.Context, works []engines.Work) error {
	for _, w := range works {
		w.Plan = engines.InSegments(w.Plan)
		if err := b.Copy(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

// waitPending waits for p; when ctx ends first it still waits (bounded) for the GPU to stop.
func waitPending(ctx context.Context, p *Pending) error {
	if err := p.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			wctx, cancel := context.WithTimeout(context.Background(), waitAfterCancel)
			defer cancel()
			if werr := p.Wait(wctx); werr != nil && wctx.Err() != nil {
				return fmt.Errorf("%w; the GPU copy did not finish within %v afterwards", ctx.Err(), waitAfterCancel)
			}
			return ctx.Err()
		}
		return err
	}
	return nil
}

// Close releases every mapping and copier.
func (b *Backend) Close() error {
	errs := []error{b.ids.close()} // while a copier's context is still there to free them in
	b.mu.Lock()
	regions, copiers := b.regions, b.copiers
	b.regions, b.copiers = map[engines.MemoryID]*mapped{}, map[int]*Copier{}
	b.mu.Unlock()
	for id, m := range regions {
		if m.release != nil {
			if err := m.release(); err != nil {
				errs = append(errs, fmt.Errorf("releasing %s: %w", id, err))
			}
		}
	}
	for _, c := range copiers {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
