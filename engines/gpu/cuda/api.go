// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// DeviceCount is the number of CUDA devices visible to this process.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	err := d.call("cuDeviceGetCount", d.f.deviceGetCount, uintptr(unsafe.Pointer(&n)))
	return int(n), err
}

// DeviceGet returns the handle of device ordinal.
func (d *Driver) DeviceGet(ordinal int) (Device, error) {
	var dev int32
	err := d.call("cuDeviceGet", d.f.deviceGet, uintptr(unsafe.Pointer(&dev)), uintptr(ordinal))
	return Device(dev), err
}

// DeviceName is the marketing name of dev.
func (d *Driver) DeviceName(dev Device) (string, error) {
	buf := make([]byte, 256)
	if err := d.call("cuDeviceGetName", d.f.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return dynlib.CString(buf), nil
}

// DevicePCIBusID is dev's PCI address, e.g. "0000:00:06.0".
func (d *Driver) DevicePCIBusID(dev Device) (string, error) {
	buf := make([]byte, 64)
	if err := d.call("cuDeviceGetPCIBusId", d.f.deviceGetPCIBusID, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); err != nil {
		return "", err
	}
	return dynlib.CString(buf), nil
}

// DeviceAttribute reads one CU_DEVICE_ATTRIBUTE_* value.
func (d *Driver) DeviceAttribute(dev Device, attr int) (int, error) {
	var v int32
	err := d.call(fmt.Sprintf("cuDeviceGetAttribute(%d)", attr), d.f.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(dev))
	return int(v), err
}

// DeviceTotalMem is dev's memory in bytes.
func (d *Driver) DeviceTotalMem(dev Device) (uint64, error) {
	var v uint64
	err := d.call("cuDeviceTotalMem", d.f.deviceTotalMem, uintptr(unsafe.Pointer(&v)), uintptr(dev))
	return v, err
}

// CanAccessPeer reports whether dev can map peer's memory directly.
func (d *Driver) CanAccessPeer(dev, peer Device) (bool, error) {
	var v int32
	err := d.call("cuDeviceCanAccessPeer", d.f.deviceCanAccessPeer, uintptr(unsafe.Pointer(&v)), uintptr(dev), uintptr(peer))
	return v != 0, err
}

// PrimaryContextRetain retains dev's primary context (the one the CUDA runtime
// and frameworks share), so memory they allocate is usable here.
func (d *Driver) PrimaryContextRetain(dev Device) (Context, error) {
	var c Context
	err := d.call("cuDevicePrimaryCtxRetain", d.f.primaryCtxRetain, uintptr(unsafe.Pointer(&c)), uintptr(dev))
	return c, err
}

// PrimaryContextRelease drops one retain of dev's primary context.
func (d *Driver) PrimaryContextRelease(dev Device) error {
	return d.call("cuDevicePrimaryCtxRelease", d.f.primaryCtxRelease, uintptr(dev))
}

// CtxGetCurrent is the calling thread's current context (0 for none).
func (d *Driver) CtxGetCurrent() (Context, error) {
	var c Context
	err := d.call("cuCtxGetCurrent", d.f.ctxGetCurrent, uintptr(unsafe.Pointer(&c)))
	return c, err
}

// CtxSetCurrent binds ctx to the calling thread.
func (d *Driver) CtxSetCurrent(ctx Context) error {
	return d.call("cuCtxSetCurrent", d.f.ctxSetCurrent, uintptr(ctx))
}

// CtxSynchronize waits for all work of the current context.
func (d *Driver) CtxSynchronize() error {
	return d.call("cuCtxSynchronize", d.f.ctxSynchronize)
}

// CtxEnablePeerAccess lets the current context map peer's memory; already
// enabled is not an error.
func (d *Driver) CtxEnablePeerAccess(peer Context) error {
	err := d.call("cuCtxEnablePeerAccess", d.f.ctxEnablePeerAccess, uintptr(peer), 0)
	if IsResult(err, ErrPeerAccessAlreadyOn) {
		return nil
	}
	return err
}

// MemAlloc allocates device memory in the current context.
func (d *Driver) MemAlloc(size uint64) (DevicePtr, error) {
	var p DevicePtr
	err := d.call("cuMemAlloc", d.f.memAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size))
	return p, err
}

