// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// defaultRuntimeLibraries are tried, in order, when Load is given no paths:
// the unversioned name (ROCm's ld.so.conf entry or a -dev package), the
// sonames of ROCm 7, 6 and 5, and ROCm's default prefix.
var defaultRuntimeLibraries = []string{
	"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5",
	"/opt/rocm/lib/libamdhip64.so",
}

// symbol is an entry point resolved at load.
type symbol dynlib.Symbol

// Result is a hipError_t code (hip_runtime_api.h).
type Result int32

// Result codes the engines act on.
const (
	Success                  Result = 0   // hipSuccess
	ErrInvalidValue          Result = 1   // hipErrorInvalidValue
	ErrOutOfMemory           Result = 2   // hipErrorOutOfMemory
	ErrNotInitialized        Result = 3   // hipErrorNotInitialized
	ErrInsufficientDriver    Result = 35  // hipErrorInsufficientDriver
	ErrNoDevice              Result = 100 // hipErrorNoDevice
	ErrInvalidDevice         Result = 101 // hipErrorInvalidDevice
	ErrInvalidContext        Result = 201 // hipErrorInvalidContext
	ErrPeerAccessUnsupported Result = 217 // hipErrorPeerAccessUnsupported
	ErrInvalidHandle         Result = 400 // hipErrorInvalidHandle
	ErrNotFound              Result = 500 // hipErrorNotFound
	ErrNotReady              Result = 600 // hipErrorNotReady
	ErrIllegalAddress        Result = 700 // hipErrorIllegalAddress
	ErrPeerAccessAlreadyOn   Result = 704 // hipErrorPeerAccessAlreadyEnabled
	ErrPeerAccessNotEnabled  Result = 705 // hipErrorPeerAccessNotEnabled
	ErrLaunchFailure         Result = 719 // hipErrorLaunchFailure
	ErrNotSupported          Result = 801 // hipErrorNotSupported
	ErrUnknown               Result = 999 // hipErrorUnknown
	ErrSymbolNotFound        Result = -1  // ours: the library lacks the entry point
)

// Error is a failed HIP call: which call, its hipError_t and the runtime's name for it.
type Error struct {
	Op   string
	Code Result
	Name string
}

func (e *Error) Error() string {
	if e.Name == "" {
		return fmt.Sprintf("%s: hipError_t %d", e.Op, e.Code)
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Name)
}

// IsResult reports whether err (or an error it wraps) is a HIP error with code.
func IsResult(err error, code Result) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// Runtime is an opened libamdhip64 with its entry points resolved and hipInit done.
type Runtime struct {
	lib            uintptr
	path           string
	runtimeVersion int
	driverVersion  int
	f              runtimeFuncs
}

type runtimeFuncs struct {
	init, runtimeGetVersion, driverGetVersion, getErrorName                  uintptr
	getDeviceCount, deviceGet, deviceGetName, deviceGetAttribute             uintptr
	deviceGetPCIBusID, deviceTotalMem, deviceCanAccessPeer                   uintptr
	getDevice, setDevice, deviceSynchronize, deviceEnablePeerAccess          uintptr
	malloc, free, hostMalloc, hostFree, hostRegister, hostUnregister         uintptr
	memGetInfo, memset, memsetAsync                                          uintptr
	memcpy, memcpyAsync, memcpyPeer, memcpyPeerAsync                         uintptr
	streamCreateWithFlags, streamDestroy, streamSynchronize, streamQuery     uintptr
	streamWaitEvent                                                          uintptr
	eventCreateWithFlags, eventDestroy, eventRecord, eventSynchronize        uintptr
	eventQuery, eventElapsedTime                                             uintptr
	moduleLoadData, moduleUnload, moduleGetFunction, moduleLaunchKernel      uintptr
	ipcGetMemHandle, ipcOpenMemHandle, ipcCloseMemHandle, memGetAddressRange uintptr
	// VMM (ROCm 5.1+; the library may lack them).
	memGetAllocationGranularity, memCreate, memRelease, memExport, memImport uintptr
	memAddressReserve, memAddressFree, memMap, memUnmap, memSetAccess        uintptr
	memRetainAllocationHandle                                                uintptr
}

