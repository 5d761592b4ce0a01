// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import "unsafe"

// Handles are opaque runtime values; device pointers are addresses in the
// unified virtual address space HIP shares with the host.
type (
	// Device is a device ordinal (hipDevice_t is an int).
	Device int32
	// Stream is a hipStream_t; 0 is the null stream.
	Stream uintptr
	// Event is a hipEvent_t.
	Event uintptr
	// Module is a hipModule_t.
	Module uintptr
	// Function is a hipFunction_t.
	Function uintptr
	// DevicePtr is a device address (void* / hipDeviceptr_t).
	DevicePtr uint64
	// AllocHandle is a hipMemGenericAllocationHandle_t: a pointer to the
	// runtime's allocation object, 8 bytes.
	AllocHandle uintptr
)

// Device attributes used by the engines. hipDeviceAttribute_t in
// hip_runtime_api.h numbers its "CUDA compatible" block from 0 in declaration
// order (unlike CU_DEVICE_ATTRIBUTE_*, whose values differ); these are the
// positions in ROCm 5.x+ headers, and the AMD-specific block starts at 10000.
const (
	AttrComputeCapabilityMajor  = 23    // hipDeviceAttributeComputeCapabilityMajor
	AttrMaxThreadsPerBlock      = 56    // hipDeviceAttributeMaxThreadsPerBlock
	AttrComputeCapabilityMinor  = 61    // hipDeviceAttributeComputeCapabilityMinor
	AttrMultiprocessorCount     = 63    // hipDeviceAttributeMultiprocessorCount (compute units)
	AttrPCIBusID                = 67    // hipDeviceAttributePciBusId
	AttrPCIDeviceID             = 68    // hipDeviceAttributePciDeviceId
	AttrPCIDomainID             = 69    // hipDeviceAttributePciDomainID
	AttrWarpSize                = 87    // hipDeviceAttributeWarpSize (64 on CDNA)
	AttrVirtualMemoryManagement = 89    // hipDeviceAttributeVirtualMemoryManagementSupported
	AttrIsLargeBar              = 10011 // hipDeviceAttributeIsLargeBar (hipDeviceAttributeAmdSpecificBegin + 11)
)

// Memory handle types (hipMemAllocationHandleType), a bit set.
const (
	HandleTypeNone    = 0x0 // hipMemHandleTypeNone
	HandleTypePosixFD = 0x1 // hipMemHandleTypePosixFileDescriptor
)

// Enum values from hip_runtime_api.h / driver_types.h.
const (
	memAllocationTypePinned    = 0x1 // hipMemAllocationTypePinned
	memLocationTypeDevice      = 0x1 // hipMemLocationTypeDevice
	memAccessFlagsReadWrite    = 0x3 // hipMemAccessFlagsProtReadWrite
	memAllocGranularityMinimum = 0x0 // hipMemAllocationGranularityMinimum
	memcpyDefault              = 4   // hipMemcpyDefault: direction inferred from the addresses (UVA)
	ipcMemLazyEnablePeerAccess = 0x1 // hipIpcMemLazyEnablePeerAccess
	streamNonBlocking          = 0x1 // hipStreamNonBlocking
	eventDefault               = 0x0 // hipEventDefault
	eventDisableTiming         = 0x2 // hipEventDisableTiming
	hostMallocPortable         = 0x1 // hipHostMallocPortable
	hostMallocMapped           = 0x2 // hipHostMallocMapped
	hostRegisterPortable       = 0x1 // hipHostRegisterPortable
	hostRegisterMapped         = 0x2 // hipHostRegisterMapped
)

// memLocation mirrors hipMemLocation {hipMemLocationType type; int id;}.
type memLocation struct {
	Type int32
	ID   int32
}

// memAllocationProp mirrors hipMemAllocationProp (hip_runtime_api.h):
//
//	hipMemAllocationType type;                 // offset 0
//	hipMemAllocationHandleType requestedHandleType; // 4 (a union with requestedHandleTypes in newer headers)
//	hipMemLocation location;                   // 8
//	void* win32HandleMetaData;                 // 16
//	struct { unsigned char compressionType; unsigned char gpuDirectRDMACapable;
//	         unsigned short usage; } allocFlags; // 24
//
// 28 bytes of fields padded to 32 by the pointer's alignment; the tail is
// spelled out so the runtime never reads uninitialised bytes.
type memAllocationProp struct {
	Type                 int32
	RequestedHandleTypes int32
	Location             memLocation
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	pad                  [4]uint8
}

// memAccessDesc mirrors hipMemAccessDesc {hipMemLocation location; hipMemAccessFlags flags;}.
type memAccessDesc struct {
	Location memLocation
	Flags    int32
}

// IPCMemHandle is hipIpcMemHandle_t: char reserved[HIP_IPC_HANDLE_SIZE], HIP_IPC_HANDLE_SIZE = 64.
type IPCMemHandle [64]byte

// Layout facts the tests assert against the header values.
const (
	sizeofMemLocation       = 8
	sizeofMemAllocationProp = 32
	sizeofMemAccessDesc     = 12
	sizeofIPCMemHandle      = 64
)

// Compile-time layout checks against the C structs.
var (
	_ [sizeofMemAllocationProp - unsafe.Sizeof(memAllocationProp{})]struct{}
	_ [unsafe.Sizeof(memAllocationProp{}) - sizeofMemAllocationProp]struct{}
	_ [sizeofMemAccessDesc - unsafe.Sizeof(memAccessDesc{})]struct{}
	_ [unsafe.Sizeof(memAccessDesc{}) - sizeofMemAccessDesc]struct{}
	_ [sizeofIPCMemHandle - unsafe.Sizeof(IPCMemHandle{})]struct{}
)
