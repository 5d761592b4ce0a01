// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hip

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/dynlib"
)

// defaultRTCLibraries are tried, in order, when LoadRTC is given no paths.
// ROCm 5.3 and later ship hipRTC as libhiprtc; ROCm 5.2 and earlier (and
// Debian 12's packages, which are 5.2) export it from libamdhip64 itself.
var defaultRTCLibraries = []string{
	"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5",
	"/opt/rocm/lib/libhiprtc.so",
	"libamdhip64.so", "libamdhip64.so.5",
}

// defaultComgrLibraries hold the code object manager hipRTC compiles with;
// it lists the targets the compiler knows.
var defaultComgrLibraries = []string{
	"libamd_comgr.so", "libamd_comgr.so.3", "libamd_comgr.so.2", "/opt/rocm/lib/libamd_comgr.so",
}

// RTC is an opened hipRTC runtime compiler. Compiling needs no GPU: the
// target comes from --offload-arch.
type RTC struct {
	lib          uintptr
	path         string
	major, minor int
	// targets are the gfx names comgr knows (nil when comgr could not be asked).
	targets   map[string]bool
	targetErr error
	f         struct {
		version, getErrorString, create, destroy, compile uintptr
		logSize, log, codeSize, code                      uintptr
	}
}

// LoadRTC opens hipRTC: the first of paths (or the usual names) that opens
// and exports the hipRTC entry points. The error starts with "hipRTC
// unavailable: " and says why for each library tried.
func LoadRTC(paths ...string) (*RTC, error) {
	if len(paths) == 0 {
		paths = defaultRTCLibraries
	}
	var errs []string
	for _, p := range paths {
		lib, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		n := &RTC{lib: lib, path: p}
		missing := dynlib.Resolve(lib, []symbol{
			{&n.f.version, "hiprtcVersion"}, {&n.f.getErrorString, "hiprtcGetErrorString"},
			{&n.f.create, "hiprtcCreateProgram"}, {&n.f.destroy, "hiprtcDestroyProgram"},
			{&n.f.compile, "hiprtcCompileProgram"}, {&n.f.logSize, "hiprtcGetProgramLogSize"},
			{&n.f.log, "hiprtcGetProgramLog"}, {&n.f.codeSize, "hiprtcGetCodeSize"},
			{&n.f.code, "hiprtcGetCode"},
		})
		if len(missing) > 0 {
			// A ROCm 5.3+ libamdhip64 opens but has no hipRTC; keep looking.
			errs = append(errs, fmt.Sprintf("%s lacks %s", p, strings.Join(missing, ", ")))
			continue
		}
		var major, minor int32
		if err := n.call("hiprtcVersion", n.f.version, uintptr(unsafe.Pointer(&major)), uintptr(unsafe.Pointer(&minor))); err != nil {
			return nil, fmt.Errorf("hipRTC unavailable: %s: %w", p, err)
		}
		n.major, n.minor = int(major), int(minor)
		n.targets, n.targetErr = comgrTargets(defaultComgrLibraries)
		return n, nil
	}
	return nil, fmt.Errorf("hipRTC unavailable: %s", strings.Join(errs, "; "))
}

// Path is the library that was opened.
func (n *RTC) Path() string { return n.path }

// Version is hipRTC's "major.minor".
func (n *RTC) Version() string { return fmt.Sprintf("%d.%d", n.major, n.minor) }

// RTCError is a failed hipRTC call: which call, its hiprtcResult and hipRTC's text for it.
type RTCError struct {
	Op   string
	Code int32
	Msg  string
}

func (e *RTCError) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("%s: hiprtcResult %d", e.Op, e.Code)
	}
	return fmt.Sprintf("%s: %s (hiprtcResult %d)", e.Op, e.Msg, e.Code)
}

// RTCCompilationFailed is HIPRTC_ERROR_COMPILATION (hiprtc.h): the source did not compile.
const RTCCompilationFailed = 6

//go:uintptrescapes
func (n *RTC) call(op string, fn uintptr, args ...uintptr) error {
	r, _, _ := purego.SyscallN(fn, args...)
	code := int32(uint32(r))
	if code == 0 {
		return nil
	}
	msg := ""
	if p, _, _ := purego.SyscallN(n.f.getErrorString, uintptr(code)); p != 0 {
		msg = dynlib.GoString(p)
	}
	return &RTCError{Op: op, Code: code, Msg: msg}
}

// CompileOutput is a compiled program: an AMDGPU code object (ELF) that
// hipModuleLoadData accepts, and the compiler's log (warnings included).
type CompileOutput struct {
	Code []byte
	Log  string
}

// ArchOption is the option that picks the target GPU, e.g. ArchOption("gfx942").
// Without it hipRTC compiles for the current device, which needs a GPU.
func ArchOption(arch string) string { return "--offload-arch=" + arch }

// Targets lists the gfx targets this hipRTC's compiler knows (e.g. "gfx90a"),
// sorted, or why they could not be listed.
func (n *RTC) Targets() ([]string, error) {
	if n.targetErr != nil {
		return nil, n.targetErr
	}
	out := make([]string, 0, len(n.targets))
	for t := range n.targets {
		out = append(out, t)
	}
	slices.Sort(out)
	return out, nil
}

