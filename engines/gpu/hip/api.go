// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// DeviceCount is the number of HIP devices visible to this process
// (HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES apply).
func (r *Runtime) DeviceCount() (int, error) {
	var n int32
	err := r.call("hipGetDeviceCount", r.f.getDeviceCount, uintptr(unsafe.Pointer(&n)))
	return int(n), err
}

// DeviceGet returns the device of ordinal.
func (r *Runtime) DeviceGet(ordinal int) (Device, error) {
	var dev int32
	err := r.call("hipDeviceGet", r.f.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal))
	return Device(dev), err
}

// DeviceName is the marketing name of dev.
func (r *Runtime) DeviceName(dev Device) (string, error) {
	buf := make([]byte, 256)
	if err := r.call("hipDeviceGetName", r.f.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return dynlib.CString(buf), nil
}

// DevicePCIBusID is dev's PCI address, e.g. "0000:c1:00.0".
func (r *Runtime) DevicePCIBusID(dev Device) (string, error) {
	buf := make([]byte, 64)
	if err := r.call("hipDeviceGetPCIBusId", r.f.deviceGetPCIBusID, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return dynlib.CString(buf), nil
}

// DeviceAttribute reads one hipDeviceAttribute_t value (the Attr* constants).
func (r *Runtime) DeviceAttribute(dev Device, attr int) (int, error) {
	var v int32
	err := r.call(fmt.Sprintf("hipDeviceGetAttribute(%d)", attr), r.f.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	return int(v), err
}

// DeviceTotalMem is dev's memory in bytes.
func (r *Runtime) DeviceTotalMem(dev Device) (uint64, error) {
	var v uint64
	err := r.call("hipDeviceTotalMem", r.f.deviceTotalMem, uintptr(unsafe.Pointer(&v)), uintptr(dev))
	return v, err
}

// CanAccessPeer reports whether dev can map peer's memory directly (XGMI or PCIe P2P).
func (r *Runtime) CanAccessPeer(dev, peer Device) (bool, error) {
	var v int32
	err := r.call("hipDeviceCanAccessPeer", r.f.deviceCanAccessPeer, uintptr(unsafe.Pointer(&v)), uintptr(dev), uintptr(peer))
	return v != 0, err
}

// GetDevice is the calling thread's current device.
func (r *Runtime) GetDevice() (Device, error) {
	var dev int32
	err := r.call("hipGetDevice", r.f.getDevice, uintptr(unsafe.Pointer(&dev)))
	return Device(dev), err
}

// SetDevice makes dev current on the calling thread; lock the goroutine to
// its thread first (WithDevice does both).
func (r *Runtime) SetDevice(dev Device) error {
	return r.call(fmt.Sprintf("hipSetDevice(%d)", dev), r.f.setDevice, uintptr(dev))
}

// DeviceSynchronize waits for all work of the current device.
func (r *Runtime) DeviceSynchronize() error {
	return r.call("hipDeviceSynchronize", r.f.deviceSynchronize)
}

// EnablePeerAccess lets the current device map peer's memory; already
// enabled is not an error.
func (r *Runtime) EnablePeerAccess(peer Device) error {
	err := r.call(fmt.Sprintf("hipDeviceEnablePeerAccess(%d)", peer), r.f.deviceEnablePeerAccess, uintptr(peer), 0)
	if IsResult(err, ErrPeerAccessAlreadyOn) {
		return nil
	}
	return err
}

// Malloc allocates device memory on the current device.
func (r *Runtime) Malloc(size uint64) (DevicePtr, error) {
	var p DevicePtr
	err := r.call("hipMalloc", r.f.malloc, uintptr(unsafe.Pointer(&p)), uintptr(size))
	return p, err
}

// Free frees memory from Malloc.
func (r *Runtime) Free(p DevicePtr) error {
	return r.call("hipFree", r.f.free, uintptr(p))
}

// HostMalloc allocates pinned host memory, portable (every device) and
// mapped into the device address space.
func (r *Runtime) HostMalloc(size uint64) (uintptr, error) {
	var p uintptr
	err := r.call("hipHostMalloc", r.f.hostMalloc, uintptr(unsafe.Pointer(&p)), uintptr(size), hostMallocPortable|hostMallocMapped)
	return p, err
}

// HostFree frees memory from HostMalloc.
func (r *Runtime) HostFree(p uintptr) error {
	return r.call("hipHostFree", r.f.hostFree, p)
}

// HostRegister pins an existing host range and maps it for every device.
func (r *Runtime) HostRegister(p uintptr, size uint64) error {
	return r.call("hipHostRegister", r.f.hostRegister, p, uintptr(size), hostRegisterPortable|hostRegisterMapped)
}

// HostUnregister undoes HostRegister.
func (r *Runtime) HostUnregister(p uintptr) error {
	return r.call("hipHostUnregister", r.f.hostUnregister, p)
}

// MemGetInfo is the free and total memory of the current device.
func (r *Runtime) MemGetInfo() (free, total uint64, err error) {
	err = r.call("hipMemGetInfo", r.f.memGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, err
}

// Memset fills n bytes at p with v.
func (r *Runtime) Memset(p DevicePtr, v byte, n uint64) error {
	return r.call("hipMemset", r.f.memset, uintptr(p), uintptr(v), uintptr(n))
}

// MemsetAsync fills n bytes at p with v on stream s.
func (r *Runtime) MemsetAsync(p DevicePtr, v byte, n uint64, s Stream) error {
	return r.call("hipMemsetAsync", r.f.memsetAsync, uintptr(p), uintptr(v), uintptr(n), uintptr(s))
}

// Memcpy copies n bytes between two addresses the runtime knows (device,
// pinned or registered host), synchronously; the direction is inferred.
func (r *Runtime) Memcpy(dst, src uint64, n uint64) error {
	return r.call("hipMemcpy", r.f.memcpy, uintptr(dst), uintptr(src), uintptr(n), memcpyDefault)
}

// MemcpyAsync copies n bytes between two addresses on stream s.
func (r *Runtime) MemcpyAsync(dst, src uint64, n uint64, s Stream) error {
	return r.call("hipMemcpyAsync", r.f.memcpyAsync, uintptr(dst), uintptr(src), uintptr(n), memcpyDefault, uintptr(s))
}

// MemcpyHtoD copies len(src) bytes of Go memory to the device, synchronously.
func (r *Runtime) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	err := r.call("hipMemcpy(HtoD)", r.f.memcpy, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), memcpyDefault)
	runtime.KeepAlive(src)
	return err
}

// MemcpyDtoH copies len(dst) bytes from the device into Go memory, synchronously.
func (r *Runtime) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	err := r.call("hipMemcpy(DtoH)", r.f.memcpy, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), memcpyDefault)
	runtime.KeepAlive(dst)
	return err
}

