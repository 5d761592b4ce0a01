// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// VMMAllocation is physical device memory from cuMemCreate mapped read-write
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
		GPUDirectRDMACapable: 1,
	}
}

// Granularity is the minimum size and alignment of VMM allocations on dev.
func (d *Driver) Granularity(dev Device, handleTypes int) (uint64, error) {
	prop := deviceProp(dev, handleTypes)
	var g uint64
	err := d.call("cuMemGetAllocationGranularity", d.f.memGetAllocationGranularity,
		uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)), memAllocGranularityMinimum)
	return g, err
}

// RoundUp rounds size up to a multiple of granularity g (g a power of two).
func RoundUp(size, g uint64) uint64 {
	return dynlib.RoundUp(size, g)
}

// MemCreate creates physical memory on dev exportable as handleTypes.
func (d *Driver) MemCreate(dev Device, size uint64, handleTypes int) (AllocHandle, error) {
	prop := deviceProp(dev, handleTypes)
	var h AllocHandle
	err := d.call("cuMemCreate", d.f.memCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0)
	return h, err
}

// MemRelease drops a reference on a physical allocation.
func (d *Driver) MemRelease(h AllocHandle) error {
	return d.call("cuMemRelease", d.f.memRelease, uintptr(h))
}

// VMMAlloc creates size bytes (rounded up to the granularity) on dev, maps
// them and grants dev read-write access. The current context must be dev's.
func (d *Driver) VMMAlloc(dev Device, size uint64, handleTypes int) (*VMMAllocation, error) {
	g, err := d.Granularity(dev, handleTypes)
	if err != nil {
		return nil, err
	}
	size = RoundUp(size, g)
	h, err := d.MemCreate(dev, size, handleTypes)
	if err != nil {
		return nil, err
	}
	ptr, err := d.MapHandle(h, size, g, []Device{dev})
	if err != nil {
		return nil, errors.Join(err, d.MemRelease(h))
	}
	return &VMMAllocation{Handle: h, Ptr: ptr, Size: size, Device: dev, HandleTypes: handleTypes}, nil
}

// VMMFree unmaps and releases an allocation from VMMAlloc.
func (d *Driver) VMMFree(a *VMMAllocation) error {
	return errors.Join(d.UnmapRange(a.Ptr, a.Size), d.MemRelease(a.Handle))
}

// MapHandle reserves a virtual range of size bytes, maps h there and grants
// read-write access to each of devs.
func (d *Driver) MapHandle(h AllocHandle, size, align uint64, devs []Device) (DevicePtr, error) {
	var ptr DevicePtr
	if err := d.call("cuMemAddressReserve", d.f.memAddressReserve, uintptr(unsafe.Pointer(&ptr)), uintptr(size), uintptr(align), 0, 0); err != nil {
		return 0, err
	}
	if err := d.call("cuMemMap", d.f.memMap, uintptr(ptr), uintptr(size), 0, uintptr(h), 0); err != nil {
		return 0, errors.Join(err, d.call("cuMemAddressFree", d.f.memAddressFree, uintptr(ptr), uintptr(size)))
	}
	access := make([]memAccessDesc, len(devs))
	for i, dev := range devs {
		access[i] = memAccessDesc{Location: memLocation{Type: memLocationTypeDevice, ID: int32(dev)}, Flags: memAccessFlagsReadWrite}
	}
	if len(access) > 0 {
		if err := d.call("cuMemSetAccess", d.f.memSetAccess, uintptr(ptr), uintptr(size), uintptr(unsafe.Pointer(&access[0])), uintptr(len(access))); err != nil {
			return 0, errors.Join(err, d.UnmapRange(ptr, size))
		}
	}
	return ptr, nil
}

// UnmapRange unmaps a range mapped by MapHandle and frees its reservation.
func (d *Driver) UnmapRange(ptr DevicePtr, size uint64) error {
	if err := d.call("cuMemUnmap", d.f.memUnmap, uintptr(ptr), uintptr(size)); err != nil {
		return err
	}
	return d.call("cuMemAddressFree", d.f.memAddressFree, uintptr(ptr), uintptr(size))
}

// ExportPosixFD exports h as a file descriptor (close-on-exec; dup it before
// handing it to a child process). The caller owns the fd.
func (d *Driver) ExportPosixFD(h AllocHandle) (int, error) {
	var fd int32 = -1
	err := d.call("cuMemExportToShareableHandle(POSIX_FD)", d.f.memExport, uintptr(unsafe.Pointer(&fd)), uintptr(h), HandleTypePosixFD, 0)
	return int(fd), err
}

// ExportFabric exports h as a 64-byte fabric handle, valid on every node of
// the same NVLink fabric (IMEX domain).
func (d *Driver) ExportFabric(h AllocHandle) (FabricHandle, error) {
	var fh FabricHandle
	err := d.call("cuMemExportToShareableHandle(FABRIC)", d.f.memExport, uintptr(unsafe.Pointer(&fh[0])), uintptr(h), HandleTypeFabric, 0)
	return fh, err
}