// MemFree frees memory from MemAlloc.
func (d *Driver) MemFree(p DevicePtr) error {
	return d.call("cuMemFree", d.f.memFree, uintptr(p))
}

// MemHostAlloc allocates pinned, portable, device-mapped host memory.
func (d *Driver) MemHostAlloc(size uint64) (uintptr, error) {
	var p uintptr
	err := d.call("cuMemHostAlloc", d.f.memHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size), memHostAllocPortable|memHostAllocDeviceMap)
	return p, err
}

// MemFreeHost frees memory from MemHostAlloc.
func (d *Driver) MemFreeHost(p uintptr) error {
	return d.call("cuMemFreeHost", d.f.memFreeHost, p)
}

// MemHostRegister pins an existing host range and maps it for all contexts.
func (d *Driver) MemHostRegister(p uintptr, size uint64) error {
	return d.call("cuMemHostRegister", d.f.memHostRegister, p, uintptr(size), memHostRegisterPortable|memHostRegisterDeviceMap)
}

// MemHostUnregister undoes MemHostRegister.
func (d *Driver) MemHostUnregister(p uintptr) error {
	return d.call("cuMemHostUnregister", d.f.memHostUnregister, p)
}

// MemGetInfo is the free and total memory of the current context's device.
func (d *Driver) MemGetInfo() (free, total uint64, err error) {
	err = d.call("cuMemGetInfo", d.f.memGetInfo, uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, err
}

// MemsetD8 fills n bytes at p with v.
func (d *Driver) MemsetD8(p DevicePtr, v byte, n uint64) error {
	return d.call("cuMemsetD8", d.f.memsetD8, uintptr(p), uintptr(v), uintptr(n))
}

// MemsetD8Async sets n bytes at p to v on stream s.
func (d *Driver) MemsetD8Async(p DevicePtr, v byte, n uint64, s Stream) error {
	return d.call("cuMemsetD8Async", d.f.memsetD8Async, uintptr(p), uintptr(v), uintptr(n), uintptr(s))
}

// Memcpy copies n bytes between any two UVA addresses, synchronously.
func (d *Driver) Memcpy(dst, src uint64, n uint64) error {
	return d.call("cuMemcpy", d.f.memcpy, uintptr(dst), uintptr(src), uintptr(n))
}

// MemcpyAsync copies n bytes between any two UVA addresses on stream.
func (d *Driver) MemcpyAsync(dst, src uint64, n uint64, s Stream) error {
	return d.call("cuMemcpyAsync", d.f.memcpyAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

// MemcpyDtoD copies device to device, synchronously.
func (d *Driver) MemcpyDtoD(dst, src DevicePtr, n uint64) error {
	return d.call("cuMemcpyDtoD", d.f.memcpyDtoD, uintptr(dst), uintptr(src), uintptr(n))
}

// MemcpyDtoDAsync copies device to device on stream (the copy engine).
func (d *Driver) MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	return d.call("cuMemcpyDtoDAsync", d.f.memcpyDtoDAsync, uintptr(dst), uintptr(src), uintptr(n), uintptr(s))
}

// MemcpyHtoD copies len(src) bytes of Go memory to the device, synchronously.
func (d *Driver) MemcpyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return d.call("cuMemcpyHtoD", d.f.memcpyHtoD, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
}

// MemcpyDtoH copies len(dst) bytes from the device into Go memory, synchronously.
func (d *Driver) MemcpyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return d.call("cuMemcpyDtoH", d.f.memcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// MemcpyHtoDAsync copies from pinned host memory (an address the driver gave)
// to the device on stream.
func (d *Driver) MemcpyHtoDAsync(dst DevicePtr, src uintptr, n uint64, s Stream) error {
	return d.call("cuMemcpyHtoDAsync", d.f.memcpyHtoDAsync, uintptr(dst), src, uintptr(n), uintptr(s))
}

// MemcpyDtoHAsync copies from the device into pinned host memory on stream.
func (d *Driver) MemcpyDtoHAsync(dst uintptr, src DevicePtr, n uint64, s Stream) error {
	return d.call("cuMemcpyDtoHAsync", d.f.memcpyDtoHAsync, dst, uintptr(src), uintptr(n), uintptr(s))
}

// MemcpyPeerAsync copies between two contexts' memory on stream.
func (d *Driver) MemcpyPeerAsync(dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n uint64, s Stream) error {
	return d.call("cuMemcpyPeerAsync", d.f.memcpyPeerAsync, uintptr(dst), uintptr(dstCtx), uintptr(src), uintptr(srcCtx), uintptr(n), uintptr(s))
}

// MemcpyPeer copies between two contexts' memory, synchronously.
func (d *Driver) MemcpyPeer(dst DevicePtr, dstCtx Context, src DevicePtr, srcCtx Context, n uint64) error {
	return d.call("cuMemcpyPeer", d.f.memcpyPeer, uintptr(dst), uintptr(dstCtx), uintptr(src), uintptr(srcCtx), uintptr(n))
}

// MemcpyBatchAsync issues len(dsts) copies in one driver call on stream, with
// source accesses ordered by the stream. The stream must not be the legacy
// default stream (the driver answers "invalid argument").
func (d *Driver) MemcpyBatchAsync(dsts, srcs []DevicePtr, sizes []uint64, s Stream) error {
	if d.batchABI == 0 {
		return notExported("cuMemcpyBatchAsync", ErrSymbolNotFoundInDriver)
	}
	if len(dsts) != len(srcs) || len(dsts) != len(sizes) {
		return fmt.Errorf("cuMemcpyBatchAsync: %d destinations, %d sources, %d sizes", len(dsts), len(srcs), len(sizes))
	}
	if len(dsts) == 0 {
		return nil
	}
	attrs := memcpyAttributes{SrcAccessOrder: memcpySrcAccessOrderStream}
	var attrIdx uint64
	if d.batchABI == 13 {
		return d.call("cuMemcpyBatchAsync", d.f.batchCopy,
			uintptr(unsafe.Pointer(&dsts[0])), uintptr(unsafe.Pointer(&srcs[0])), uintptr(unsafe.Pointer(&sizes[0])),
			uintptr(len(dsts)), uintptr(unsafe.Pointer(&attrs)), uintptr(unsafe.Pointer(&attrIdx)), 1, uintptr(s))
	}
	var failIdx uint64
	return d.call("cuMemcpyBatchAsync", d.f.batchCopy,
		uintptr(unsafe.Pointer(&dsts[0])), uintptr(unsafe.Pointer(&srcs[0])), uintptr(unsafe.Pointer(&sizes[0])),
		uintptr(len(dsts)), uintptr(unsafe.Pointer(&attrs)), uintptr(unsafe.Pointer(&attrIdx)), 1,
		uintptr(unsafe.Pointer(&failIdx)), uintptr(s))
}

// StreamCreate creates a non-blocking stream in the current context.
func (d *Driver) StreamCreate() (Stream, error) {
	var s Stream
	err := d.call("cuStreamCreate", d.f.streamCreate, uintptr(unsafe.Pointer(&s)), streamNonBlocking)
	return s, err
}

// StreamDestroy destroys s once its work is done.
func (d *Driver) StreamDestroy(s Stream) error {
	return d.call("cuStreamDestroy", d.f.streamDestroy, uintptr(s))
}

// StreamSynchronize waits for s.
func (d *Driver) StreamSynchronize(s Stream) error {
	return d.call("cuStreamSynchronize", d.f.streamSynchronize, uintptr(s))
}

// StreamWaitEvent makes s wait for e.
func (d *Driver) StreamWaitEvent(s Stream, e Event) error {
	return d.call("cuStreamWaitEvent", d.f.streamWaitEvent, uintptr(s), uintptr(e), 0)
}

// StreamWaitValue32 makes s wait until the 32-bit word at addr (device
// memory, or mapped pinned host memory) is at least value.
func (d *Driver) StreamWaitValue32(s Stream, addr uint64, value uint32) error {
	if d.f.streamWaitValue32 == 0 {
		return notExported("cuStreamWaitValue32", ErrNotSupported)
	}
	const waitValueGEQ = 0x0 // CU_STREAM_WAIT_VALUE_GEQ
	return d.call("cuStreamWaitValue32", d.f.streamWaitValue32, uintptr(s), uintptr(addr), uintptr(value), waitValueGEQ)
}

// StreamWriteValue32 queues on s a write of value to the 32-bit word at addr (device memory, or mapped pinned
// host memory), after everything queued before it and behind a memory barrier: once the word shows value, the
// writes of that earlier work are visible.
func (d *Driver) StreamWriteValue32(s Stream, addr uint64, value uint32) error {
	if d.f.streamWriteValue32 == 0 {
		return notExported("cuStreamWriteValue32", ErrNotSupported)
	}
	const writeValueDefault = 0x0 // CU_STREAM_WRITE_VALUE_DEFAULT: a memory barrier before the write
	return d.call("cuStreamWriteValue32", d.f.streamWriteValue32, uintptr(s), uintptr(addr), uintptr(value), writeValueDefault)
}

// EventCreate creates an event; timing events cost more to record.
func (d *Driver) EventCreate(timing bool) (Event, error) {
	var e Event
	flags := uintptr(eventDisableTiming)
	if timing {
		flags = eventDefault
	}
	err := d.call("cuEventCreate", d.f.eventCreate, uintptr(unsafe.Pointer(&e)), flags)
	return e, err
}

// EventDestroy destroys e.
func (d *Driver) EventDestroy(e Event) error {
	return d.call("cuEventDestroy", d.f.eventDestroy, uintptr(e))
}

// EventRecord records e on s.
func (d *Driver) EventRecord(e Event, s Stream) error {
	return d.call("cuEventRecord", d.f.eventRecord, uintptr(e), uintptr(s))
}

// EventSynchronize blocks until e completes.
func (d *Driver) EventSynchronize(e Event) error {
	return d.call("cuEventSynchronize", d.f.eventSynchronize, uintptr(e))
}

// EventQuery reports whether e has completed; a failed stream's error is returned.
func (d *Driver) EventQuery(e Event) (bool, error) {
	// Polled in tight loops: "not ready" is answered without building an error (and asking the driver its name).
	switch code := d.result(d.f.eventQuery, uintptr(e)); code {
	case Success:
		return true, nil
	case ErrNotReady:
		return false, nil
	default:
		return false, d.fail("cuEventQuery", code)
	}
}

// EventElapsed is the time between two recorded timing events, in milliseconds.
func (d *Driver) EventElapsed(start, end Event) (float32, error) {
	var ms float32
	err := d.call("cuEventElapsedTime", d.f.eventElapsedTime, uintptr(unsafe.Pointer(&ms)), uintptr(start), uintptr(end))
	return ms, err
}

// ModuleLoadData loads a cubin or PTX image into the current context.
func (d *Driver) ModuleLoadData(image []byte) (Module, error) {
	if len(image) == 0 {
		return 0, fmt.Errorf("cuModuleLoadData: empty image")
	}
	// PTX must be NUL-terminated; a cubin does not mind the extra byte.
	buf := make([]byte, len(image)+1)
	copy(buf, image)
	var m Module
	err := d.call("cuModuleLoadData", d.f.moduleLoadData, uintptr(unsafe.Pointer(&m)), uintptr(unsafe.Pointer(&buf[0])))
	return m, err
}

// ModuleUnload unloads m.
func (d *Driver) ModuleUnload(m Module) error {
	return d.call("cuModuleUnload", d.f.moduleUnload, uintptr(m))
}

// ModuleFunction looks up an extern "C" kernel in m.
func (d *Driver) ModuleFunction(m Module, name string) (Function, error) {
	cname := append([]byte(name), 0)
	var f Function
	err := d.call("cuModuleGetFunction "+name, d.f.moduleGetFunction, uintptr(unsafe.Pointer(&f)), uintptr(m), uintptr(unsafe.Pointer(&cname[0])))
	return f, err
}

// LaunchConfig is a kernel launch's shape.
type LaunchConfig struct {
	GridX, GridY, GridZ    uint32
	BlockX, BlockY, BlockZ uint32
	SharedMem              uint32
	Stream                 Stream
}

// Launch starts f; params points at each kernel argument's value (the driver
// copies them before returning).
func (d *Driver) Launch(f Function, cfg LaunchConfig, params []unsafe.Pointer) error {
	var pp uintptr
	if len(params) > 0 {
		pp = uintptr(unsafe.Pointer(&params[0]))
	}
	gy, gz, by, bz := max(cfg.GridY, 1), max(cfg.GridZ, 1), max(cfg.BlockY, 1), max(cfg.BlockZ, 1)
	return d.call("cuLaunchKernel", d.f.launchKernel, uintptr(f),
		uintptr(cfg.GridX), uintptr(gy), uintptr(gz), uintptr(cfg.BlockX), uintptr(by), uintptr(bz),
		uintptr(cfg.SharedMem), uintptr(cfg.Stream), pp, 0)
}

// PointerInfo is what the driver knows about an address.
type PointerInfo struct {
	Type       MemoryType
	Ordinal    int
	RangeStart uint64
	RangeSize  uint64
	Context    Context
}

// PointerGetInfo asks the driver about p; ErrInvalidValue means the driver does
// not know the address (plain pageable host memory).
func (d *Driver) PointerGetInfo(p uint64) (PointerInfo, error) {
	var info PointerInfo
	var mt uint32
	if err := d.call("cuPointerGetAttribute(MEMORY_TYPE)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&mt)), pointerAttributeMemoryType, uintptr(p)); err != nil {
		return info, err
	}
	info.Type = MemoryType(mt)
	var ord int32
	if err := d.call("cuPointerGetAttribute(DEVICE_ORDINAL)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&ord)), pointerAttributeDeviceOrdinal, uintptr(p)); err != nil {
		return info, err
	}
	info.Ordinal = int(ord)
	var start, size uint64
	if err := d.call("cuPointerGetAttribute(RANGE_START_ADDR)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&start)), pointerAttributeRangeStart, uintptr(p)); err != nil {
		return info, err
	}
	if err := d.call("cuPointerGetAttribute(RANGE_SIZE)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&size)), pointerAttributeRangeSize, uintptr(p)); err != nil {
		return info, err
	}
	info.RangeStart, info.RangeSize = start, size
	var ctx Context
	if err := d.call("cuPointerGetAttribute(CONTEXT)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&ctx)), pointerAttributeContext, uintptr(p)); err == nil {
		info.Context = ctx
	}
	return info, nil
}

// PointerHandleTypes is the shareable handle types the allocation behind p was
// created with (CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES); 0 for memory that
// cannot be exported through VMM (cuMemAlloc, host memory).
func (d *Driver) PointerHandleTypes(p uint64) (uint64, error) {
	var v uint64
	err := d.call("cuPointerGetAttribute(ALLOWED_HANDLE_TYPES)", d.f.pointerGetAttribute, uintptr(unsafe.Pointer(&v)), pointerAttributeHandleTypes, uintptr(p))
	return v, err
}
