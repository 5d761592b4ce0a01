// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// RangeMapper is the part of the driver that maps VMM allocations another process exported; *Driver
// implements it. Tests stand a fake in for the hardware here.
type RangeMapper interface {
	ImportPosixFD(fd int) (AllocHandle, error)
	MemRelease(h AllocHandle) error
	MemAddressReserve(size, align uint64) (DevicePtr, error)
	MemAddressFree(ptr DevicePtr, size uint64) error
	MemMap(ptr DevicePtr, size uint64, h AllocHandle) error
	MemUnmap(ptr DevicePtr, size uint64) error
	MemSetAccess(ptr DevicePtr, size uint64, devs []Device) error
}

// MaxRangeAllocations bounds the allocations ImportRange maps into one range (engines.MaxVMMAllocations, which
// this package cannot import).
const MaxRangeAllocations = 8192

// ImportedRange is VMM allocations of another process imported and mapped back to back in one reserved
// address range, as the owner mapped them (PyTorch's expandable segments): one device pointer for all.
type ImportedRange struct {
	Ptr       DevicePtr
	AllocSize uint64
	// Handles are the imported allocations, Handles[i] mapped at Ptr + i*AllocSize.
	Handles []AllocHandle
}

// Size is the bytes the range covers.
func (r *ImportedRange) Size() uint64 { return uint64(len(r.Handles)) * r.AllocSize }

// ImportRange imports the allocations exported as fds (in address order, allocSize bytes each), reserves one
// range of len(fds)*allocSize bytes aligned to align, maps allocation i at i*allocSize and grants devs
// read-write access to the whole range in one call. allocSize must be a positive multiple of align (the
// granularity) and len(fds) at most MaxRangeAllocations. On any failure, or when ctx ends part-way, everything
// done so far is undone (mappings unmapped, the reservation freed, imported handles released) and the error
// says which step failed. The fds stay the caller's.
func ImportRange(ctx context.Context, m RangeMapper, fds []int, allocSize, align uint64, devs []Device) (*ImportedRange, error) {
	n := uint64(len(fds))
	switch {
	case n == 0:
		return nil, errors.New("importing a VMM range: no allocations")
	case n > MaxRangeAllocations:
		return nil, fmt.Errorf("importing a VMM range: %d allocations, at most %d", n, MaxRangeAllocations)
	case align == 0 || allocSize == 0 || allocSize%align != 0:
		return nil, fmt.Errorf("importing a VMM range: allocation size %d is not a positive multiple of the granularity %d", allocSize, align)
	case allocSize > math.MaxUint64/n:
		return nil, fmt.Errorf("importing a VMM range: %d allocations of %d bytes overflow", n, allocSize)
	}
	r := &ImportedRange{AllocSize: allocSize, Handles: make([]AllocHandle, 0, n)}
	mapped := 0
	reserved := false
	fail := func(err error) (*ImportedRange, error) {
		return nil, errors.Join(err, r.undo(m, mapped, reserved))
	}
	for i, fd := range fds {
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("importing VMM allocation %d of %d: %w", i, n, err))
		}
		h, err := m.ImportPosixFD(fd)
		if err != nil {
			return fail(fmt.Errorf("importing VMM allocation %d of %d: %w", i, n, err))
		}
		r.Handles = append(r.Handles, h)
	}
	ptr, err := m.MemAddressReserve(n*allocSize, align)
	if err != nil {
		return fail(fmt.Errorf("reserving %d bytes for %d VMM allocations: %w", n*allocSize, n, err))
	}
	r.Ptr, reserved = ptr, true
	for i, h := range r.Handles {
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("mapping VMM allocation %d of %d: %w", i, n, err))
		}
		if err := m.MemMap(r.at(i), allocSize, h); err != nil {
			return fail(fmt.Errorf("mapping VMM allocation %d of %d at offset %d: %w", i, n, uint64(i)*allocSize, err))
		}
		mapped++
	}
	if len(devs) > 0 {
		if err := m.MemSetAccess(r.Ptr, r.Size(), devs); err != nil {
			return fail(fmt.Errorf("granting %d GPUs access to %d VMM allocations: %w", len(devs), n, err))
		}
	}
	return r, nil
}

func (r *ImportedRange) at(i int) DevicePtr { return r.Ptr + DevicePtr(uint64(i)*r.AllocSize) }

// Release unmaps every allocation (each as it was mapped: the driver unmaps whole mappings only), frees the
// reservation and releases the imported handles. It goes on past errors so nothing it can free stays behind,
// and returns them all.
func (r *ImportedRange) Release(m RangeMapper) error {
	return r.undo(m, len(r.Handles), true)
}

// undo unmaps the first mapped allocations, frees the reservation when made and releases every handle.
func (r *ImportedRange) undo(m RangeMapper, mapped int, reserved bool) error {
	var errs []error
	for i := mapped - 1; i >= 0; i-- {
		if err := m.MemUnmap(r.at(i), r.AllocSize); err != nil {
			errs = append(errs, fmt.Errorf("unmapping VMM allocation %d: %w", i, err))
		}
	}
	if reserved {
		if err := m.MemAddressFree(r.Ptr, r.Size()); err != nil {
			errs = append(errs, fmt.Errorf("freeing the range of %d VMM allocations: %w", len(r.Handles), err))
		}
	}
	for i := len(r.Handles) - 1; i >= 0; i-- {
		if err := m.MemRelease(r.Handles[i]); err != nil {
			errs = append(errs, fmt.Errorf("releasing VMM allocation %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// MemAddressReserve reserves size bytes of device virtual address space aligned to align.
func (d *Driver) MemAddressReserve(size, align uint64) (DevicePtr, error) {
	var ptr DevicePtr
	err := d.call("cuMemAddressReserve", d.f.memAddressReserve, uintptr(unsafe.Pointer(&ptr)), uintptr(size), uintptr(align), 0, 0)
	return ptr, err
}

// MemAddressFree frees a reservation from MemAddressReserve (nothing may be mapped in it).
func (d *Driver) MemAddressFree(ptr DevicePtr, size uint64) error {
	return d.call("cuMemAddressFree", d.f.memAddressFree, uintptr(ptr), uintptr(size))
}

// MemMap maps all size bytes of allocation h at ptr, inside a reservation.
func (d *Driver) MemMap(ptr DevicePtr, size uint64, h AllocHandle) error {
	return d.call("cuMemMap", d.f.memMap, uintptr(ptr), uintptr(size), 0, uintptr(h), 0)
}

// MemUnmap unmaps [ptr, ptr+size), which must be whole mappings made by MemMap.
func (d *Driver) MemUnmap(ptr DevicePtr, size uint64) error {
	return d.call("cuMemUnmap", d.f.memUnmap, uintptr(ptr), uintptr(size))
}

// MemSetAccess grants each of devs read-write access to the mapped range [ptr, ptr+size).
func (d *Driver) MemSetAccess(ptr DevicePtr, size uint64, devs []Device) error {
	if len(devs) == 0 {
		return nil
	}
	access := make([]memAccessDesc, len(devs))
	for i, dev := range devs {
		access[i] = memAccessDesc{Location: memLocation{Type: memLocationTypeDevice, ID: int32(dev)}, Flags: memAccessFlagsReadWrite}
	}
	return d.call("cuMemSetAccess", d.f.memSetAccess, uintptr(ptr), uintptr(size), uintptr(unsafe.Pointer(&access[0])), uintptr(len(access)))
}
