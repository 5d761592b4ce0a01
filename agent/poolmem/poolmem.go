// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Kind is where pool memory lives.
type Kind int

const (
	// Host is host shared memory (memfd).
	Host Kind = 1
	// GPU is device memory (VMM allocations).
	GPU Kind = 2
)

// ErrExhausted is returned when the pool has no room for a request.
var ErrExhausted = errors.New("pool memory exhausted")

// ErrTooLarge is returned for a request larger than the unit the pool lends from (a GPU pool's slab): it can
// never be served, however much memory is free.
var ErrTooLarge = errors.New("larger than a pool slab")

// Slice is one lent range of pool memory.
type Slice struct {
	ID   string
	Kind Kind
	// GPU is the device index of GPU memory (-1 for host memory).
	GPU int
	// File is the descriptor the caller is given (owned by the allocator: dup it before handing it out). It
	// reaches only memory lent to the slice's owner: the slice's own memfd for host memory, the slab holding
	// the slice for GPU memory. The caller maps [Offset, Offset+Length) of it.
	File   *os.File
	Offset uint64
	Length uint64
	// View is the agent's own mapping of the slice (host memory only).
	View []byte

	// GPU memory only: File is a VMM POSIX fd of the slab holding the slice (the caller imports it, maps all
	// AllocSize bytes and uses [Offset, Offset+Length) of the mapping). Ptr is the slice's device address in
	// the agent; BusID names the GPU.
	AllocSize uint64
	Ptr       uint64
	BusID     string
	// FabricExportable says whether the slab holding the slice was created with the fabric handle type and
	// exported one; FabricReason says why not.
	FabricExportable bool
	FabricReason     string
}

// Allocator hands out and takes back slices. Safe for concurrent use.
type Allocator interface {
	Kind() Kind
	// Allocate lends size bytes to owner (the caller's identity, e.g. "pod/<uid>"). Memory reachable through
	// a slice's File is only ever memory lent to the same owner.
	Allocate(owner string, size uint64) (*Slice, error)
	Free(id string) error
	// Usage returns the pool's total and free bytes.
	Usage() (total, free uint64)
	Close() error
}

// hostSlice is a lent host slice: its own memfd and the agent's mapping of it.
type hostSlice struct {
	file    *os.File
	mapping []byte
	charged uint64 // bytes counted against the budget (the slice in whole pages)
}

// HostPool is host shared memory lent one memfd per slice, so the descriptor a caller receives covers its
// slice and nothing else. The pool's size is a budget of lent bytes (in pages) checked at Allocate; memfd
// pages are committed when first touched, so an idle budget costs nothing.
type HostPool struct {
	name   string
	budget uint64
	page   uint64

	mu     sync.Mutex
	used   uint64
	slices map[string]*hostSlice
	nextID uint64
	closed bool
}

// NewHost creates a host pool lending at most size bytes (rounded up to pages) at a time; each slice's memfd is
// named after name.
func NewHost(name string, size uint64) (*HostPool, error) {
	if size == 0 {
		return nil, errors.New("creating host pool memory: size must be positive")
	}
	page := uint64(os.Getpagesize())
	if size > math.MaxInt64 {
		return nil, fmt.Errorf("creating host pool memory: %d bytes is more than a memfd can hold", size)
	}
	size = (size + page - 1) / page * page
	return &HostPool{name: name, budget: size, page: page, slices: map[string]*hostSlice{}}, nil
}

// Kind implements Allocator.
func (p *HostPool) Kind() Kind { return Host }

// Allocate implements Allocator. The slice is a fresh memfd of exactly size bytes (so it reads as zeros),
// sealed against resizing: a borrower that shrank it would make the agent's accesses to it fault.
func (p *HostPool) Allocate(owner string, size uint64) (*Slice, error) {
	if size == 0 {
		return nil, errors.New("allocating pool memory: size must be positive")
	}
	charged := (size + p.page - 1) / p.page * p.page
	if charged < size || charged > p.budget {
		return nil, fmt.Errorf("allocating %d bytes of pool memory: %w (pool holds %d bytes)", size, ErrExhausted, p.budget)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("allocating pool memory: pool closed")
	}
	if p.used+charged > p.budget {
		return nil, fmt.Errorf("allocating %d bytes of pool memory: %w (%d of %d bytes free)", size, ErrExhausted, p.budget-p.used, p.budget)
	}
	id := fmt.Sprintf("host-%d", p.nextID+1)
	hs, err := newHostSlice(p.name+"-"+id, size)
	if err != nil {
		return nil, fmt.Errorf("allocating %d bytes of pool memory: %w", size, err)
	}
	hs.charged = charged
	p.nextID++
	p.used += charged
	p.slices[id] = hs
	return &Slice{ID: id, Kind: Host, GPU: -1, File: hs.file, Offset: 0, Length: size,
		View: hs.mapping[:size:size]}, nil
}

func newHostSlice(name string, size uint64) (*hostSlice, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		return nil, errors.Join(fmt.Errorf("sizing the memfd to %d bytes: %w", size, err), f.Close())
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return nil, errors.Join(fmt.Errorf("sealing the memfd's size: %w", err), f.Close())
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("mapping %d bytes: %w", size, err), f.Close())
	}
	return &hostSlice{file: f, mapping: m}, nil
}

// Free implements Allocator. The slice's pages are released at once (a hole punched over the whole memfd),
// even while the borrower still maps it: a borrower that keeps its mapping after Release sees zeros, and any
// page it touches afterwards is its own, not the pool's.
func (p *HostPool) Free(id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	hs, ok := p.slices[id]
	if !ok {
		return fmt.Errorf("freeing pool memory %q: not allocated", id)
	}
	delete(p.slices, id)
	p.used -= hs.charged
	var errs []error
	if err := unix.Fallocate(int(hs.file.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(len(hs.mapping))); err != nil {
		errs = append(errs, fmt.Errorf("releasing the pages: %w", err))
	}
	if err := unix.Munmap(hs.mapping); err != nil {
		errs = append(errs, fmt.Errorf("unmapping: %w", err))
	}
	errs = append(errs, hs.file.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("freeing pool memory %q: %w", id, err)
	}
	return nil
}

// Usage implements Allocator: the budget and what is left of it.
func (p *HostPool) Usage() (total, free uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.budget, p.budget - p.used
}

// Close unmaps and closes every slice still lent. Callers' own mappings stay valid until they unmap them.
func (p *HostPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for id, hs := range p.slices {
		errs = append(errs, unix.Munmap(hs.mapping), hs.file.Close())
		delete(p.slices, id)
	}
	p.used = 0
	return errors.Join(errs...)
}
