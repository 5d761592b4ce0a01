// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

func TestLoadMissingLibrarySaysWhy(t *testing.T) {
	_, err := Load("/nonexistent/libamdhip64.so")
	if err == nil {
		t.Fatal("Load of a missing library succeeded")
	}
	if !strings.HasPrefix(err.Error(), "HIP unavailable: ") || !strings.Contains(err.Error(), "/nonexistent/libamdhip64.so") {
		t.Fatalf("error %q does not say HIP is unavailable and which library failed", err)
	}
}

func TestLoadRTCMissingLibrarySaysWhy(t *testing.T) {
	_, err := LoadRTC("/nonexistent/libhiprtc.so", "/nonexistent/libamdhip64.so")
	if err == nil {
		t.Fatal("LoadRTC of missing libraries succeeded")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "hipRTC unavailable: ") || !strings.Contains(msg, "/nonexistent/libhiprtc.so") || !strings.Contains(msg, "/nonexistent/libamdhip64.so") {
		t.Fatalf("error %q does not name every library tried", msg)
	}
}

func TestLoadRTCSkipsLibrariesWithoutHipRTC(t *testing.T) {
	// libc opens but exports no hiprtc* symbol: the reason must say what it lacks.
	_, err := LoadRTC("libc.so.6")
	if err == nil || !strings.Contains(err.Error(), "libc.so.6 lacks hiprtcVersion") {
		t.Fatalf("LoadRTC(libc) error = %v", err)
	}
}

func TestComgrTargetsMissingLibrarySaysWhy(t *testing.T) {
	_, err := comgrTargets([]string{"/nonexistent/libamd_comgr.so"})
	if err == nil || !strings.HasPrefix(err.Error(), "cannot list hipRTC targets: ") {
		t.Fatalf("comgrTargets error = %v", err)
	}
}

func TestErrorNamesTheCallAndResult(t *testing.T) {
	e := &Error{Op: "hipMemCreate", Code: ErrNotSupported, Name: "hipErrorNotSupported"}
	if e.Error() != "hipMemCreate: hipErrorNotSupported" {
		t.Fatalf("Error() = %q", e.Error())
	}
	wrapped := fmt.Errorf("allocating pool memory: %w", e)
	if !IsResult(wrapped, ErrNotSupported) || IsResult(wrapped, ErrInvalidValue) {
		t.Fatal("IsResult does not match on the code through wrapping")
	}
	bare := &Error{Op: "hipInit", Code: 42}
	if !strings.Contains(bare.Error(), "hipInit") || !strings.Contains(bare.Error(), "42") {
		t.Fatalf("unnamed result hides its call or code: %q", bare.Error())
	}
	rtc := &RTCError{Op: "hiprtcCompileProgram", Code: RTCCompilationFailed, Msg: "HIPRTC_ERROR_COMPILATION"}
	if rtc.Error() != "hiprtcCompileProgram: HIPRTC_ERROR_COMPILATION (hiprtcResult 6)" {
		t.Fatalf("RTCError.Error() = %q", rtc.Error())
	}
	var re *RTCError
	if !errors.As(fmt.Errorf("compiling: %w", rtc), &re) || re.Code != RTCCompilationFailed {
		t.Fatal("RTCError does not survive wrapping")
	}
}

func TestCallWithoutEntryPointSaysSo(t *testing.T) {
	r := &Runtime{path: "libamdhip64.so.5"}
	err := r.call("hipMemCreate", 0)
	if !IsResult(err, ErrSymbolNotFound) || !strings.Contains(err.Error(), "not exported by libamdhip64.so.5") {
		t.Fatalf("call of a missing entry point = %v", err)
	}
	// An old runtime (HIP 5.2) with the VMM symbols still refuses, naming the version.
	old := &Runtime{path: "libamdhip64.so.5", runtimeVersion: 50221153}
	old.f.memCreate, old.f.memExport, old.f.memImport = 1, 1, 1
	if old.HasVMM() {
		t.Fatal("HIP 5.2 claims the VMM layout of HIP 6")
	}
	if _, err := old.MemCreate(0, 2<<20, HandleTypePosixFD); !IsResult(err, ErrNotSupported) || !strings.Contains(err.Error(), "50221153") {
		t.Fatalf("MemCreate on HIP 5.2 = %v", err)
	}
}

// The values below are the header's: sizeof/offsetof of hipMemAllocationProp,
// hipMemLocation, hipMemAccessDesc and hipIpcMemHandle_t in
// include/hip/hip_runtime_api.h (ROCm 6+) on LP64.
func TestStructLayoutsMatchTheHeader(t *testing.T) {
	var p memAllocationProp
	var a memAccessDesc
	var l memLocation
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(hipMemLocation)", unsafe.Sizeof(l), 8},
		{"offsetof(hipMemLocation, type)", unsafe.Offsetof(l.Type), 0},
		{"offsetof(hipMemLocation, id)", unsafe.Offsetof(l.ID), 4},
		{"sizeof(hipMemAllocationProp)", unsafe.Sizeof(p), 32},
		{"offsetof(hipMemAllocationProp, type)", unsafe.Offsetof(p.Type), 0},
		{"offsetof(hipMemAllocationProp, requestedHandleType)", unsafe.Offsetof(p.RequestedHandleTypes), 4},
		{"offsetof(hipMemAllocationProp, location)", unsafe.Offsetof(p.Location), 8},
		{"offsetof(hipMemAllocationProp, win32HandleMetaData)", unsafe.Offsetof(p.Win32HandleMetaData), 16},
		{"offsetof(hipMemAllocationProp, allocFlags.compressionType)", unsafe.Offsetof(p.CompressionType), 24},
		{"offsetof(hipMemAllocationProp, allocFlags.gpuDirectRDMACapable)", unsafe.Offsetof(p.GPUDirectRDMACapable), 25},
		{"offsetof(hipMemAllocationProp, allocFlags.usage)", unsafe.Offsetof(p.Usage), 26},
		{"sizeof(hipMemAccessDesc)", unsafe.Sizeof(a), 12},
		{"offsetof(hipMemAccessDesc, location)", unsafe.Offsetof(a.Location), 0},
		{"offsetof(hipMemAccessDesc, flags)", unsafe.Offsetof(a.Flags), 8},
		{"sizeof(hipIpcMemHandle_t)", unsafe.Sizeof(IPCMemHandle{}), 64},
		{"sizeof(hipMemGenericAllocationHandle_t)", unsafe.Sizeof(AllocHandle(0)), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, header says %d", c.what, c.got, c.want)
		}
	}
}

