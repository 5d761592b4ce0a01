// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

//go:build !amd64 && !arm64

package hip

import "unsafe"

// ipcOpenArgs passes the 64-byte handle as a pointer to a caller-owned copy,
// as the ABIs of the other 64-bit targets do for large structs.
func ipcOpenArgs(p *DevicePtr, h *IPCMemHandle, flags uintptr) []uintptr {
	return []uintptr{uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&h[0])), flags}
}
