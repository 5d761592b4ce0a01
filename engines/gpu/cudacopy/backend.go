// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

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
	reg  *gpushare.Registry[*Copier, cuda.Device] // copiers by CUDA ordinal, mapped regions, peer pairs
	ids  *idBuffers                               // pinned block-id buffers (PinnedIDs)
}

// mapped is how this process reaches one registered region; pinned host memory can be read by kernels,
// pageable host memory only by driver copies.
type mapped = gpushare.Region

// runtime is what the registry asks of the CUDA driver: each GPU runs in its primary context, which its
// copier retains.
type runtime struct {
	*cuda.Driver
	b *Backend
}

func (r runtime) NewCopier(ordinal int) (*Copier, error) {
	opts := r.b.opts
	opts.MappingEpoch = r.b.reg.MappingEpoch
	c, err := NewCopier(r.Driver, ordinal, opts)
	if err != nil {
		return nil, err
	}
	c.ids = r.b.ids
	return c, nil
}

func (r runtime) InOrdinal(ordinal int, fn func() error) error {
	c, err := r.b.copier(ordinal)
	if err != nil {
		return err
	}
	return r.WithContext(c.Context(), fn)
}

// EnablePeer makes from's context able to address to's memory.
func (r runtime) EnablePeer(from, to int, _, _ cuda.Device) error {
	fc, err := r.b.copier(from)
	if err != nil {
		return err
	}
	tc, err := r.b.copier(to)
	if err != nil {
		return err
	}
	return r.WithContext(fc.Context(), func() error { return r.CtxEnablePeerAccess(tc.Context()) })
}

// NewBackend returns the CUDA backend; copiers are created per GPU on first use.
func NewBackend(drv *cuda.Driver, opts Options) (*Backend, error) {
	b := &Backend{drv: drv, opts: opts}
	b.reg = gpushare.NewRegistry[*Copier, cuda.Device](runtime{drv, b}, "cuda", "CUDA", engines.VendorNVIDIA, "NVLink")
	b.ids = &idBuffers{bases: map[uintptr]uint64{}}
	b.ids.alloc = func(size uint64) (p uintptr, err error) {
		err = b.inSomeContext(func() (err error) { p, err = drv.MemHostAlloc(size); return err })
		return p, err
	}
	b.ids.drop = func(p uintptr) error { return b.inSomeContext(func() error { return drv.MemFreeHost(p) }) }
	if err := b.reg.Enumerate(); err != nil {
		return nil, err
	}
	return b, nil
}

// Name implements xgmi.Backend.
func (b *Backend) Name() string { return "cuda" }

// Limits implements xgmi.Backend: one launch takes at most 2^32-1 pieces.
func (b *Backend) Limits() engines.Limits {
	return engines.Limits{MaxPlanSegments: 1 << 24, BlockPlans: true}
}

func (b *Backend) copier(ordinal int) (*Copier, error) { return b.reg.Copier(ordinal) }

