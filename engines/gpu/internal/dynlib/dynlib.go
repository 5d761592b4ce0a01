// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package dynlib

import (
	"cmp"
	"errors"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// OpenFirst opens the first of paths that loads and returns its handle and path; the error lists why each
// one did not.
func OpenFirst(paths []string) (uintptr, string, error) {
	var errs []string
	for _, p := range paths {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, p, nil
		}
		// dlerror names the file most of the time, but not always (an empty message was seen for the first of
		// two missing files): the path is said whenever the message does not say it.
		msg := err.Error()
		if !strings.Contains(msg, p) {
			msg = p + ": " + cmp.Or(msg, "cannot be opened")
		}
		errs = append(errs, msg)
	}
	return 0, "", errors.New(strings.Join(errs, "; "))
}

// Symbol is an entry point to resolve: its address goes to *Dst. A binding declares its own type on it
// (`type symbol dynlib.Symbol`) so that its long tables of entry points stay plain {&dst, "name"} pairs.
type Symbol struct {
	Dst  *uintptr
	Name string
}

// Resolve fills every symbol's Dst and returns the names the library lacks (their Dst is left alone).
func Resolve[S ~struct {
	Dst  *uintptr
	Name string
}](lib uintptr, syms []S) []string {
	var missing []string
	for _, sym := range syms {
		s := Symbol(sym)
		p, err := purego.Dlsym(lib, s.Name)
		if err != nil || p == 0 {
			missing = append(missing, s.Name)
			continue
		}
		*s.Dst = p
	}
	return missing
}

// GoString copies a NUL-terminated C string (at most 4096 bytes).
func GoString(p uintptr) string {
	if p == 0 {
		return ""
	}
	base := HostPointer(p)
	for n := 0; n < 4096; n++ {
		if *(*byte)(unsafe.Add(base, n)) == 0 {
			return string(unsafe.Slice((*byte)(base), n))
		}
	}
	return string(unsafe.Slice((*byte)(base), 4096))
}

// CString is the text of b up to its first NUL (all of b when there is none): what a C call wrote into a Go
// buffer.
func CString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// HostPointer turns an address a C library returned (C memory, never the Go heap) into a pointer Go code can
// read and write.
func HostPointer(p uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

// Argv lays out strs as NUL-terminated C strings in one heap buffer and returns it with the address of an
// array of pointers into it (0 when strs is empty), for a C call taking (int n, const char** strs). The
// strings must stay put while the library reads them: keep buf and ptrs alive (runtime.KeepAlive) until the
// call returns.
func Argv(strs []string) (buf []byte, ptrs []uintptr, argv uintptr) {
	offs := make([]int, len(strs))
	for i, s := range strs {
		offs[i] = len(buf)
		buf = append(buf, s...)
		buf = append(buf, 0)
	}
	ptrs = make([]uintptr, len(strs))
	for i := range strs {
		ptrs[i] = uintptr(unsafe.Pointer(&buf[offs[i]]))
	}
	if len(ptrs) > 0 {
		argv = uintptr(unsafe.Pointer(&ptrs[0]))
	}
	return buf, ptrs, argv
}

// RoundUp rounds size up to a multiple of granularity g (g a power of two; 0 leaves size as it is).
func RoundUp(size, g uint64) uint64 {
	if g == 0 {
		return size
	}
	return (size + g - 1) &^ (g - 1)
}
