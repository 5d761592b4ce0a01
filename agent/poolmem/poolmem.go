package poolmem

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// Kind is where pool memory lives.
type Kind int

const (
	// Host is host shared memory (memfd).
	Host Kind = 1
	// GPU is device memory (VMM allocations).
	GPU Kind = 2
)

// ErrExhausted is returned when no free range is large enough.
var ErrExhausted = errors.New("pool memory exhausted")

// Slice is one lent range of pool memory.
type Slice struct {
	ID   string
	Kind Kind
	// GPU is the device index of GPU memory (-1 for host memory).
	GPU int
	// File is the pool's descriptor (owned by the allocator: dup it before handing it out). The caller maps
	// [Offset, Offset+Length) of it.
	File   *os.File
	Offset uint64
	Length uint64
	// View is the agent's own mapping of the slice (host memory only).
	View []byte

	// GPU memory only: File is a VMM POSIX fd of the whole allocation (the caller imports it, maps all
	// AllocSize bytes and uses [Offset, Offset+Length) of the mapping). Ptr is the slice's device address in
	// the agent; BusID names the GPU.
	AllocSize uint64
	Ptr       uint64
	BusID     string
	// FabricExportable says whether the allocation holding the slice was created with the fabric handle type
	// and exported one; FabricReason says why not.
	FabricExportable bool
	FabricReason     string
}

// Allocator hands out and takes back slices. Safe for concurrent use.
type Allocator interface {
	Kind() Kind
	Allocate(size uint64) (*Slice, error)
	Free(id string) error
	// Usage returns the pool's total and free bytes.
	Usage() (total, free uint64)
	Close() error
}

// HostPool is host shared memory carved first-fit into page-aligned slices.
type HostPool struct {
	file    *os.File
	mapping []byte

	mu     sync.Mutex
	ranges *ranges
	nextID uint64
	closed bool
}

// NewHost creates a host pool of size bytes (rounded up to pages) backed by a memfd named name.
func NewHost(name string, size uint64) (*HostPool, error) {
	if size == 0 {
		return nil, errors.New("creating host pool memory: size must be positive")
	}
	page := uint64(os.Getpagesize())
	size = (size + page - 1) / page * page
	fd, err := memfdCreate(name)
	if err != nil {
		return nil, fmt.Errorf("creating host pool memory: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("creating host pool memory: sizing to %d bytes: %w", size, err)
	}
	m, err := syscall.Mmap(fd, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("creating host pool memory: mapping %d bytes: %w", size, err)
	}
	return &HostPool{file: f, mapping: m, ranges: newRanges(size, page)}, nil
}

// Kind implements Allocator.
func (p *HostPool) Kind() Kind { return Host }

// Allocate implements Allocator.
func (p *HostPool) Allocate(size uint64) (*Slice, error) {
	if size == 0 {
		return nil, errors.New("allocating pool memory: size must be positive")
	}
	if size > uint64(len(p.mapping)) {
		return nil, fmt.Errorf("allocating %d bytes of pool memory: %w (pool holds %d bytes)", size, ErrExhausted, len(p.mapping))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("allocating pool memory: pool closed")
	}
	id := fmt.Sprintf("host-%d", p.nextID+1)
	got, ok := p.ranges.take(id, size)
	if !ok {
		return nil, fmt.Errorf("allocating %d bytes of pool memory: %w (%d of %d bytes free, fragmented)", size, ErrExhausted, p.ranges.freeBytes(), p.ranges.size)
	}
	p.nextID++
	return &Slice{ID: id, Kind: Host, GPU: -1, File: p.file, Offset: got.off, Length: size,
		View: p.mapping[got.off : got.off+size : got.off+size]}, nil
}

// Free implements Allocator. The freed range is zeroed so the next caller never sees the previous one's bytes.
func (p *HostPool) Free(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.ranges.used[id]
	if !ok {
		return fmt.Errorf("freeing pool memory %q: not allocated", id)
	}
	clear(p.mapping[s.off : s.off+s.len])
	_, err := p.ranges.put(id)
	return err
}

// Usage implements Allocator.
func (p *HostPool) Usage() (total, free uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ranges.size, p.ranges.freeBytes()
}

// Close unmaps the pool. Callers' own mappings stay valid until they unmap them.
func (p *HostPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	err := syscall.Munmap(p.mapping)
	return errors.Join(err, p.file.Close())
}