// Load opens the HIP runtime (the first of paths that opens, or the usual
// sonames), resolves the entry points and calls hipInit. The error starts
// with "HIP unavailable: " and says why, e.g. "HIP unavailable:
// libamdhip64.so: cannot open shared object file" on a node without ROCm, or
// the hipInit result on a node without an AMD GPU.
func Load(paths ...string) (*Runtime, error) {
	if len(paths) == 0 {
		paths = defaultRuntimeLibraries
	}
	lib, path, err := dynlib.OpenFirst(paths)
	if err != nil {
		return nil, fmt.Errorf("HIP unavailable: %w", err)
	}
	r := &Runtime{lib: lib, path: path}
	if err := r.resolve(); err != nil {
		return nil, fmt.Errorf("HIP unavailable: %s: %w", path, err)
	}
	var v int32
	if err := r.call("hipRuntimeGetVersion", r.f.runtimeGetVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return nil, fmt.Errorf("HIP unavailable: %s: %w", path, err)
	}
	r.runtimeVersion = int(v)
	if err := r.call("hipInit", r.f.init, 0); err != nil {
		return nil, fmt.Errorf("HIP unavailable: %s: %w", path, err)
	}
	if err := r.call("hipDriverGetVersion", r.f.driverGetVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return nil, fmt.Errorf("HIP unavailable: %s: %w", path, err)
	}
	r.driverVersion = int(v)
	return r, nil
}

func (r *Runtime) resolve() error {
	f := &r.f
	required := []symbol{
		{&f.init, "hipInit"}, {&f.runtimeGetVersion, "hipRuntimeGetVersion"},
		{&f.driverGetVersion, "hipDriverGetVersion"}, {&f.getErrorName, "hipGetErrorName"},
		{&f.getDeviceCount, "hipGetDeviceCount"}, {&f.deviceGet, "hipDeviceGet"},
		{&f.deviceGetName, "hipDeviceGetName"}, {&f.deviceGetAttribute, "hipDeviceGetAttribute"},
		{&f.deviceGetPCIBusID, "hipDeviceGetPCIBusId"}, {&f.deviceTotalMem, "hipDeviceTotalMem"},
		{&f.deviceCanAccessPeer, "hipDeviceCanAccessPeer"},
		{&f.getDevice, "hipGetDevice"}, {&f.setDevice, "hipSetDevice"},
		{&f.deviceSynchronize, "hipDeviceSynchronize"}, {&f.deviceEnablePeerAccess, "hipDeviceEnablePeerAccess"},
		{&f.malloc, "hipMalloc"}, {&f.free, "hipFree"},
		{&f.hostMalloc, "hipHostMalloc"}, {&f.hostFree, "hipHostFree"},
		{&f.hostRegister, "hipHostRegister"}, {&f.hostUnregister, "hipHostUnregister"},
		{&f.memGetInfo, "hipMemGetInfo"}, {&f.memset, "hipMemset"}, {&f.memsetAsync, "hipMemsetAsync"},
		{&f.memcpy, "hipMemcpy"}, {&f.memcpyAsync, "hipMemcpyAsync"},
		{&f.memcpyPeer, "hipMemcpyPeer"}, {&f.memcpyPeerAsync, "hipMemcpyPeerAsync"},
		{&f.streamCreateWithFlags, "hipStreamCreateWithFlags"}, {&f.streamDestroy, "hipStreamDestroy"},
		{&f.streamSynchronize, "hipStreamSynchronize"}, {&f.streamQuery, "hipStreamQuery"},
		{&f.streamWaitEvent, "hipStreamWaitEvent"},
		{&f.eventCreateWithFlags, "hipEventCreateWithFlags"}, {&f.eventDestroy, "hipEventDestroy"},
		{&f.eventRecord, "hipEventRecord"}, {&f.eventSynchronize, "hipEventSynchronize"},
		{&f.eventQuery, "hipEventQuery"}, {&f.eventElapsedTime, "hipEventElapsedTime"},
		{&f.moduleLoadData, "hipModuleLoadData"}, {&f.moduleUnload, "hipModuleUnload"},
		{&f.moduleGetFunction, "hipModuleGetFunction"}, {&f.moduleLaunchKernel, "hipModuleLaunchKernel"},
		{&f.ipcGetMemHandle, "hipIpcGetMemHandle"}, {&f.ipcOpenMemHandle, "hipIpcOpenMemHandle"},
		{&f.ipcCloseMemHandle, "hipIpcCloseMemHandle"}, {&f.memGetAddressRange, "hipMemGetAddressRange"},
	}
	if missing := dynlib.Resolve(r.lib, required); len(missing) > 0 {
		return fmt.Errorf("runtime lacks entry points %s", strings.Join(missing, ", "))
	}
	// The VMM subset is optional: without it, VMM calls fail with ErrSymbolNotFound.
	_ = dynlib.Resolve(r.lib, []symbol{
		{&f.memGetAllocationGranularity, "hipMemGetAllocationGranularity"},
		{&f.memCreate, "hipMemCreate"}, {&f.memRelease, "hipMemRelease"},
		{&f.memExport, "hipMemExportToShareableHandle"}, {&f.memImport, "hipMemImportFromShareableHandle"},
		{&f.memAddressReserve, "hipMemAddressReserve"}, {&f.memAddressFree, "hipMemAddressFree"},
		{&f.memMap, "hipMemMap"}, {&f.memUnmap, "hipMemUnmap"}, {&f.memSetAccess, "hipMemSetAccess"},
		{&f.memRetainAllocationHandle, "hipMemRetainAllocationHandle"},
	})
	return nil
}