// Enum values as hip_runtime_api.h defines them; a typo here would silently
// ask the runtime for the wrong thing.
func TestEnumValuesMatchTheHeader(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"hipDeviceAttributeComputeCapabilityMajor", AttrComputeCapabilityMajor, 23},
		{"hipDeviceAttributeMaxThreadsPerBlock", AttrMaxThreadsPerBlock, 56},
		{"hipDeviceAttributeComputeCapabilityMinor", AttrComputeCapabilityMinor, 61},
		{"hipDeviceAttributeMultiprocessorCount", AttrMultiprocessorCount, 63},
		{"hipDeviceAttributePciBusId", AttrPCIBusID, 67},
		{"hipDeviceAttributePciDeviceId", AttrPCIDeviceID, 68},
		{"hipDeviceAttributePciDomainID", AttrPCIDomainID, 69},
		{"hipDeviceAttributeWarpSize", AttrWarpSize, 87},
		{"hipDeviceAttributeVirtualMemoryManagementSupported", AttrVirtualMemoryManagement, 89},
		{"hipDeviceAttributeIsLargeBar", AttrIsLargeBar, 10011},
		{"hipMemHandleTypePosixFileDescriptor", HandleTypePosixFD, 1},
		{"hipMemAllocationTypePinned", memAllocationTypePinned, 1},
		{"hipMemLocationTypeDevice", memLocationTypeDevice, 1},
		{"hipMemAccessFlagsProtReadWrite", memAccessFlagsReadWrite, 3},
		{"hipMemcpyDefault", memcpyDefault, 4},
		{"hipStreamNonBlocking", streamNonBlocking, 1},
		{"hipEventDisableTiming", eventDisableTiming, 2},
		{"hipHostMallocMapped", hostMallocMapped, 2},
		{"hipErrorNotReady", int(ErrNotReady), 600},
		{"hipErrorPeerAccessAlreadyEnabled", int(ErrPeerAccessAlreadyOn), 704},
		{"hipErrorNotSupported", int(ErrNotSupported), 801},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, header says %d", c.name, c.got, c.want)
		}
	}
}

func TestIPCOpenArgsPassTheHandleByValue(t *testing.T) {
	var h IPCMemHandle
	for i := range h {
		h[i] = byte(i)
	}
	p := new(DevicePtr)
	args := ipcOpenArgs(p, &h, 1)
	switch runtime.GOARCH {
	case "amd64":
		// devPtr and flags in rdi/rsi, 4 unused registers, then the 64 bytes on the stack.
		if len(args) != 14 || args[0] != uintptr(unsafe.Pointer(p)) || args[1] != 1 {
			t.Fatalf("amd64 args = %x", args)
		}
		for i := 0; i < 8; i++ {
			want := *(*uintptr)(unsafe.Pointer(&h[i*8]))
			if args[6+i] != want {
				t.Fatalf("handle word %d = %x, want %x", i, args[6+i], want)
			}
		}
	default:
		if len(args) != 3 || args[1] != uintptr(unsafe.Pointer(&h[0])) || args[2] != 1 {
			t.Fatalf("%s args = %x", runtime.GOARCH, args)
		}
	}
}

func TestRoundUp(t *testing.T) {
	for _, c := range []struct{ size, g, want uint64 }{{1, 2 << 20, 2 << 20}, {2 << 20, 2 << 20, 2 << 20}, {3 << 20, 2 << 20, 4 << 20}, {5, 0, 5}} {
		if got := RoundUp(c.size, c.g); got != c.want {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", c.size, c.g, got, c.want)
		}
	}
}

func TestKnowsTargetIgnoresFeatures(t *testing.T) {
	n := &RTC{targets: map[string]bool{"gfx90a": true}}
	if !n.KnowsTarget("gfx90a") || !n.KnowsTarget("gfx90a:sramecc+:xnack-") || n.KnowsTarget("gfx942") {
		t.Fatal("KnowsTarget does not compare the base gfx name")
	}
	if _, err := n.Compile("", "x.hip", []string{ArchOption("gfx942")}); !errors.Is(err, ErrUnknownTarget) || !strings.Contains(err.Error(), "gfx90a") {
		t.Fatalf("Compile for an unknown target = %v, want ErrUnknownTarget listing the known ones", err)
	}
	unknown := &RTC{targetErr: errors.New("no comgr")}
	if !unknown.KnowsTarget("gfx942") {
		t.Fatal("without a target list every target must be tried")
	}
}