// MemcpyPeer copies n bytes from srcDev's memory to dstDev's, synchronously.
func (r *Runtime) MemcpyPeer(dst DevicePtr, dstDev Device, src DevicePtr, srcDev Device, n uint64) error {
	return r.call("hipMemcpyPeer", r.f.memcpyPeer, uintptr(dst), uintptr(dstDev), uintptr(src), uintptr(srcDev), uintptr(n))
}

// MemcpyPeerAsync copies n bytes from srcDev's memory to dstDev's on stream s.
func (r *Runtime) MemcpyPeerAsync(dst DevicePtr, dstDev Device, src DevicePtr, srcDev Device, n uint64, s Stream) error {
	return r.call("hipMemcpyPeerAsync", r.f.memcpyPeerAsync, uintptr(dst), uintptr(dstDev), uintptr(src), uintptr(srcDev), uintptr(n), uintptr(s))
}

// StreamCreate creates a non-blocking stream on the current device.
func (r *Runtime) StreamCreate() (Stream, error) {
	var s Stream
	err := r.call("hipStreamCreateWithFlags", r.f.streamCreateWithFlags, uintptr(unsafe.Pointer(&s)), streamNonBlocking)
	return s, err
}

// StreamDestroy destroys s once its work is done.
func (r *Runtime) StreamDestroy(s Stream) error {
	return r.call("hipStreamDestroy", r.f.streamDestroy, uintptr(s))
}

// StreamSynchronize waits for s.
func (r *Runtime) StreamSynchronize(s Stream) error {
	return r.call("hipStreamSynchronize", r.f.streamSynchronize, uintptr(s))
}

// StreamQuery reports whether all of s's work has completed.
func (r *Runtime) StreamQuery(s Stream) (bool, error) {
	err := r.call("hipStreamQuery", r.f.streamQuery, uintptr(s))
	if IsResult(err, ErrNotReady) {
		return false, nil
	}
	return err == nil, err
}

// StreamWaitEvent makes s wait for e.
func (r *Runtime) StreamWaitEvent(s Stream, e Event) error {
	return r.call("hipStreamWaitEvent", r.f.streamWaitEvent, uintptr(s), uintptr(e), 0)
}

// EventCreate creates an event; timing events cost more to record.
func (r *Runtime) EventCreate(timing bool) (Event, error) {
	var e Event
	flags := uintptr(eventDisableTiming)
	if timing {
		flags = eventDefault
	}
	err := r.call("hipEventCreateWithFlags", r.f.eventCreateWithFlags, uintptr(unsafe.Pointer(&e)), flags)
	return e, err
}

// EventDestroy destroys e.
func (r *Runtime) EventDestroy(e Event) error {
	return r.call("hipEventDestroy", r.f.eventDestroy, uintptr(e))
}

// EventRecord records e on s.
func (r *Runtime) EventRecord(e Event, s Stream) error {
	return r.call("hipEventRecord", r.f.eventRecord, uintptr(e), uintptr(s))
}

// EventSynchronize blocks until e completes.
func (r *Runtime) EventSynchronize(e Event) error {
	return r.call("hipEventSynchronize", r.f.eventSynchronize, uintptr(e))
}

// EventQuery reports whether e has completed; a failed stream's error is returned.
func (r *Runtime) EventQuery(e Event) (bool, error) {
	err := r.call("hipEventQuery", r.f.eventQuery, uintptr(e))
	if IsResult(err, ErrNotReady) {
		return false, nil
	}
	return err == nil, err
}