// KnowsTarget reports whether the compiler knows arch ("gfx942", or with
// target features, "gfx942:sramecc+:xnack-"); true when the list is unknown.
func (n *RTC) KnowsTarget(arch string) bool {
	if n.targets == nil {
		return true
	}
	base, _, _ := strings.Cut(arch, ":")
	return n.targets[base]
}

// ErrUnknownTarget is returned (wrapped) by Compile for an --offload-arch
// the compiler does not know. Checked before compiling, because hipRTC of
// ROCm 5.2 aborts the whole process on an unknown target.
var ErrUnknownTarget = errors.New("hipRTC does not know the target")

// Compile compiles HIP C++ source with options (e.g. ArchOption("gfx942"), "-O3").
// A compile error carries the log.
func (n *RTC) Compile(src, name string, options []string) (CompileOutput, error) {
	for _, o := range options {
		for _, prefix := range []string{"--offload-arch=", "--gpu-architecture="} {
			if arch, ok := strings.CutPrefix(o, prefix); ok && !n.KnowsTarget(arch) {
				known, _ := n.Targets()
				return CompileOutput{}, fmt.Errorf("%w %s (hipRTC %s at %s knows %s)", ErrUnknownTarget, arch, n.Version(), n.path, strings.Join(known, " "))
			}
		}
	}
	csrc := append([]byte(src), 0)
	cname := append([]byte(name), 0)
	prog := new(uintptr)
	if err := n.call("hiprtcCreateProgram", n.f.create, uintptr(unsafe.Pointer(prog)),
		uintptr(unsafe.Pointer(&csrc[0])), uintptr(unsafe.Pointer(&cname[0])), 0, 0, 0); err != nil {
		return CompileOutput{}, err
	}
	defer func() { _ = n.call("hiprtcDestroyProgram", n.f.destroy, uintptr(unsafe.Pointer(prog))) }()

	// The option strings must stay put while hipRTC reads them: keep them in
	// one heap buffer and pass pointers into it.
	buf, ptrs, optsPtr := dynlib.Argv(options)
	compileErr := n.call("hiprtcCompileProgram", n.f.compile, *prog, uintptr(len(options)), optsPtr)
	runtime.KeepAlive(buf)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(csrc)
	runtime.KeepAlive(cname)
	out := CompileOutput{Log: n.programLog(*prog)}
	if compileErr != nil {
		return out, fmt.Errorf("%w: %s", compileErr, strings.TrimSpace(out.Log))
	}
	var size uint64
	if err := n.call("hiprtcGetCodeSize", n.f.codeSize, *prog, uintptr(unsafe.Pointer(&size))); err != nil {
		return out, err
	}
	if size == 0 {
		return out, errors.New("hipRTC produced an empty code object")
	}
	code := make([]byte, size)
	if err := n.call("hiprtcGetCode", n.f.code, *prog, uintptr(unsafe.Pointer(&code[0]))); err != nil {
		return out, err
	}
	out.Code = code
	return out, nil
}

func (n *RTC) programLog(prog uintptr) string {
	var size uint64
	if err := n.call("hiprtcGetProgramLogSize", n.f.logSize, prog, uintptr(unsafe.Pointer(&size))); err != nil || size <= 1 {
		return ""
	}
	b := make([]byte, size)
	if err := n.call("hiprtcGetProgramLog", n.f.log, prog, uintptr(unsafe.Pointer(&b[0]))); err != nil {
		return ""
	}
	return dynlib.CString(b)
}

// comgrTargets asks the code object manager which ISAs it supports; names
// look like "amdgcn-amd-amdhsa--gfx942" (amd_comgr.h: amd_comgr_get_isa_count,
// amd_comgr_get_isa_name, both returning amd_comgr_status_t, 0 on success).
func comgrTargets(paths []string) (map[string]bool, error) {
	lib, path, err := dynlib.OpenFirst(paths)
	if err != nil {
		return nil, fmt.Errorf("cannot list hipRTC targets: %w", err)
	}
	var count, name uintptr
	if missing := dynlib.Resolve(lib, []symbol{{&count, "amd_comgr_get_isa_count"}, {&name, "amd_comgr_get_isa_name"}}); len(missing) > 0 {
		return nil, fmt.Errorf("cannot list hipRTC targets: %s lacks %s", path, strings.Join(missing, ", "))
	}
	var n uint64
	if st, _, _ := purego.SyscallN(count, uintptr(unsafe.Pointer(&n))); uint32(st) != 0 {
		return nil, fmt.Errorf("cannot list hipRTC targets: amd_comgr_get_isa_count: status %d", uint32(st))
	}
	targets := make(map[string]bool, n)
	for i := uint64(0); i < n; i++ {
		var p uintptr
		if st, _, _ := purego.SyscallN(name, uintptr(i), uintptr(unsafe.Pointer(&p))); uint32(st) != 0 {
			return nil, fmt.Errorf("cannot list hipRTC targets: amd_comgr_get_isa_name(%d): status %d", i, uint32(st))
		}
		isa := dynlib.GoString(p)
		if i := strings.LastIndex(isa, "--"); i >= 0 {
			isa = isa[i+2:]
		}
		isa, _, _ = strings.Cut(isa, ":") // newer comgr lists feature variants, e.g. gfx90a:xnack+
		if isa != "" {
			targets[isa] = true
		}
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("cannot list hipRTC targets: %s lists none", path)
	}
	return targets, nil
}