// ImportPosixFD imports an allocation exported as fd; the fd stays the caller's.
func (d *Driver) ImportPosixFD(fd int) (AllocHandle, error) {
	if fd < 0 {
		return 0, fmt.Errorf("cuMemImportFromShareableHandle: invalid fd %d", fd)
	}
	var h AllocHandle
	// For POSIX fds the driver takes the fd value itself in the pointer slot.
	err := d.call("cuMemImportFromShareableHandle(POSIX_FD)", d.f.memImport, uintptr(unsafe.Pointer(&h)), uintptr(fd), HandleTypePosixFD)
	return h, err
}

// ImportFabric imports an allocation exported as a fabric handle.
func (d *Driver) ImportFabric(fh FabricHandle) (AllocHandle, error) {
	var h AllocHandle
	err := d.call("cuMemImportFromShareableHandle(FABRIC)", d.f.memImport, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&fh[0])), HandleTypeFabric)
	return h, err
}

// AllocationOf finds the VMM allocation that holds p: a retained handle (the
// caller releases it), the mapping's base address and size.
func (d *Driver) AllocationOf(p DevicePtr) (AllocHandle, DevicePtr, uint64, error) {
	var base DevicePtr
	var size uint64
	if err := d.call("cuMemGetAddressRange", d.f.memGetAddressRange, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size)), uintptr(p)); err != nil {
		return 0, 0, 0, err
	}
	var h AllocHandle
	if err := d.call("cuMemRetainAllocationHandle", d.f.memRetainAllocationHandle, uintptr(unsafe.Pointer(&h)), uintptr(p)); err != nil {
		return 0, 0, 0, err
	}
	return h, base, size, nil
}

// IPCGetMemHandle makes a legacy IPC handle for a cuMemAlloc allocation.
func (d *Driver) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	err := d.call("cuIpcGetMemHandle", d.f.ipcGetMemHandle, uintptr(unsafe.Pointer(&h[0])), uintptr(p))
	return h, err
}

// IPCOpenMemHandle maps another process's allocation into the current context.
func (d *Driver) IPCOpenMemHandle(h IPCMemHandle) (DevicePtr, error) {
	// Heap copies: the arguments travel as plain integers, so the values they
	// point to must neither move nor be collected before the call returns.
	p, hc := new(DevicePtr), new(IPCMemHandle)
	*hc = h
	err := d.call("cuIpcOpenMemHandle", d.f.ipcOpenMemHandle, ipcOpenArgs(p, hc, ipcMemLazyEnablePeerAccess)...)
	runtime.KeepAlive(hc)
	return *p, err
}

// IPCAllocationSize is how many bytes of its allocation lie from p (a pointer
// IPCOpenMemHandle returned) to the allocation's end: a handle names a whole
// allocation, whose size only the driver knows. The pointer's range attributes
// describe the imported mapping (NVIDIA's own IPC import checks a peer's
// advertised size against them).
func (d *Driver) IPCAllocationSize(p DevicePtr) (uint64, error) {
	var start, size uint64
	if err := d.call("cuPointerGetAttribute(RANGE_START_ADDR)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&start)), pointerAttributeRangeStart, uintptr(p)); err != nil {
		return 0, err
	}
	if err := d.call("cuPointerGetAttribute(RANGE_SIZE)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&size)), pointerAttributeRangeSize, uintptr(p)); err != nil {
		return 0, err
	}
	if uint64(p) < start || uint64(p)-start > size {
		return 0, fmt.Errorf("pointer %#x lies outside its range [%#x, +%d)", uint64(p), start, size)
	}
	return start + size - uint64(p), nil
}

// IPCCloseMemHandle unmaps memory from IPCOpenMemHandle.
func (d *Driver) IPCCloseMemHandle(p DevicePtr) error {
	return d.call("cuIpcCloseMemHandle", d.f.ipcCloseMemHandle, uintptr(p))
}

// DMABufFD exports [ptr, ptr+size) of device memory as a dma-buf fd (both
// must be host-page aligned) for a NIC to register; the caller closes it.
func (d *Driver) DMABufFD(ptr DevicePtr, size uint64) (int, error) {
	if d.f.memGetHandleForAddressRange == 0 {
		return -1, notExported("cuMemGetHandleForAddressRange", ErrSymbolNotFoundInDriver)
	}
	var fd int32 = -1
	const dmaBufFD = 0x1 // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
	err := d.call("cuMemGetHandleForAddressRange(DMA_BUF_FD)", d.f.memGetHandleForAddressRange,
		uintptr(unsafe.Pointer(&fd)), uintptr(ptr), uintptr(size), dmaBufFD, 0)
	return int(fd), err
}
