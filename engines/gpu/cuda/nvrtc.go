// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

var defaultNVRTCLibraries = []string{"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"}

// NVRTC is an opened NVRTC runtime compiler.
type NVRTC struct {
	lib          uintptr
	path         string
	major, minor int
	f            struct {
		version, getErrorString, create, destroy, compile uintptr
		logSize, log, cubinSize, cubin, ptxSize, ptx      uintptr
	}
}

// LoadNVRTC opens libnvrtc (the first of paths that opens, or the usual names).
func LoadNVRTC(paths ...string) (*NVRTC, error) {
	if len(paths) == 0 {
		paths = defaultNVRTCLibraries
	}
	lib, path, err := dynlib.OpenFirst(paths)
	if err != nil {
		return nil, fmt.Errorf("no NVRTC: %w", err)
	}
	n := &NVRTC{lib: lib, path: path}
	syms := []symbol{
		{&n.f.version, "nvrtcVersion"}, {&n.f.getErrorString, "nvrtcGetErrorString"},
		{&n.f.create, "nvrtcCreateProgram"}, {&n.f.destroy, "nvrtcDestroyProgram"},
		{&n.f.compile, "nvrtcCompileProgram"}, {&n.f.logSize, "nvrtcGetProgramLogSize"},
		{&n.f.log, "nvrtcGetProgramLog"}, {&n.f.cubinSize, "nvrtcGetCUBINSize"},
		{&n.f.cubin, "nvrtcGetCUBIN"}, {&n.f.ptxSize, "nvrtcGetPTXSize"}, {&n.f.ptx, "nvrtcGetPTX"},
	}
	if missing := dynlib.Resolve(lib, syms); len(missing) > 0 {
		return nil, fmt.Errorf("NVRTC %s lacks %s", path, strings.Join(missing, ", "))
	}
	var major, minor int32
	if err := n.call("nvrtcVersion", n.f.version, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor))); err != nil {
		return nil, err
	}
	n.major, n.minor = int(major), int(minor)
	return n, nil
}

// Path is the library that was opened.
func (n *NVRTC) Path() string { return n.path }

// Version is NVRTC's "major.minor".
func (n *NVRTC) Version() string { return fmt.Sprintf("%d.%d", n.major, n.minor) }

//go:uintptrescapes
func (n *NVRTC) call(op string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	code := int32(uint32(r))
	if code == 0 {
		return nil
	}
	msg := ""
	if p, _, _ := purego.SyscallN(n.f.getErrorString, uintptr(code)); p != 0 {
		msg = dynlib.GoString(p)
	}
	return fmt.Errorf("%s: %s (nvrtcResult %d)", op, msg, code)
}

// CompileOutput is a compiled program: a cubin when an sm_XX target was given,
// else PTX; Log is the compiler's log (warnings included).
type CompileOutput struct {
	Image []byte
	IsPTX bool
	Log   string
}

// Compile compiles CUDA C++ source with options (e.g. "--gpu-architecture=sm_90").
func (n *NVRTC) Compile(src, name string, options []string) (CompileOutput, error) {
	csrc := append([]byte(src), 0)
	cname := append([]byte(name), 0)
	var prog uintptr
	if err := n.call("nvrtcCreateProgram", n.f.create, uintptr(unsafe.Pointer(&prog)),
		uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0); err != nil {
		return CompileOutput{}, err
	}
	defer func() { _ = n.call("nvrtcDestroyProgram", n.f.destroy, uintptr(unsafe.Pointer(&prog))) }()

	// The option strings must stay put while NVRTC reads them: keep them in
	// one heap buffer and pass pointers into it.
	buf, ptrs, optsPtr := dynlib.Argv(options)
	compileErr := n.call("nvrtcCompileProgram", n.f.compile, prog, uintptr(len(options)), optsPtr)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(ptrs)
	out := CompileOutput{Log: n.programLog(prog)}
	if compileErr != nil {
		return out, fmt.Errorf("%w: %s", compileErr, strings.TrimSpace(out.Log))
	}
	cubin := false
	for _, o := range options {
		if strings.Contains(o, "sm_") {
			cubin = true
		}
	}
	sizeFn, getFn, what := n.f.ptxSize, n.f.ptx, "PTX"
	if cubin {
		sizeFn, getFn, what = n.f.cubinSize, n.f.cubin, "CUBIN"
	}
	var size uint64
	if err := n.call("nvrtcGet"+what+"Size", sizeFn, prog, uintptr(unsafe.Pointer(&size))); err != nil {
		return out, err
	}
	if size == 0 {
		return out, errors.New("nvrtc produced an empty " + what)
	}
	img := make([]byte, size)
	if err := n.call("nvrtcGet"+what, getFn, prog, uintptr(unsafe.Pointer(&img[0]))); err != nil {
		return out, err
	}
	if !cubin {
		img = []byte(strings.TrimRight(string(img), "\x00"))
	}
	out.Image, out.IsPTX = img, !cubin
	return out, nil
}

func (n *NVRTC) programLog(prog uintptr) string {
	var size uint64
	if err := n.call("nvrtcGetProgramLogSize", n.f.logSize, prog, uintptr(unsafe.Pointer(&size))); err != nil || size <= 1 {
		return ""
	}
	b := make([]byte, size)
	if err := n.call("nvrtcGetProgramLog", n.f.log, prog, uintptr(unsafe.Pointer(&b[0]))); err != nil {
		return ""
	}
	return dynlib.CString(b)
}