// inSomeContext runs fn with the context of a GPU this backend has set up current (for pinned memory, which
// every context reaches); errNoCopier when none is.
func (b *Backend) inSomeContext(fn func() error) error {
	c, ok := b.reg.AnyCopier()
	if !ok {
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

// Claims implements xgmi.Backend.
func (b *Backend) Claims(src, dst *engines.MemoryDesc) (bool, string) { return b.reg.Claims(src, dst) }

// Register implements xgmi.Backend: GPU memory is mapped into this process
// (imported from a VMM fd or IPC handle when it belongs to another process)
// and checked against the driver's view of its allocation; host memory is
// pinned when the driver allows, so kernels can address it.
func (b *Backend) Register(ctx context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	switch {
	case b.reg.Owns(&d):
		m, out, err := b.registerGPU(ctx, d)
		if err != nil {
			return d, err
		}
		b.reg.Put(d.ID, m)
		return out, nil
	case d.Location.Kind == engines.LocationHost && d.Handles.Host != nil:
		b.reg.PutHost(&d, b.drv.MemHostRegister, b.drv.MemHostUnregister)
	}
	return d, nil
}

func (b *Backend) registerGPU(ctx context.Context, d engines.MemoryDesc) (*mapped, engines.MemoryDesc, error) {
	ord, err := b.reg.Of(d.Location)
	if err != nil {
		return nil, d, err
	}
	c, err := b.copier(ord)
	if err != nil {
		return nil, d, err
	}
	m := &mapped{Ordinal: ord}
	err = b.reg.MapGPU(m, &d,
		func() error { return b.adoptPointer(m, &d) },
		func() error { return b.importVMM(ctx, c, m, &d) },
		func() error { return gpushare.OpenIPC(b.reg, b.drv, m, &d) })
	if err != nil {
		return nil, d, err
	}
	return m, d, nil
}

// adoptPointer checks that [Ptr, Ptr+Size) is device memory of this GPU inside
// one allocation (an overrun on a GPU is silent corruption), and exports the
// handles other processes need to reach it.
func (b *Backend) adoptPointer(m *mapped, d *engines.MemoryDesc) error {
	info, err := b.drv.PointerGetInfo(uint64(d.Handles.Ptr))
	if err != nil {
		return fmt.Errorf("pointer %#x is not GPU memory the driver knows: %w", d.Handles.Ptr, err)
	}
	if info.Type != cuda.MemoryTypeDevice || info.Ordinal != m.Ordinal {
		return fmt.Errorf("pointer %#x is memory type %d on device %d, not device memory of GPU %d", d.Handles.Ptr, info.Type, info.Ordinal, m.Ordinal)
	}
	start := uint64(d.Handles.Ptr)
	if start+d.Size < start || start+d.Size > info.RangeStart+info.RangeSize {
		return fmt.Errorf("region [%#x, +%d) runs past its allocation [%#x, +%d)", start, d.Size, info.RangeStart, info.RangeSize)
	}
	m.Addr = start
	types, err := b.drv.PointerHandleTypes(start)
	if err == nil && types&cuda.HandleTypePosixFD != 0 && d.Handles.VMM == nil {
		if h, base, size, err := b.drv.AllocationOf(cuda.DevicePtr(start)); err == nil {
			if fd, err := b.drv.ExportPosixFD(h); err == nil {
				f := gpushare.ExportedFD(fd, d.ID)
				d.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, Offset: start - uint64(base), AllocSize: size}
				m.Release = f.Close
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
	r, err := cuda.ImportRange(ctx, b.drv, fds, v.AllocSize, g, b.reg.Accessors(m.Ordinal))
	if err != nil {
		return err
	}
	m.Addr = uint64(r.Ptr) + v.Offset
	b.reg.ReleaseIn(m, func() error { return r.Release(b.drv) })
	return nil
}

// The agent's bound on a region's allocations and the one the driver wrapper enforces must agree: this
// constant does not compile when they differ.
const _ = uint(engines.MaxVMMAllocations-cuda.MaxRangeAllocations) + uint(cuda.MaxRangeAllocations-engines.MaxVMMAllocations)

func (b *Backend) withOrdinal(ord int, fn func() error) error { return b.reg.InOrdinal(ord, fn) }

// Release implements xgmi.Backend; a region the tcp engine still stages is released by its last handle.
func (b *Backend) Release(_ context.Context, d *engines.MemoryDesc) error { return b.reg.Release(d.ID) }

// Copy implements xgmi.Backend: every segment of the plan in one submission
// on the source GPU's stream (the destination's when the source is host
// memory); pushing over NVLink keeps the reads local.
func (b *Backend) Copy(ctx context.Context, w engines.Work) error {
	ms, md, ord, c, err := b.reg.CopierFor(w.Src.ID, w.Dst.ID)
	if err != nil {
		return err
	}
	buf := b.reg.Segments(engines.SegmentsOf(w.Plan), ms.Addr, md.Addr)
	defer b.reg.PutSegments(buf)
	segs := *buf
	route := RouteAuto
	if !kernelReaches(ms) || !kernelReaches(md) {
		route = RouteDriver
	}
	start := time.Now()
	p, err := c.SubmitRoute(segs, route)
	if err != nil {
		return err
	}
	if b.opts.Observe != nil {
		defer func() {
			if p.Done() && p.end.Err() == nil {
				b.opts.Observe(CopyStats{Ordinal: ord, Segments: len(segs), Bytes: w.Plan.Bytes, Mode: c.Mode(),
					Device: p.DeviceTime(), Host: time.Since(start), Queueing: p.queueing})
			}
		}()
	}
	return gpushare.WaitStopped(ctx, p)
}

// kernelReaches reports whether the copy kernels can address m: GPU memory and pinned host memory.
func kernelReaches(m *mapped) bool { return m.Ordinal >= 0 || m.Pinned }

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
	b.reg.Lock()
	for _, w := range works {
		ms, okS := b.reg.RegionLocked(w.Src.ID)
		md, okD := b.reg.RegionLocked(w.Dst.ID)
		if !okS || !okD {
			b.reg.Unlock()
			return xgmi.Started{}, b.reg.NotMapped()
		}
		if !kernelReaches(ms) || !kernelReaches(md) || w.Plan.Blocks == nil ||
			(list != nil && w.Plan.Blocks != list) {
			b.reg.Unlock()
			if err := checkLists(works); err != nil {
				return xgmi.Started{}, err
			}
			// Pageable host memory goes through the driver, segment by segment, when waited for.
			return xgmi.Started{Wait: func(ctx context.Context) error { return b.copyEach(ctx, works) }}, nil
		}
		list = w.Plan.Blocks
		ord := ms.Ordinal
		if ord < 0 {
			ord = md.Ordinal
		}
		g := groups[ord]
		if g == nil {
			g = &group{}
			groups[ord] = g
			order = append(order, ord)
		}
		g.pairs = append(g.pairs, scatter.BlockBases{Src: ms.Addr, Dst: md.Addr})
		g.bytes += w.Plan.Bytes
	}
	b.reg.Unlock()
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
			if e := gpushare.WaitStopped(ctx, p); e != nil && werr == nil {
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
			if err := p.end.Err(); err != nil && perr == nil {
				perr = err
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
	ms, md, ok := b.reg.Pair(src.ID, dst.ID)
	if !ok || !kernelReaches(ms) || !kernelReaches(md) || ms.Addr%16 != 0 || md.Addr%16 != 0 {
		return false
	}
	ord := ms.Ordinal
	if ord < 0 {
		ord = md.Ordinal
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

// Close releases every mapping and copier.
func (b *Backend) Close() error {
	idsErr := b.ids.close() // while a copier's context is still there to free them in
	return errors.Join(idsErr, b.reg.Close())
}
