// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import "unsafe"

// ipcOpenArgs lays out hipIpcOpenMemHandle(void** devPtr, hipIpcMemHandle_t
// handle, unsigned int flags) for the System V ABI: the 64-byte handle is
// passed by value in memory, on the stack after the register arguments, and
// takes no register. devPtr and flags take rdi and rsi, the four other
// integer registers are padding, and the handle's eight words follow.
func ipcOpenArgs(p *DevicePtr, h *IPCMemHandle, flags uintptr) []uintptr {
	w := (*[8]uintptr)(unsafe.Pointer(&h[0]))
	return []uintptr{uintptr(unsafe.Pointer(p)), flags, 0, 0, 0, 0, w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]}
}
