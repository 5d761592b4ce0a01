// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// SliceAlign is the alignment of GPU pool slices: the GPU page size NICs register (GPUDirect RDMA pins 64 KiB
// pages), far below the VMM granularity (2 MiB) so many small KV caches fit.
const SliceAlign = 64 << 10

// ErrNoSuchGPU is returned for a GPU index the pool holds no memory on.
var ErrNoSuchGPU = errors.New("no pool memory on that GPU")

// GPUDriver is the part of the CUDA driver API the GPU pool uses; *cuda.Driver implements it.
type GPUDriver interface {
	DeviceCount() (int, error)
	DeviceGet(ordinal int) (cuda.Device, error)
	DevicePCIBusID(dev cuda.Device) (string, error)
	DeviceAttribute(dev cuda.Device, attr int) (int, error)
	CanAccessPeer(dev, peer cuda.Device) (bool, error)
	PrimaryContextRetain(dev cuda.Device) (cuda.Context, error)
	PrimaryContextRelease(dev cuda.Device) error
	WithContext(ctx cuda.Context, fn func() error) error
	StreamCreate() (cuda.Stream, error)
	StreamDestroy(s cuda.Stream) error
	StreamSynchronize(s cuda.Stream) error
	Granularity(dev cuda.Device, handleTypes int) (uint64, error)
	MemCreate(dev cuda.Device, size uint64, handleTypes int) (cuda.AllocHandle, error)
	MemRelease(h cuda.AllocHandle) error
	MapHandle(h cuda.AllocHandle, size, align uint64, devs []cuda.Device) (cuda.DevicePtr, error)
	UnmapRange(ptr cuda.DevicePtr, size uint64) error
	ExportPosixFD(h cuda.AllocHandle) (int, error)
	ExportFabric(h cuda.AllocHandle) (cuda.FabricHandle, error)
	MemsetD8Async(p cuda.DevicePtr, v byte, n uint64, s cuda.Stream) error
}

// GPUTarget is one GPU the pool allocates on: the agent's index for it and its PCI address (matched against
// the driver's devices; empty uses the index as the CUDA ordinal).
type GPUTarget struct {
	Index int
	BusID string
}

// DefaultSlabsPerGPU is how many slabs a GPU's pool memory is split into when no slab size is given.
const DefaultSlabsPerGPU = 8

// MaxSlabsPerGPU bounds the slabs of one GPU: each is a VMM allocation, a mapping and an open fd in the agent.
const MaxSlabsPerGPU = 1024

// GPUOptions size a GPU pool.
type GPUOptions struct {
	// PerGPU is the device memory allocated on each GPU (rounded up to the VMM granularity).
	PerGPU uint64
	// SlabBytes is the size of one slab, the unit lent to one caller at a time (rounded up to the VMM
	// granularity, at most PerGPU). 0 splits PerGPU into DefaultSlabsPerGPU slabs.
	SlabBytes uint64
}

// DeviceUsage is one GPU's pool memory, as GetInfo and the agent's log show it.
type DeviceUsage struct {
	Index int
	BusID string
	// Total is every slab's bytes; Free the bytes not lent. Free bytes inside a slab a caller holds are
	// lendable to that caller only; FreeSlabs are lendable to anyone.
	Total, Free      uint64
	SlabBytes        uint64
	Slabs, FreeSlabs int
	FabricExportable bool
	// FabricReason says why the memory is not fabric-exportable (empty when it is).
	FabricReason string
}

// gpuMemory is the pool's memory on one GPU: its slabs, created once, with the handle types the driver allowed.
type gpuMemory struct {
	index     int
	busID     string
	dev       cuda.Device
	ctx       cuda.Context
	stream    cuda.Stream // zeroing runs here, so it waits for nothing else on the GPU
	types     int
	size      uint64
	slabBytes uint64
	gran      uint64 // VMM granularity: slabs are mapped with this alignment
	slabs     []*slab
	fabric    bool
	reason    string
}

// slab is one VMM allocation of a GPU's pool memory, mapped in the agent and exported as a POSIX fd. It is
// lent to one owner at a time: every slice carved from it belongs to that owner, so the fd a borrower gets
// reaches its own slices only. It is free again when its last slice is freed.
type slab struct {
	gpu    *gpuMemory
	handle cuda.AllocHandle
	ptr    cuda.DevicePtr
	size   uint64
	file   *os.File
	owner  string // "" while free
	ranges *ranges
}