// EventElapsed is the time between two recorded timing events, in milliseconds.
func (r *Runtime) EventElapsed(start, end Event) (float32, error) {
	var ms float32
	err := r.call("hipEventElapsedTime", r.f.eventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
	return ms, err
}

// ModuleLoadData loads a code object (what hipRTC returns) onto the current device.
func (r *Runtime) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("hipModuleLoadData: empty image")
	}
	var m Module
	err := r.call("hipModuleLoadData", r.f.moduleLoadData, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&image[0])))
	runtime.KeepAlive(image)
	return m, err
}

// ModuleUnload unloads m.
func (r *Runtime) ModuleUnload(m Module) error {
	return r.call("hipModuleUnload", r.f.moduleUnload, uintptr(m))
}

// ModuleFunction looks up an extern "C" kernel in m.
func (r *Runtime) ModuleFunction(m Module, name string) (Function, error) {
	cname := append([]byte(name), 0)
	var f Function
	err := r.call("hipModuleGetFunction "+name, r.f.moduleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0])))
	runtime.KeepAlive(cname)
	return f, err
}

// LaunchConfig is a kernel launch's shape.
type LaunchConfig struct {
	GridX, GridY, GridZ    uint32
	BlockX, BlockY, BlockZ uint32
	SharedMem              uint32
	Stream                 Stream
}

// Launch starts f; params points at each kernel argument's value, which the
// runtime copies before returning. The pointers must point outside the Go
// heap or at values kept alive by the caller until Launch returns.
func (r *Runtime) Launch(f Function, cfg LaunchConfig, params []unsafe.Pointer) error {
	var pp uintptr
	if len(params) > 0 {
		pp = uintptr(unsafe.Pointer(&params[0]))
	}
	gy, gz, by, bz := max(cfg.GridY, 1), max(cfg.GridZ, 1), max(cfg.BlockY, 1), max(cfg.BlockZ, 1)
	// hipModuleLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
	// blockDimZ, sharedMemBytes, stream, kernelParams, extra): the same shape as cuLaunchKernel.
	err := r.call("hipModuleLaunchKernel", r.f.moduleLaunchKernel, uintptr(f),
		uintptr(cfg.GridX), uintptr(gy), uintptr(gz), uintptr(cfg.BlockX), uintptr(by), uintptr(bz),
		uintptr(cfg.SharedMem), uintptr(cfg.Stream), pp, 0)
	runtime.KeepAlive(params)
	return err
}

// IPCGetMemHandle makes an IPC handle for memory from Malloc.
func (r *Runtime) IPCGetMemHandle(p DevicePtr) (IPCMemHandle, error) {
	var h IPCMemHandle
	err := r.call("hipIpcGetMemHandle", r.f.ipcGetMemHandle, uintptr(unsafe.Pointer(&h[0])), uintptr(p))
	return h, err
}

// IPCOpenMemHandle maps another process's allocation onto the current device.
func (r *Runtime) IPCOpenMemHandle(h IPCMemHandle) (DevicePtr, error) {
	// Heap copies: the arguments travel as plain integers, so the values they
	// point to must neither move nor be collected before the call returns.
	p, hc := new(DevicePtr), new(IPCMemHandle)
	*hc = h
	err := r.call("hipIpcOpenMemHandle", r.f.ipcOpenMemHandle, ipcOpenArgs(p, hc, ipcMemLazyEnablePeerAccess)...)
	if IsResult(err, ErrInvalidValue) {
		// hip_runtime_api.h defined hipIpcMemLazyEnablePeerAccess as 0 up to ROCm 5.x
		// and 0x01 since; a runtime that only knows 0 refuses 1 as an invalid flag.
		err = r.call("hipIpcOpenMemHandle", r.f.ipcOpenMemHandle, ipcOpenArgs(p, hc, 0)...)
	}
	runtime.KeepAlive(hc)
	runtime.KeepAlive(p)
	return *p, err
}

// IPCCloseMemHandle unmaps memory from IPCOpenMemHandle.
func (r *Runtime) IPCCloseMemHandle(p DevicePtr) error {
	return r.call("hipIpcCloseMemHandle", r.f.ipcCloseMemHandle, uintptr(p))
}

// IPCAllocationSize is how many bytes of its allocation lie from p (a pointer
// IPCOpenMemHandle returned) to the allocation's end.
func (r *Runtime) IPCAllocationSize(p DevicePtr) (uint64, error) {
	base, size, err := r.AddressRange(p)
	if err != nil {
		return 0, err
	}
	return uint64(base) + size - uint64(p), nil
}

// AddressRange is the base and size of the allocation that holds p.
func (r *Runtime) AddressRange(p DevicePtr) (DevicePtr, uint64, error) {
	var base DevicePtr
	var size uint64
	err := r.call("hipMemGetAddressRange", r.f.memGetAddressRange, uintptr(unsafe.Pointer(&base)), uintptr(unsafe.Pointer(&size)), uintptr(p))
	return base, size, err
}
