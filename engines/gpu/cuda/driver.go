// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// DefaultDriverLibraries are the sonames tried, in order, when Load is given none.
var defaultDriverLibraries = []string{"libcuda.so.1", "libcuda.so"}

// symbol is an entry point resolved at load.
type symbol dynlib.Symbol

// Result is a CUresult code.
type Result int32

// Result codes the engines act on.
const (
	Success                   Result = 0
	ErrInvalidValue           Result = 1
	ErrOutOfMemory            Result = 2
	ErrNotInitialized         Result = 3
	ErrNoDevice               Result = 100
	ErrInvalidDevice          Result = 101
	ErrInvalidHandle          Result = 400
	ErrNotFound               Result = 500
	ErrNotReady               Result = 600
	ErrPeerAccessUnsupported  Result = 217
	ErrPeerAccessAlreadyOn    Result = 704
	ErrPeerAccessNotEnabled   Result = 705
	ErrNotPermitted           Result = 800
	ErrNotSupported           Result = 801
	ErrIllegalAddress         Result = 700
	ErrLaunchFailed           Result = 719
	ErrUnknown                Result = 999
	ErrSymbolNotFoundInDriver Result = -1 // ours: the driver lacks the entry point
)

// Error is a failed driver call: which call, its CUresult and the driver's name for it.
type Error struct {
	Op   string
	Code Result
	Name string
}

func (e *Error) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("%s: CUresult %d", e.Op, e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Name)
}

// IsResult reports whether err (or an error it wraps) is a driver error with code.
func IsResult(err error, code Result) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Driver is an opened libcuda with its entry points resolved and cuInit done.
type Driver struct {
	lib     uintptr
	path    string
	version int
	f       driverFuncs
	// batchABI is 13 for cuMemcpyBatchAsync_v2 (no failIdx), 12 for the CUDA 12.8
	// signature, 0 when the driver has no batch copy.
	batchABI int
}

type driverFuncs struct {
	init, driverGetVersion, getErrorName                                     uintptr
	deviceGet, deviceGetCount, deviceGetName, deviceGetAttribute             uintptr
	deviceGetPCIBusID, deviceTotalMem, deviceCanAccessPeer                   uintptr
	primaryCtxRetain, primaryCtxRelease                                      uintptr
	ctxGetCurrent, ctxSetCurrent, ctxSynchronize, ctxEnablePeerAccess        uintptr
	ctxGetDevice                                                             uintptr
	memAlloc, memFree, memHostAlloc, memFreeHost, memHostRegister            uintptr
	memHostUnregister, memGetInfo, memsetD8, memsetD8Async                   uintptr
	memcpy, memcpyAsync, memcpyDtoD, memcpyDtoDAsync, memcpyHtoD, memcpyDtoH uintptr
	memcpyHtoDAsync, memcpyDtoHAsync, memcpyPeer, memcpyPeerAsync, batchCopy uintptr
	streamCreate, streamDestroy, streamSynchronize, streamQuery              uintptr
	streamWaitEvent                                                          uintptr
	eventCreate, eventDestroy, eventRecord, eventSynchronize, eventQuery     uintptr
	eventElapsedTime                                                         uintptr
	moduleLoadData, moduleUnload, moduleGetFunction, launchKernel            uintptr
	memGetAllocationGranularity, memCreate, memRelease, memExport, memImport uintptr
	memAddressReserve, memAddressFree, memMap, memUnmap, memSetAccess        uintptr
	memRetainAllocationHandle, memGetAllocationPropertiesFromHandle          uintptr
	ipcGetMemHandle, ipcOpenMemHandle, ipcCloseMemHandle                     uintptr
	pointerGetAttribute, memGetAddressRange, memGetHandleForAddressRange     uintptr
	streamWaitValue32                                                        uintptr
	streamWriteValue32                                                       uintptr
	// Graphs (optional): a captured copy replayed with one launch.
	streamBeginCapture, streamEndCapture, graphInstantiate, graphDestroy uintptr
	graphLaunch, graphExecDestroy                                        uintptr
}

// Load opens the CUDA driver library (the first of paths that opens, or the
// usual sonames), resolves the entry points and calls cuInit. The error says
// why the driver is unusable, e.g. "no CUDA driver: libcuda.so.1: cannot open
// shared object file".
func Load(paths ...string) (*Driver, error) {
	if len(paths) == 0 {
		paths = defaultDriverLibraries
	}
	lib, path, err := dynlib.OpenFirst(paths)
	if err != nil {
		return nil, fmt.Errorf("no CUDA driver: %w", err)
	}
	d := &Driver{lib: lib, path: path}
	if err := d.resolve(); err != nil {
		return nil, fmt.Errorf("CUDA driver %s: %w", path, err)
	}
	if err := d.call("cuInit", d.f.init, 0); err != nil {
		return nil, fmt.Errorf("CUDA driver %s: %w", path, err)
	}
	var v int32
	if err := d.call("cuDriverGetVersion", d.f.driverGetVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return nil, err
	}
	d.version = int(v)
	return d, nil
}