// GPUPool is device memory: per GPU, slabs of VMM memory created with the POSIX fd handle type and, where the
// driver allows, the fabric handle type. Slices are carved first-fit, [SliceAlign]-aligned, from slabs their
// owner already holds, else from a free slab.
type GPUPool struct {
	drv  GPUDriver
	gpus []*gpuMemory

	mu     sync.Mutex
	slices map[string]*slab
	nextID uint64
	closed bool
}

// NewGPU allocates perGPU bytes on each target GPU with the default slab size; see [NewGPUWithOptions].
func NewGPU(drv GPUDriver, targets []GPUTarget, perGPU uint64) (*GPUPool, error) {
	return NewGPUWithOptions(drv, targets, GPUOptions{PerGPU: perGPU})
}

// NewGPUWithOptions allocates o.PerGPU bytes (rounded up to the VMM granularity) on each target GPU as slabs,
// maps them in this process and zeroes them. A driver that refuses the fabric handle type (no IMEX channel,
// older GPUs) gets POSIX-fd-only slabs, and the reason is kept ([GPUPool.Devices]). Any other failure undoes
// what was made.
func NewGPUWithOptions(drv GPUDriver, targets []GPUTarget, o GPUOptions) (*GPUPool, error) {
	if o.PerGPU == 0 {
		return nil, errors.New("creating GPU pool memory: size per GPU must be positive")
	}
	if len(targets) == 0 {
		return nil, errors.New("creating GPU pool memory: no GPUs")
	}
	p := &GPUPool{drv: drv, slices: map[string]*slab{}}
	for _, t := range targets {
		m, err := p.create(t, o)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("creating %d bytes of pool memory on GPU %d (%s): %w", o.PerGPU, t.Index, t.BusID, err), p.Close())
		}
		p.gpus = append(p.gpus, m)
	}
	return p, nil
}

// slabSizes splits total bytes (a multiple of g) into slabs of the requested size (0: total/DefaultSlabsPerGPU),
// rounded up to g, at least g and at most total; the last slab holds the remainder.
func slabSizes(total, g, requested uint64) ([]uint64, error) {
	slab := requested
	if slab == 0 {
		slab = total / DefaultSlabsPerGPU
	}
	slab = cuda.RoundUp(slab, g)
	slab = min(max(slab, g), total)
	n := (total + slab - 1) / slab
	if n > MaxSlabsPerGPU {
		return nil, fmt.Errorf("a slab size of %d bytes (--pool-slab-bytes) splits %d bytes into %d slabs, more than %d", slab, total, n, MaxSlabsPerGPU)
	}
	sizes := make([]uint64, n)
	for i := range sizes {
		sizes[i] = slab
	}
	sizes[n-1] = total - (n-1)*slab
	return sizes, nil
}

// ordinal finds the CUDA device of a target by PCI address (the agent's GPU indexes and CUDA's ordinals differ
// when CUDA_VISIBLE_DEVICES or AMD GPUs are involved).
func (p *GPUPool) ordinal(t GPUTarget) (cuda.Device, error) {
	if t.BusID == "" {
		return p.drv.DeviceGet(t.Index)
	}
	n, err := p.drv.DeviceCount()
	if err != nil {
		return 0, err
	}
	for i := range n {
		dev, err := p.drv.DeviceGet(i)
		if err != nil {
			return 0, err
		}
		if bus, err := p.drv.DevicePCIBusID(dev); err == nil && strings.EqualFold(bus, t.BusID) {
			return dev, nil
		}
	}
	return 0, fmt.Errorf("no CUDA device at PCI address %s (%d devices visible)", t.BusID, n)
}

// fabricRefused reports whether the driver said no to the fabric handle type itself, as opposed to failing.
func fabricRefused(err error) bool {
	return cuda.IsResult(err, cuda.ErrNotPermitted) || cuda.IsResult(err, cuda.ErrNotSupported) || cuda.IsResult(err, cuda.ErrInvalidValue)
}

