package poolmem

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines/cuda"
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
	CtxSynchronize() error
	Granularity(dev cuda.Device, handleTypes int) (uint64, error)
	MemCreate(dev cuda.Device, size uint64, handleTypes int) (cuda.AllocHandle, error)
	MemRelease(h cuda.AllocHandle) error
	MapHandle(h cuda.AllocHandle, size, align uint64, devs []cuda.Device) (cuda.DevicePtr, error)
	UnmapRange(ptr cuda.DevicePtr, size uint64) error
	ExportPosixFD(h cuda.AllocHandle) (int, error)
	ExportFabric(h cuda.AllocHandle) (cuda.FabricHandle, error)
	MemsetD8(p cuda.DevicePtr, v byte, n uint64) error
}

// GPUTarget is one GPU the pool allocates on: the agent's index for it and its PCI address (matched against
// the driver's devices; empty uses the index as the CUDA ordinal).
type GPUTarget struct {
	Index int
	BusID string
}

// DeviceUsage is one GPU's pool memory, as GetInfo and the agent's log show it.
type DeviceUsage struct {
	Index            int
	BusID            string
	Total, Free      uint64
	FabricExportable bool
	// FabricReason says why the memory is not fabric-exportable (empty when it is).
	FabricReason string
}

// gpuMemory is the pool's allocation on one GPU: created once, mapped in the agent, exported as a POSIX fd.
type gpuMemory struct {
	index  int
	busID  string
	dev    cuda.Device
	ctx    cuda.Context
	handle cuda.AllocHandle
	ptr    cuda.DevicePtr
	size   uint64
	file   *os.File
	fabric bool
	reason string
	ranges *ranges
}

// GPUPool is device memory: one VMM allocation per GPU, created with the POSIX fd handle type and, where the
// driver allows, the fabric handle type, carved first-fit into [SliceAlign]-aligned slices.
type GPUPool struct {
	drv  GPUDriver
	gpus []*gpuMemory

	mu     sync.Mutex
	owner  map[string]*gpuMemory
	nextID uint64
	closed bool
}

// NewGPU allocates perGPU bytes (rounded up to the VMM granularity) on each target GPU, maps it in this process
// and zeroes it. A driver that refuses the fabric handle type (no IMEX channel, older GPUs) gets a POSIX-fd-only
// allocation, and the reason is kept ([GPUPool.Devices]). Any other failure undoes what was made.
func NewGPU(drv GPUDriver, targets []GPUTarget, perGPU uint64) (*GPUPool, error) {
	if perGPU == 0 {
		return nil, errors.New("creating GPU pool memory: size per GPU must be positive")
	}
	if len(targets) == 0 {
		return nil, errors.New("creating GPU pool memory: no GPUs")
	}
	p := &GPUPool{drv: drv, owner: map[string]*gpuMemory{}}
	for _, t := range targets {
		m, err := p.create(t, perGPU)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("creating %d bytes of pool memory on GPU %d (%s): %w", perGPU, t.Index, t.BusID, err), p.Close())
		}
		p.gpus = append(p.gpus, m)
	}
	return p, nil
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

