// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dynlib

import (
	"strings"
	"testing"
	"unsafe"
)

func TestCStrings(t *testing.T) {
	if got := CString([]byte("gfx942\x00junk")); got != "gfx942" {
		t.Errorf("CString stops at the first NUL: %q", got)
	}
	if got := CString([]byte("no terminator")); got != "no terminator" {
		t.Errorf("CString without a NUL: %q", got)
	}
	b := []byte("cuInit\x00")
	if got := GoString(uintptr(unsafe.Pointer(&b[0]))); got != "cuInit" {
		t.Errorf("GoString = %q", got)
	}
	if GoString(0) != "" {
		t.Error("GoString of a null pointer must be empty")
	}
	long := []byte(strings.Repeat("x", 5000))
	if got := GoString(uintptr(unsafe.Pointer(&long[0]))); len(got) != 4096 {
		t.Errorf("an unterminated string is cut at 4096 bytes, got %d", len(got))
	}
}

func TestArgvLaysOutCStrings(t *testing.T) {
	buf, ptrs, argv := Argv([]string{"-O3", "--offload-arch=gfx942"})
	if string(buf) != "-O3\x00--offload-arch=gfx942\x00" || len(ptrs) != 2 || argv != uintptr(unsafe.Pointer(&ptrs[0])) {
		t.Fatalf("buf %q ptrs %v argv %#x", buf, ptrs, argv)
	}
	if GoString(ptrs[1]) != "--offload-arch=gfx942" {
		t.Errorf("second pointer reads %q", GoString(ptrs[1]))
	}
	if _, _, argv := Argv(nil); argv != 0 {
		t.Errorf("no options must pass a null array, got %#x", argv)
	}
}

func TestRoundUp(t *testing.T) {
	for _, c := range []struct{ size, g, want uint64 }{{1, 2 << 20, 2 << 20}, {2 << 20, 2 << 20, 2 << 20}, {5, 0, 5}, {0, 4096, 0}} {
		if got := RoundUp(c.size, c.g); got != c.want {
			t.Errorf("RoundUp(%d, %d) = %d, want %d", c.size, c.g, got, c.want)
		}
	}
}

func TestOpenFirstSaysWhyEachFailed(t *testing.T) {
	_, _, err := OpenFirst([]string{"/nonexistent/liba.so", "/nonexistent/libb.so"})
	if err == nil || !strings.Contains(err.Error(), "liba.so") || !strings.Contains(err.Error(), "libb.so") {
		t.Fatalf("OpenFirst of missing libraries: %v", err)
	}
}