func (p *GPUPool) create(t GPUTarget, o GPUOptions) (*gpuMemory, error) {
	dev, err := p.ordinal(t)
	if err != nil {
		return nil, err
	}
	ctx, err := p.drv.PrimaryContextRetain(dev)
	if err != nil {
		return nil, err
	}
	m := &gpuMemory{index: t.Index, busID: t.BusID, dev: dev, ctx: ctx}
	err = p.drv.WithContext(ctx, func() error {
		var err error
		if m.stream, err = p.drv.StreamCreate(); err != nil {
			return err
		}
		err = p.fill(m, o)
		if err != nil {
			err = errors.Join(err, p.drv.StreamDestroy(m.stream))
		}
		return err
	})
	if err != nil {
		return nil, errors.Join(err, p.drv.PrimaryContextRelease(dev))
	}
	return m, nil
}

// fill settles m's handle types and granularity and creates its slabs; m's context is current.
func (p *GPUPool) fill(m *gpuMemory, o GPUOptions) error {
	dev := m.dev
	m.types = cuda.HandleTypePosixFD | cuda.HandleTypeFabric
	if ok, err := p.drv.DeviceAttribute(dev, cuda.AttrHandleTypeFabricSupported); err != nil || ok == 0 {
		m.types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the GPU does not offer fabric handles (HANDLE_TYPE_FABRIC_SUPPORTED %d, %v)", ok, err)
	}
	g, err := p.drv.Granularity(dev, m.types)
	if err != nil && m.types&cuda.HandleTypeFabric != 0 && fabricRefused(err) {
		m.types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the driver refused the fabric handle type: %v", err)
		g, err = p.drv.Granularity(dev, m.types)
	}
	if err != nil {
		return err
	}
	if g == 0 {
		g = SliceAlign
	}
	if o.PerGPU > math.MaxUint64-g {
		return fmt.Errorf("%d bytes per GPU cannot be rounded to the granularity %d", o.PerGPU, g)
	}
	m.gran = g
	m.size = cuda.RoundUp(o.PerGPU, g)
	sizes, err := slabSizes(m.size, g, o.SlabBytes)
	if err != nil {
		return err
	}
	m.slabBytes = sizes[0]
	for i, size := range sizes {
		s, err := p.newSlab(m, size, g)
		if err != nil {
			for _, s := range m.slabs {
				err = errors.Join(err, p.release(s))
			}
			m.slabs = nil
			return fmt.Errorf("slab %d of %d (%d bytes): %w", i+1, len(sizes), size, err)
		}
		m.slabs = append(m.slabs, s)
	}
	m.fabric = m.types&cuda.HandleTypeFabric != 0 && m.reason == ""
	return nil
}

// newSlab creates, maps, exports and zeroes one slab of m. The first refusal of the fabric handle type turns
// it off for the GPU's remaining slabs. m's context is current.
func (p *GPUPool) newSlab(m *gpuMemory, size, g uint64) (*slab, error) {
	h, err := p.drv.MemCreate(m.dev, size, m.types)
	if err != nil && m.types&cuda.HandleTypeFabric != 0 && fabricRefused(err) {
		// Without an IMEX channel the driver refuses fabric allocations (CUDA_ERROR_NOT_PERMITTED): the pool
		// still serves this node's callers through POSIX fds.
		m.types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the driver refused the fabric handle type: %v (an IMEX channel is needed)", err)
		h, err = p.drv.MemCreate(m.dev, size, m.types)
	}
	if err != nil {
		return nil, err
	}
	if m.types&cuda.HandleTypeFabric != 0 {
		if _, err := p.drv.ExportFabric(h); err != nil && m.reason == "" {
			m.reason = fmt.Sprintf("created with the fabric handle type, but exporting one failed: %v", err)
		}
	}
	ptr, err := p.drv.MapHandle(h, size, g, p.accessors(m.dev))
	if err != nil {
		return nil, errors.Join(err, p.drv.MemRelease(h))
	}
	fd, err := p.drv.ExportPosixFD(h)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("exporting a POSIX fd: %w", err), p.drv.UnmapRange(ptr, size), p.drv.MemRelease(h))
	}
	s := &slab{gpu: m, handle: h, ptr: ptr, size: size, ranges: newRanges(size, SliceAlign),
		file: os.NewFile(uintptr(fd), fmt.Sprintf("gpu-pool-%d-%d", m.index, len(m.slabs)))}
	// Fresh device memory may hold a previous process's bytes.
	if err := p.zero(m, ptr, size); err != nil {
		return nil, errors.Join(err, p.release(s))
	}
	return s, nil
}

