// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// VMMAllocation is physical device memory from hipMemCreate mapped read-write
// for its device at a reserved virtual range.
type VMMAllocation struct {
	Handle      AllocHandle
	Ptr         DevicePtr
	Size        uint64
	Device      Device
	HandleTypes int
}

func deviceProp(dev Device, handleTypes int) memAllocationProp {
	return memAllocationProp{
		Type:                 memAllocationTypePinned,
		RequestedHandleTypes: int32(handleTypes),
		Location:             memLocation{Type: memLocationTypeDevice, ID: int32(dev)},
	}
}

// errNoVMM explains why VMM calls are refused on this runtime.
func (r *Runtime) errNoVMM(op string) error {
	if r.f.memCreate == 0 {
		return &Error{Op: op, Code: ErrSymbolNotFound, Name: "not exported by " + r.path}
	}
	return &Error{Op: op, Code: ErrNotSupported, Name: fmt.Sprintf("HIP %d predates the hipMemAllocationProp layout this package uses (needs %d)", r.runtimeVersion, vmmMinVersion)}
}

// Granularity is the minimum size and alignment of VMM allocations on dev.
func (r *Runtime) Granularity(dev Device, handleTypes int) (uint64, error) {
	if !r.HasVMM() {
		return 0, r.errNoVMM("hipMemGetAllocationGranularity")
	}
	prop := deviceProp(dev, handleTypes)
	var g uint64
	err := r.call("hipMemGetAllocationGranularity", r.f.memGetAllocationGranularity,
		uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)), memAllocGranularityMinimum)
	return g, err
}

// RoundUp rounds size up to a multiple of granularity g (g a power of two).
func RoundUp(size, g uint64) uint64 {
	return dynlib.RoundUp(size, g)
}

// MemCreate creates physical memory on dev exportable as handleTypes.
func (r *Runtime) MemCreate(dev Device, size uint64, handleTypes int) (AllocHandle, error) {
	if !r.HasVMM() {
		return 0, r.errNoVMM("hipMemCreate")
	}
	prop := deviceProp(dev, handleTypes)
	var h AllocHandle
	err := r.call("hipMemCreate", r.f.memCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0)
	return h, err
}

// MemRelease drops a reference on a physical allocation.
func (r *Runtime) MemRelease(h AllocHandle) error {
	return r.call("hipMemRelease", r.f.memRelease, uintptr(h))
}

// VMMAlloc creates size bytes (rounded up to the granularity) on dev, maps
// them and grants dev read-write access.
func (r *Runtime) VMMAlloc(dev Device, size uint64, handleTypes int) (*VMMAllocation, error) {
	g, err := r.Granularity(dev, handleTypes)
	if err != nil {
		return nil, err
	}
	size = RoundUp(size, g)
	h, err := r.MemCreate(dev, size, handleTypes)
	if err != nil {
		return nil, err
	}
	ptr, err := r.MapHandle(h, size, g, []Device{dev})
	if err != nil {
		return nil, errors.Join(err, r.MemRelease(h))
	}
	return &VMMAllocation{Handle: h, Ptr: ptr, Size: size, Device: dev, HandleTypes: handleTypes}, nil
}

// VMMFree unmaps and releases an allocation from VMMAlloc.
func (r *Runtime) VMMFree(a *VMMAllocation) error {
	return errors.Join(r.UnmapRange(a.Ptr, a.Size), r.MemRelease(a.Handle))
}

// MapHandle reserves a virtual range of size bytes, maps h there and grants
// read-write access to each of devs.
func (r *Runtime) MapHandle(h AllocHandle, size, align uint64, devs []Device) (DevicePtr, error) {
	if !r.HasVMM() {
		return 0, r.errNoVMM("hipMemAddressReserve")
	}
	var ptr DevicePtr
	if err := r.call("hipMemAddressReserve", r.f.memAddressReserve, uintptr(unsafe.Pointer(&ptr)), uintptr(size), uintptr(align), 0, 0); err != nil {
		return 0, err
	}
	if err := r.call("hipMemMap", r.f.memMap, uintptr(ptr), uintptr(size), 0, uintptr(h), 0); err != nil {
		return 0, errors.Join(err, r.call("hipMemAddressFree", r.f.memAddressFree, uintptr(ptr), uintptr(size)))
	}
	access := make([]memAccessDesc, len(devs))
	for i, dev := range devs {
		access[i] = memAccessDesc{Location: memLocation{Type: memLocationTypeDevice, ID: int32(dev)}, Flags: memAccessFlagsReadWrite}
	}
	if len(access) > 0 {
		if err := r.call("hipMemSetAccess", r.f.memSetAccess, uintptr(ptr), uintptr(size), uintptr(unsafe.Pointer(&access[0])), uintptr(len(access))); err != nil {
			return 0, errors.Join(err, r.UnmapRange(ptr, size))
		}
	}
	return ptr, nil
}

// UnmapRange unmaps a range mapped by MapHandle and frees its reservation.
func (r *Runtime) UnmapRange(ptr DevicePtr, size uint64) error {
	if err := r.call("hipMemUnmap", r.f.memUnmap, uintptr(ptr), uintptr(size)); err != nil {
		return err
	}
	return r.call("hipMemAddressFree", r.f.memAddressFree, uintptr(ptr), uintptr(size))
}

// ExportPosixFD exports h as a file descriptor (a dma-buf on ROCm); the
// caller owns the fd. The allocation must have been created with
// HandleTypePosixFD.
func (r *Runtime) ExportPosixFD(h AllocHandle) (int, error) {
	if !r.HasVMM() {
		return -1, r.errNoVMM("hipMemExportToShareableHandle")
	}
	var fd int32 = -1
	err := r.call("hipMemExportToShareableHandle(POSIX_FD)", r.f.memExport, uintptr(unsafe.Pointer(&fd)), uintptr(h), HandleTypePosixFD, 0)
	return int(fd), err
}

// ImportPosixFD imports an allocation exported as fd; the fd stays the
// caller's. The imported memory belongs to the current device.
func (r *Runtime) ImportPosixFD(fd int) (AllocHandle, error) {
	if !r.HasVMM() {
		return 0, r.errNoVMM("hipMemImportFromShareableHandle")
	}
	// The runtime takes the fd value itself in the void* osHandle slot, as
	// CUDA does, and refuses a null osHandle: fd 0 cannot be imported.
	if fd <= 0 {
		return 0, fmt.Errorf("hipMemImportFromShareableHandle: invalid fd %d", fd)
	}
	var h AllocHandle
	err := r.call("hipMemImportFromShareableHandle(POSIX_FD)", r.f.memImport, uintptr(unsafe.Pointer(&h)), uintptr(fd), HandleTypePosixFD)
	return h, err
}

// AllocationOf finds the VMM allocation that holds p: a retained handle (the
// caller releases it), the mapping's base address and size.
func (r *Runtime) AllocationOf(p DevicePtr) (AllocHandle, DevicePtr, uint64, error) {
	base, size, err := r.AddressRange(p)
	if err != nil {
		return 0, 0, 0, err
	}
	var h AllocHandle
	if err := r.call("hipMemRetainAllocationHandle", r.f.memRetainAllocationHandle, uintptr(unsafe.Pointer(&h)), uintptr(p)); err != nil {
		return 0, 0, 0, err
	}
	return h, base, size, nil
}
