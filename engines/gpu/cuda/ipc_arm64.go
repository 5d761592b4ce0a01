// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import "unsafe"

// ipcOpenArgs lays out cuIpcOpenMemHandle's arguments for AAPCS64: a struct
// larger than 16 bytes is passed as a pointer to a caller-owned copy.
func ipcOpenArgs(p *DevicePtr, h *IPCMemHandle, flags uintptr) []uintptr {
	return []uintptr{uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&h[0])), flags}
}