// release closes, unmaps and releases a slab. Its GPU's context is current.
func (p *GPUPool) release(s *slab) error {
	return errors.Join(s.file.Close(), p.drv.UnmapRange(s.ptr, s.size), p.drv.MemRelease(s.handle))
}

// accessors are dev and every GPU that can reach it as a peer: the agent's copies may run on either side.
func (p *GPUPool) accessors(dev cuda.Device) []cuda.Device {
	devs := []cuda.Device{dev}
	n, err := p.drv.DeviceCount()
	if err != nil {
		return devs
	}
	for i := range n {
		d, err := p.drv.DeviceGet(i)
		if err != nil || d == dev {
			continue
		}
		if ok, err := p.drv.CanAccessPeer(d, dev); err == nil && ok {
			devs = append(devs, d)
		}
	}
	return devs
}

// zero clears device memory of m and waits for it: the next borrower must never see the previous one's bytes.
// It waits on m's own stream, not the whole context, so a Free does not wait for the engines' copies.
func (p *GPUPool) zero(m *gpuMemory, ptr cuda.DevicePtr, n uint64) error {
	if err := p.drv.MemsetD8Async(ptr, 0, n, m.stream); err != nil {
		return fmt.Errorf("zeroing pool memory: %w", err)
	}
	if err := p.drv.StreamSynchronize(m.stream); err != nil {
		return fmt.Errorf("zeroing pool memory: %w", err)
	}
	return nil
}

// Kind implements Allocator.
func (p *GPUPool) Kind() Kind { return GPU }

// room is what m can still lend owner: its free slabs and the free bytes of the slabs owner holds.
func (m *gpuMemory) room(owner string) (n uint64) {
	for _, s := range m.slabs {
		if s.owner == "" || s.owner == owner {
			n += s.ranges.freeBytes()
		}
	}
	return n
}

// Allocate implements Allocator: a slice on the GPU with the most room for owner.
func (p *GPUPool) Allocate(owner string, size uint64) (*Slice, error) {
	p.mu.Lock()
	order := slices.Clone(p.gpus)
	slices.SortStableFunc(order, func(a, b *gpuMemory) int { return cmp.Compare(b.room(owner), a.room(owner)) })
	p.mu.Unlock()
	var first error
	for _, m := range order {
		s, err := p.AllocateOn(owner, m.index, size)
		if err == nil {
			return s, nil
		}
		if first == nil {
			first = err
		}
		if !errors.Is(err, ErrExhausted) {
			break
		}
	}
	return nil, first
}

// AllocateOn lends size bytes of GPU gpu's pool memory (the agent's GPU index) to owner, from a slab owner
// already holds or else from a free slab, which becomes owner's until its last slice is freed.
func (p *GPUPool) AllocateOn(owner string, gpu int, size uint64) (*Slice, error) {
	if size == 0 {
		return nil, errors.New("allocating GPU pool memory: size must be positive")
	}
	if owner == "" {
		return nil, errors.New("allocating GPU pool memory: the owner is required")
	}
	var m *gpuMemory
	for _, g := range p.gpus {
		if g.index == gpu {
			m = g
		}
	}
	if m == nil {
		return nil, fmt.Errorf("allocating %d bytes on GPU %d: %w (pool memory is on GPUs %v)", size, gpu, ErrNoSuchGPU, p.indexes())
	}
	if size > m.slabBytes {
		return nil, fmt.Errorf("allocating %d bytes on GPU %d: %w: a slab holds %d bytes (agent flag --pool-slab-bytes)", size, gpu, ErrTooLarge, m.slabBytes)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("allocating GPU pool memory: pool closed")
	}
	id := fmt.Sprintf("gpu%d-%d", gpu, p.nextID+1)
	held, lent := 0, 0
	var got span
	var in *slab
	for _, s := range m.slabs {
		if s.owner != owner {
			continue
		}
		held++
		if sp, ok := s.ranges.take(id, size); ok {
			got, in = sp, s
			break
		}
	}
	if in == nil {
		for _, s := range m.slabs {
			if s.owner != "" {
				lent++
				continue
			}
			if sp, ok := s.ranges.take(id, size); ok {
				got, in = sp, s
				s.owner = owner
				break
			}
		}
	}
	if in == nil {
		return nil, fmt.Errorf("allocating %d bytes on GPU %d for %s: %w (the %d slabs it holds have no room for it; %d of %d slabs of %d bytes are lent)",
			size, gpu, owner, ErrExhausted, held, lent, len(m.slabs), m.slabBytes)
	}
	p.nextID++
	p.slices[id] = in
	return &Slice{ID: id, Kind: GPU, GPU: gpu, File: in.file, Offset: got.off, Length: size, AllocSize: in.size,
		Ptr: uint64(in.ptr) + got.off, BusID: m.busID, FabricExportable: m.fabric, FabricReason: m.reason}, nil
}