func (p *GPUPool) create(t GPUTarget, perGPU uint64) (*gpuMemory, error) {
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
		types := cuda.HandleTypePosixFD | cuda.HandleTypeFabric
		if ok, err := p.drv.DeviceAttribute(dev, cuda.AttrHandleTypeFabricSupported); err != nil || ok == 0 {
			types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the GPU does not offer fabric handles (HANDLE_TYPE_FABRIC_SUPPORTED %d, %v)", ok, err)
		}
		g, err := p.drv.Granularity(dev, types)
		if err != nil && types&cuda.HandleTypeFabric != 0 && fabricRefused(err) {
			types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the driver refused the fabric handle type: %v", err)
			g, err = p.drv.Granularity(dev, types)
		}
		if err != nil {
			return err
		}
		size := cuda.RoundUp(perGPU, g)
		h, err := p.drv.MemCreate(dev, size, types)
		if err != nil && types&cuda.HandleTypeFabric != 0 && fabricRefused(err) {
			// Without an IMEX channel the driver refuses fabric allocations (CUDA_ERROR_NOT_PERMITTED): the pool
			// still serves this node's callers through POSIX fds.
			types, m.reason = cuda.HandleTypePosixFD, fmt.Sprintf("the driver refused the fabric handle type: %v (an IMEX channel is needed)", err)
			h, err = p.drv.MemCreate(dev, size, types)
		}
		if err != nil {
			return err
		}
		m.handle, m.size = h, size
		if types&cuda.HandleTypeFabric != 0 {
			if _, err := p.drv.ExportFabric(h); err != nil {
				m.reason = fmt.Sprintf("created with the fabric handle type, but exporting one failed: %v", err)
			} else {
				m.fabric = true
			}
		}
		ptr, err := p.drv.MapHandle(h, size, g, p.accessors(dev))
		if err != nil {
			return errors.Join(err, p.drv.MemRelease(h))
		}
		m.ptr = ptr
		fd, err := p.drv.ExportPosixFD(h)
		if err != nil {
			return errors.Join(fmt.Errorf("exporting a POSIX fd: %w", err), p.drv.UnmapRange(ptr, size), p.drv.MemRelease(h))
		}
		m.file = os.NewFile(uintptr(fd), fmt.Sprintf("gpu-pool-%d", t.Index))
		// Fresh device memory may hold a previous process's bytes.
		if err := p.zero(ptr, size); err != nil {
			return errors.Join(err, m.file.Close(), p.drv.UnmapRange(ptr, size), p.drv.MemRelease(h))
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(err, p.drv.PrimaryContextRelease(dev))
	}
	m.ranges = newRanges(m.size, SliceAlign)
	return m, nil
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

// zero clears device memory and waits for it: the next borrower must never see the previous one's bytes.
func (p *GPUPool) zero(ptr cuda.DevicePtr, n uint64) error {
	if err := p.drv.MemsetD8(ptr, 0, n); err != nil {
		return fmt.Errorf("zeroing pool memory: %w", err)
	}
	if err := p.drv.CtxSynchronize(); err != nil {
		return fmt.Errorf("zeroing pool memory: %w", err)
	}
	return nil
}

// Kind implements Allocator.
func (p *GPUPool) Kind() Kind { return GPU }

// Allocate implements Allocator: a slice on the GPU with the most free bytes.
func (p *GPUPool) Allocate(size uint64) (*Slice, error) {
	p.mu.Lock()
	best := -1
	var most uint64
	for _, m := range p.gpus {
		if f := m.ranges.freeBytes(); best < 0 || f > most {
			best, most = m.index, f
		}
	}
	p.mu.Unlock()
	return p.AllocateOn(best, size)
}

// AllocateOn lends size bytes of GPU gpu's pool memory (the agent's GPU index).
func (p *GPUPool) AllocateOn(gpu int, size uint64) (*Slice, error) {
	if size == 0 {
		return nil, errors.New("allocating GPU pool memory: size must be positive")
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
	if size > m.size {
		return nil, fmt.Errorf("allocating %d bytes on GPU %d: %w (the GPU's pool holds %d bytes)", size, gpu, ErrExhausted, m.size)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("allocating GPU pool memory: pool closed")
	}
	id := fmt.Sprintf("gpu%d-%d", gpu, p.nextID+1)
	got, ok := m.ranges.take(id, size)
	if !ok {
		return nil, fmt.Errorf("allocating %d bytes on GPU %d: %w (%d of %d bytes free, fragmented)", size, gpu, ErrExhausted, m.ranges.freeBytes(), m.size)
	}
	p.nextID++
	p.owner[id] = m
	return &Slice{ID: id, Kind: GPU, GPU: gpu, File: m.file, Offset: got.off, Length: size, AllocSize: m.size,
		Ptr: uint64(m.ptr) + got.off, BusID: m.busID, FabricExportable: m.fabric, FabricReason: m.reason}, nil
}

func (p *GPUPool) indexes() []int {
	out := make([]int, len(p.gpus))
	for i, m := range p.gpus {
		out[i] = m.index
	}
	return out
}

// Free implements Allocator. The range is zeroed before it is lent again; a range that could not be zeroed
// stays out of the pool.
func (p *GPUPool) Free(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.owner[id]
	if !ok {
		return fmt.Errorf("freeing pool memory %q: not allocated", id)
	}
	s := m.ranges.used[id]
	if err := p.drv.WithContext(m.ctx, func() error { return p.zero(m.ptr+cuda.DevicePtr(s.off), s.len) }); err != nil {
		delete(p.owner, id)
		m.ranges.used["quarantined-"+id] = s
		delete(m.ranges.used, id)
		return fmt.Errorf("freeing pool memory %q: %w (the range is kept out of the pool)", id, err)
	}
	delete(p.owner, id)
	_, err := m.ranges.put(id)
	return err
}

// Usage implements Allocator: all GPUs together.
func (p *GPUPool) Usage() (total, free uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.gpus {
		total += m.size
		free += m.ranges.freeBytes()
	}
	return total, free
}

// Devices reports each GPU's pool memory and whether it is fabric-exportable.
func (p *GPUPool) Devices() []DeviceUsage {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]DeviceUsage, 0, len(p.gpus))
	for _, m := range p.gpus {
		out = append(out, DeviceUsage{Index: m.index, BusID: m.busID, Total: m.size, Free: m.ranges.freeBytes(),
			FabricExportable: m.fabric, FabricReason: m.reason})
	}
	return out
}

// Close unmaps and releases the pool's allocations. Memory callers imported stays alive until they release it
// (the driver counts references).
func (p *GPUPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for _, m := range p.gpus {
		errs = append(errs, m.file.Close())
		errs = append(errs, p.drv.WithContext(m.ctx, func() error {
			return errors.Join(p.drv.UnmapRange(m.ptr, m.size), p.drv.MemRelease(m.handle))
		}))
		errs = append(errs, p.drv.PrimaryContextRelease(m.dev))
	}
	return errors.Join(errs...)
}

// Compile-time check: the real driver is a GPUDriver.
var _ GPUDriver = (*cuda.Driver)(nil)
