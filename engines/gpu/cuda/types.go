// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import "unsafe"

// Handles are opaque driver values; device pointers are 64-bit addresses in
// the unified virtual address space.
type (
	// Device is a CUdevice ordinal handle.
	Device int32
	// Context is a CUcontext.
	Context uintptr
	// Stream is a CUstream; 0 is the legacy default stream.
	Stream uintptr
	// Event is a CUevent.
	Event uintptr
	// Module is a CUmodule.
	Module uintptr
	// Function is a CUfunction.
	Function uintptr
	// DevicePtr is a CUdeviceptr.
	DevicePtr uint64
	// AllocHandle is a CUmemGenericAllocationHandle (a VMM physical allocation).
	AllocHandle uint64
)

// Device attributes used by the engines (values from cuda.h).
const (
	AttrMultiprocessorCount       = 16
	AttrPCIBusID                  = 33
	AttrPCIDeviceID               = 34
	AttrUnifiedAddressing         = 41
	AttrPCIDomainID               = 50
	AttrComputeCapabilityMajor    = 75
	AttrComputeCapabilityMinor    = 76
	AttrVirtualMemoryManagement   = 102
	AttrHandleTypePosixFD         = 103
	AttrGPUDirectRDMAWithVMM      = 110
	AttrGPUDirectRDMA             = 116
	AttrDmaBufSupported           = 124
	AttrIPCEventSupported         = 125
	AttrHandleTypeFabricSupported = 128
	AttrMPSEnabled                = 133 // contexts created on the device are shared through an MPS server
)

// Memory handle types (CUmemAllocationHandleType); a bit set.
const (
	HandleTypeNone    = 0x0
	HandleTypePosixFD = 0x1
	HandleTypeFabric  = 0x8
)

const (
	memAllocationTypePinned       = 0x1
	memLocationTypeDevice         = 0x1
	memAccessFlagsReadWrite       = 0x3
	memAllocGranularityMinimum    = 0x0
	memcpySrcAccessOrderStream    = 0x1
	ipcMemLazyEnablePeerAccess    = 0x1
	streamNonBlocking             = 0x1
	eventDefault                  = 0x0
	eventDisableTiming            = 0x2
	memHostAllocPortable          = 0x1
	memHostAllocDeviceMap         = 0x2
	memHostRegisterPortable       = 0x1
	memHostRegisterDeviceMap      = 0x2
	pointerAttributeContext       = 1
	pointerAttributeMemoryType    = 2
	pointerAttributeDeviceOrdinal = 9
	pointerAttributeRangeStart    = 11
	pointerAttributeRangeSize     = 12
	pointerAttributeHandleTypes   = 14
)

// MemoryType is what CU_POINTER_ATTRIBUTE_MEMORY_TYPE reports.
type MemoryType uint32

// Memory types of a pointer.
const (
	MemoryTypeHost    MemoryType = 1
	MemoryTypeDevice  MemoryType = 2
	MemoryTypeArray   MemoryType = 3
	MemoryTypeUnified MemoryType = 4
)

// memLocation mirrors CUmemLocation.
type memLocation struct {
	Type int32
	ID   int32
}

// memAllocationProp mirrors CUmemAllocationProp (32 bytes on 64-bit Linux).
type memAllocationProp struct {
	Type                 int32
	RequestedHandleTypes int32
	Location             memLocation
	Win32HandleMetaData  uintptr
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// memAccessDesc mirrors CUmemAccessDesc.
type memAccessDesc struct {
	Location memLocation
	Flags    int32
}

// memcpyAttributes mirrors CUmemcpyAttributes (CUDA 12.8+).
type memcpyAttributes struct {
	SrcAccessOrder int32
	SrcLocHint     memLocation
	DstLocHint     memLocation
	Flags          uint32
}

// IPCMemHandle is a legacy CUDA IPC memory handle (CUipcMemHandle).
type IPCMemHandle [64]byte

// FabricHandle is a VMM fabric shareable handle (CUmemFabricHandle).
type FabricHandle [64]byte

// Compile-time layout checks against the C structs.
var (
	_ [32 - unsafe.Sizeof(memAllocationProp{})]struct{}
	_ [unsafe.Sizeof(memAllocationProp{}) - 32]struct{}
	_ [12 - unsafe.Sizeof(memAccessDesc{})]struct{}
	_ [24 - unsafe.Sizeof(memcpyAttributes{})]struct{}
	_ [unsafe.Sizeof(memcpyAttributes{}) - 24]struct{}
)