func (d *Driver) resolve() error {
	required := []symbol{
		{&d.f.init, "cuInit"}, {&d.f.driverGetVersion, "cuDriverGetVersion"},
		{&d.f.getErrorName, "cuGetErrorName"},
		{&d.f.deviceGet, "cuDeviceGet"}, {&d.f.deviceGetCount, "cuDeviceGetCount"},
		{&d.f.deviceGetName, "cuDeviceGetName"}, {&d.f.deviceGetAttribute, "cuDeviceGetAttribute"},
		{&d.f.deviceGetPCIBusID, "cuDeviceGetPCIBusId"}, {&d.f.deviceTotalMem, "cuDeviceTotalMem_v2"},
		{&d.f.deviceCanAccessPeer, "cuDeviceCanAccessPeer"},
		{&d.f.primaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&d.f.primaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.f.ctxGetCurrent, "cuCtxGetCurrent"}, {&d.f.ctxSetCurrent, "cuCtxSetCurrent"},
		{&d.f.ctxSynchronize, "cuCtxSynchronize"}, {&d.f.ctxEnablePeerAccess, "cuCtxEnablePeerAccess"},
		{&d.f.ctxGetDevice, "cuCtxGetDevice"},
		{&d.f.memAlloc, "cuMemAlloc_v2"}, {&d.f.memFree, "cuMemFree_v2"},
		{&d.f.memHostAlloc, "cuMemHostAlloc"}, {&d.f.memFreeHost, "cuMemFreeHost"},
		{&d.f.memHostRegister, "cuMemHostRegister_v2"}, {&d.f.memHostUnregister, "cuMemHostUnregister"},
		{&d.f.memGetInfo, "cuMemGetInfo_v2"},
		{&d.f.memsetD8, "cuMemsetD8_v2"}, {&d.f.memsetD8Async, "cuMemsetD8Async"},
		{&d.f.memcpy, "cuMemcpy"}, {&d.f.memcpyAsync, "cuMemcpyAsync"},
		{&d.f.memcpyDtoD, "cuMemcpyDtoD_v2"}, {&d.f.memcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
		{&d.f.memcpyHtoD, "cuMemcpyHtoD_v2"}, {&d.f.memcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.f.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"}, {&d.f.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{&d.f.memcpyPeer, "cuMemcpyPeer"}, {&d.f.memcpyPeerAsync, "cuMemcpyPeerAsync"},
		{&d.f.streamCreate, "cuStreamCreate"}, {&d.f.streamDestroy, "cuStreamDestroy_v2"},
		{&d.f.streamSynchronize, "cuStreamSynchronize"}, {&d.f.streamQuery, "cuStreamQuery"},
		{&d.f.streamWaitEvent, "cuStreamWaitEvent"},
		{&d.f.eventCreate, "cuEventCreate"}, {&d.f.eventDestroy, "cuEventDestroy_v2"},
		{&d.f.eventRecord, "cuEventRecord"}, {&d.f.eventSynchronize, "cuEventSynchronize"},
		{&d.f.eventQuery, "cuEventQuery"}, {&d.f.eventElapsedTime, "cuEventElapsedTime"},
		{&d.f.moduleLoadData, "cuModuleLoadData"}, {&d.f.moduleUnload, "cuModuleUnload"},
		{&d.f.moduleGetFunction, "cuModuleGetFunction"}, {&d.f.launchKernel, "cuLaunchKernel"},
		{&d.f.memGetAllocationGranularity, "cuMemGetAllocationGranularity"},
		{&d.f.memCreate, "cuMemCreate"}, {&d.f.memRelease, "cuMemRelease"},
		{&d.f.memExport, "cuMemExportToShareableHandle"},
		{&d.f.memImport, "cuMemImportFromShareableHandle"},
		{&d.f.memAddressReserve, "cuMemAddressReserve"}, {&d.f.memAddressFree, "cuMemAddressFree"},
		{&d.f.memMap, "cuMemMap"}, {&d.f.memUnmap, "cuMemUnmap"}, {&d.f.memSetAccess, "cuMemSetAccess"},
		{&d.f.memRetainAllocationHandle, "cuMemRetainAllocationHandle"},
		{&d.f.memGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle"},
		{&d.f.ipcGetMemHandle, "cuIpcGetMemHandle"}, {&d.f.ipcOpenMemHandle, "cuIpcOpenMemHandle_v2"},
		{&d.f.ipcCloseMemHandle, "cuIpcCloseMemHandle"},
		{&d.f.pointerGetAttribute, "cuPointerGetAttribute"},
		{&d.f.memGetAddressRange, "cuMemGetAddressRange_v2"},
	}
	if missing := dynlib.Resolve(d.lib, required); len(missing) > 0 {
		return fmt.Errorf("driver lacks entry points %s", strings.Join(missing, ", "))
	}
	// dma-buf export (CUDA 11.7+) is optional: without it GPUDirect RDMA uses peer memory.
	if p, err := purego.Dlsym(d.lib, "cuMemGetHandleForAddressRange"); err == nil {
		d.f.memGetHandleForAddressRange = p
	}
	// Stream memory operations are optional (CUDA 12 exports the current ABI as _v2).
	for _, name := range []string{"cuStreamWaitValue32_v2", "cuStreamWaitValue32"} {
		if p, err := purego.Dlsym(d.lib, name); err == nil && p != 0 {
			d.f.streamWaitValue32 = p
			break
		}
	}
	for _, name := range []string{"cuStreamWriteValue32_v2", "cuStreamWriteValue32"} {
		if p, err := purego.Dlsym(d.lib, name); err == nil && p != 0 {
			d.f.streamWriteValue32 = p
			break
		}
	}
	graphs := []symbol{{&d.f.streamBeginCapture, "cuStreamBeginCapture_v2"}, {&d.f.streamEndCapture, "cuStreamEndCapture"},
		{&d.f.graphInstantiate, "cuGraphInstantiateWithFlags"}, {&d.f.graphDestroy, "cuGraphDestroy"},
		{&d.f.graphLaunch, "cuGraphLaunch"}, {&d.f.graphExecDestroy, "cuGraphExecDestroy"}}
	if missing := dynlib.Resolve(d.lib, graphs); len(missing) > 0 {
		d.f.graphLaunch = 0 // HasGraphs: all or none
	}
	// The batch copy API is optional: CUDA 13 exports it as _v2 without failIdx.
	if p, err := purego.Dlsym(d.lib, "cuMemcpyBatchAsync_v2"); err == nil && p != 0 {
		d.f.batchCopy, d.batchABI = p, 13
	} else if p, err := purego.Dlsym(d.lib, "cuMemcpyBatchAsync"); err == nil && p != 0 {
		d.f.batchCopy, d.batchABI = p, 12
	}
	return nil
}

// call invokes a driver entry point and turns a non-zero CUresult into *Error.
//
//go:uintptrescapes
func (d *Driver) call(op string, fn uintptr, args ...uintptr) error {
	if code := d.result(fn, args...); code != Success {
		return d.fail(op, code)
	}
	return nil
}

// result calls fn and returns its CUresult.
func (d *Driver) result(fn uintptr, args ...uintptr) Result {
	r, _, _ := purego.SyscallN(fn, args...)
	return Result(int32(uint32(r)))
}

// notExported is the error of an optional entry point op that this driver lacks.
func notExported(op string, code Result) *Error {
	return &Error{Op: op, Code: code, Name: "not exported by this driver"}
}

// fail is the error of op ending with code.
func (d *Driver) fail(op string, code Result) error {
	return &Error{Op: op, Code: code, Name: d.errorName(code)}
}

func (d *Driver) errorName(code Result) string {
	var p uintptr
	r, _, _ := purego.SyscallN(d.f.getErrorName, uintptr(code), uintptr(unsafe.Pointer(&p)))
	if uint32(r) != 0 || p == 0 {
		return ""
	}
	return dynlib.GoString(p)
}

// HostPointer turns an address the driver returned (C memory, never the Go
// heap) into a pointer Go code can read and write.
func HostPointer(p uintptr) unsafe.Pointer {
	return dynlib.HostPointer(p)
}

// Path is the library that was opened.
func (d *Driver) Path() string { return d.path }

// Version is the driver's CUDA version (e.g. 13000 for 13.0).
func (d *Driver) Version() int { return d.version }

// HasBatchCopy reports whether the driver exports cuMemcpyBatchAsync.
func (d *Driver) HasBatchCopy() bool { return d.batchABI != 0 }

// WithContext runs fn on a locked OS thread with ctx current, then restores
// whatever context the thread had before; the CUDA current context is per
// thread, and callers' state must survive the engines.
func (d *Driver) WithContext(ctx Context, fn func() error) error { return d.withContext(ctx, true, fn) }

// WithContextKept is WithContext for the copy path's calls, made many times a transfer: a thread that had no
// context keeps ctx current afterwards, so the next call on it (a poll loop's) makes no context switch. A
// context the thread had is put back, as WithContext does.
func (d *Driver) WithContextKept(ctx Context, fn func() error) error {
	return d.withContext(ctx, false, fn)
}

// withContext runs fn with ctx current on a locked thread; restoreNone also puts back "no context".
func (d *Driver) withContext(ctx Context, restoreNone bool, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := d.CtxGetCurrent()
	if err != nil {
		return err
	}
	if prev != ctx {
		if err := d.CtxSetCurrent(ctx); err != nil {
			return err
		}
		if prev != 0 || restoreNone {
			defer func() { _ = d.CtxSetCurrent(prev) }()
		}
	}
	return fn()
}
