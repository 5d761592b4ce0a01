// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
)

// fakeIPC maps every handle at ptr, an allocation of size bytes.
type fakeIPC struct {
	ptr, size      uint64
	sizeErr        error
	opened, closed int
}

func (f *fakeIPC) IPCOpenMemHandle([64]byte) (uint64, error) { f.opened++; return f.ptr, nil }
func (f *fakeIPC) IPCCloseMemHandle(uint64) error            { f.closed++; return nil }
func (f *fakeIPC) IPCAllocationSize(p uint64) (uint64, error) {
	return f.ptr + f.size - p, f.sizeErr
}

// TestOpenIPCKeepsRegionsInsideTheirAllocation: an IPC handle names a whole allocation and the caller says where
// its bytes lie in it. A region that runs past the allocation (by its length, its offset, or a sum that wraps) is
// refused as invalid and its mapping closed: the agent's copies would otherwise reach whatever it maps beyond,
// another caller's memory included. One that fits is mapped at its offset.
func TestOpenIPCKeepsRegionsInsideTheirAllocation(t *testing.T) {
	const ptr, size = 0x7f0000000000, 2 << 20
	for _, tc := range []struct {
		name        string
		offset, len uint64
		sizeErr     error
		wantRefusal string
	}{
		{name: "whole", offset: 0, len: size},
		{name: "tail", offset: size / 2, len: size / 2},
		{name: "one byte past", offset: size / 2, len: size/2 + 1, wantRefusal: "runs past the 2097152-byte allocation"},
		{name: "64 GiB of a 2 MiB allocation", offset: 0, len: 64 << 30, wantRefusal: "runs past"},
		{name: "offset past the end", offset: size + 4096, len: 1, wantRefusal: "runs past"},
		{name: "a sum that wraps", offset: 4096, len: math.MaxUint64 - 100, wantRefusal: "runs past"},
		{name: "size unknown", offset: 0, len: 4096, sizeErr: errors.New("CUDA_ERROR_INVALID_VALUE"), wantRefusal: "finding the size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newFake()
			ipc := &fakeIPC{ptr: ptr, size: size, sizeErr: tc.sizeErr}
			m := &Region{Ordinal: 0}
			d := &engines.MemoryDesc{ID: "n/1", Size: tc.len, Handles: engines.Handles{IPC: make([]byte, engines.IPCHandleSize), IPCOffset: tc.offset}}
			err := OpenIPC(r, ipc, m, d)
			if tc.wantRefusal == "" {
				if err != nil || m.Addr != ptr+tc.offset || ipc.closed != 0 {
					t.Fatalf("a region inside its allocation: %v, address %#x (want %#x), %d closes", err, m.Addr, ptr+tc.offset, ipc.closed)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantRefusal) {
				t.Fatalf("got %v, want a refusal saying %q", err, tc.wantRefusal)
			}
			if tc.sizeErr == nil && !errors.Is(err, engines.ErrInvalid) {
				t.Fatalf("%v is not engines.ErrInvalid (the caller's INVALID_ARGUMENT)", err)
			}
			if ipc.opened != 1 || ipc.closed != 1 || m.Release != nil {
				t.Fatalf("a refused handle: opened %d, closed %d, release set %v; want its mapping closed at once", ipc.opened, ipc.closed, m.Release != nil)
			}
		})
	}
}