// call invokes a runtime entry point and turns a non-zero hipError_t into *Error.
//
//go:uintptrescapes
func (r *Runtime) call(op string, fn uintptr, args ...uintptr) error {
	if fn == 0 {
		return &Error{Op: op, Code: ErrSymbolNotFound, Name: "not exported by " + r.path}
	}
	res, _, _ := purego.SyscallN(fn, args...)
	code := Result(int32(uint32(res)))
	if code == Success {
		return nil
	}
	return &Error{Op: op, Code: code, Name: r.errorName(code)}
}

func (r *Runtime) errorName(code Result) string {
	if r.f.getErrorName == 0 {
		return ""
	}
	// hipGetErrorName returns a static string, "hipErrorUnknown" for codes it does not know.
	p, _, _ := purego.SyscallN(r.f.getErrorName, uintptr(code))
	return dynlib.GoString(p)
}

// HostPointer turns an address the runtime returned (C memory, never the Go
// heap) into a pointer Go code can read and write.
func HostPointer(p uintptr) unsafe.Pointer {
	return dynlib.HostPointer(p)
}

// Path is the library that was opened.
func (r *Runtime) Path() string { return r.path }

// RuntimeVersion is HIP_VERSION of the runtime: major*10000000 + minor*100000 + patch.
func (r *Runtime) RuntimeVersion() int { return r.runtimeVersion }

// DriverVersion is what hipDriverGetVersion reports.
func (r *Runtime) DriverVersion() int { return r.driverVersion }

// HasVMM reports whether the runtime exports the virtual memory calls and
// lays out hipMemAllocationProp as this package does (HIP 6.0 and later;
// ROCm 5.2's header ordered the struct's fields differently).
func (r *Runtime) HasVMM() bool {
	return r.f.memCreate != 0 && r.f.memExport != 0 && r.f.memImport != 0 && r.runtimeVersion >= vmmMinVersion
}

// vmmMinVersion is the first HIP_VERSION whose hipMemAllocationProp has the
// layout of types.go (6.0.0).
const vmmMinVersion = 60000000

// WithDevice runs fn on a locked OS thread with dev current, then restores the
// thread's previous device: HIP's current device is per thread, and callers'
// state must survive the engines.
func (r *Runtime) WithDevice(dev Device, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prev, err := r.GetDevice()
	if err != nil {
		return err
	}
	if prev != dev {
		if err := r.SetDevice(dev); err != nil {
			return err
		}
		defer func() { _ = r.SetDevice(prev) }()
	}
	return fn()
}