func (p *GPUPool) indexes() []int {
	out := make([]int, len(p.gpus))
	for i, m := range p.gpus {
		out[i] = m.index
	}
	return out
}

// Free implements Allocator. The range is zeroed before it is lent again; a range that could not be zeroed
// stays out of the pool, and so its slab stays with its owner. A slab whose last slice is freed is free
// again, all zero, for any owner.
func (p *GPUPool) Free(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.slices[id]
	if !ok {
		return fmt.Errorf("freeing pool memory %q: not allocated", id)
	}
	sp := s.ranges.used[id]
	delete(p.slices, id)
	if err := p.drv.WithContext(s.gpu.ctx, func() error { return p.zero(s.gpu, s.ptr+cuda.DevicePtr(sp.off), sp.len) }); err != nil {
		s.ranges.used["quarantined-"+id] = sp
		delete(s.ranges.used, id)
		return fmt.Errorf("freeing pool memory %q: %w (the range is kept out of the pool)", id, err)
	}
	if _, err := s.ranges.put(id); err != nil {
		return err
	}
	if len(s.ranges.used) == 0 {
		// The previous owner mapped the whole slab and may keep its mapping (or a copy of the fd) after
		// Release: the next owner gets new physical memory, and the old allocation goes with the old owner.
		if err := p.renew(s); err != nil {
			return fmt.Errorf("freeing pool memory %q: the slab could not be replaced for another owner, so it stays with %s: %w", id, s.owner, err)
		}
		s.owner = ""
	}
	return nil
}

// renew replaces s's allocation with a fresh one (created, mapped, exported and zeroed) and releases the old.
// p.mu is held.
func (p *GPUPool) renew(s *slab) error {
	m := s.gpu
	return p.drv.WithContext(m.ctx, func() error {
		fresh, err := p.newSlab(m, s.size, m.gran)
		if err != nil {
			return err
		}
		old := *s
		s.handle, s.ptr, s.file, s.ranges = fresh.handle, fresh.ptr, fresh.file, fresh.ranges
		return p.release(&old)
	})
}

// Usage implements Allocator: all GPUs together.
func (p *GPUPool) Usage() (total, free uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.gpus {
		for _, s := range m.slabs {
			total += s.size
			free += s.ranges.freeBytes()
		}
	}
	return total, free
}

// Devices reports each GPU's pool memory and whether it is fabric-exportable.
func (p *GPUPool) Devices() []DeviceUsage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]DeviceUsage, 0, len(p.gpus))
	for _, m := range p.gpus {
		d := DeviceUsage{Index: m.index, BusID: m.busID, SlabBytes: m.slabBytes, Slabs: len(m.slabs),
			FabricExportable: m.fabric, FabricReason: m.reason}
		for _, s := range m.slabs {
			d.Total += s.size
			d.Free += s.ranges.freeBytes()
			if s.owner == "" {
				d.FreeSlabs++
			}
		}
		out = append(out, d)
	}
	return out
}

// Close unmaps and releases the pool's slabs. Memory callers imported stays alive until they release it (the
// driver counts references).
func (p *GPUPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, m := range p.gpus {
		errs = append(errs, p.drv.WithContext(m.ctx, func() error {
			var errs []error
			for _, s := range m.slabs {
				errs = append(errs, p.release(s))
			}
			errs = append(errs, p.drv.StreamDestroy(m.stream))
			return errors.Join(errs...)
		}))
		errs = append(errs, p.drv.PrimaryContextRelease(m.dev))
	}
	return errors.Join(errs...)
}

// Compile-time check: the real driver is a GPUDriver.
var _ GPUDriver = (*cuda.Driver)(nil)
