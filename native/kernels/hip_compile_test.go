// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package kernels_test

import (
	"bytes"
	"debug/elf"
	"errors"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// emAMDGPU is ELF e_machine EM_AMDGPU (224): what an AMDGPU code object says it runs on.
const emAMDGPU = 224

// TestHIPKernelsCompileWithHipRTC compiles copy.hip with hipRTC for the AMD
// GPUs the agent targets. No GPU is needed: --offload-arch names the target.
func TestHIPKernelsCompileWithHipRTC(t *testing.T) {
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.Skipf("libhiprtc not found: install ROCm's hipRTC (Debian 12: apt-get install libamdhip64-5 libhiprtc-builtins5): %v", err)
	}
	t.Logf("hipRTC %s from %s", rtc.Version(), rtc.Path())
	compiled := 0
	for _, arch := range []string{"gfx942", "gfx90a"} { // MI300X, MI210/MI250X
		t.Run(arch, func(t *testing.T) {
			if !rtc.KnowsTarget(arch) {
				known, _ := rtc.Targets()
				t.Skipf("this hipRTC (%s, %s) predates %s; it knows %s", rtc.Version(), rtc.Path(), arch, strings.Join(known, " "))
			}
			out, err := rtc.Compile(kernels.HIP, "copy.hip", []string{hip.ArchOption(arch), "-O3"})
			if err != nil {
				t.Fatalf("copy.hip does not compile for %s: %v", arch, err)
			}
			if strings.Contains(strings.ToLower(out.Log), "error") {
				t.Fatalf("compile log for %s reports errors:\n%s", arch, out.Log)
			}
			checkCodeObject(t, out.Code)
			compiled++
			t.Logf("%s: %d-byte code object", arch, len(out.Code))
		})
	}
	if compiled == 0 {
		t.Fatal("hipRTC is present but compiled copy.hip for none of the targets")
	}
}

// checkCodeObject asserts code is an AMDGPU ELF that defines every kernel
// entry point the engines look up (and its kernel descriptor, name.kd).
func checkCodeObject(t *testing.T, code []byte) {
	t.Helper()
	if len(code) == 0 {
		t.Fatal("empty code object")
	}
	f, err := elf.NewFile(bytes.NewReader(code))
	if err != nil {
		t.Fatalf("code object is not ELF: %v", err)
	}
	if f.Machine != emAMDGPU {
		t.Fatalf("code object machine = %v, want EM_AMDGPU", f.Machine)
	}
	syms, err := f.DynamicSymbols()
	if err != nil || len(syms) == 0 {
		if syms, err = f.Symbols(); err != nil {
			t.Fatalf("code object has no symbols: %v", err)
		}
	}
	have := map[string]bool{}
	for _, s := range syms {
		have[s.Name] = true
	}
	for _, k := range []string{kernels.ContigCopy, kernels.ScatterGeneral, kernels.ScatterUniform, kernels.ScatterFlat16} {
		if !have[k] || !have[k+".kd"] {
			t.Errorf("code object lacks kernel %s (symbols %v)", k, keys(have))
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestHIPCompileErrorCarriesTheLog checks that a source error comes back as
// an error with the compiler's log, not as an empty code object.
func TestHIPCompileErrorCarriesTheLog(t *testing.T) {
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.Skipf("libhiprtc not found: install ROCm's hipRTC (Debian 12: apt-get install libamdhip64-5 libhiprtc-builtins5): %v", err)
	}
	arch := "gfx90a"
	if !rtc.KnowsTarget(arch) {
		t.Skipf("this hipRTC does not know %s", arch)
	}
	src := `extern "C" __global__ void broken(int* p) { p[threadIdx.x] = undeclared_name; }`
	out, err := rtc.Compile(src, "broken.hip", []string{hip.ArchOption(arch)})
	var re *hip.RTCError
	if !errors.As(err, &re) || re.Code != hip.RTCCompilationFailed {
		t.Fatalf("Compile(broken) error = %v, want HIPRTC_ERROR_COMPILATION", err)
	}
	if len(out.Code) != 0 || !strings.Contains(err.Error(), "undeclared_name") {
		t.Fatalf("error %q does not carry the log naming the bad identifier", err)
	}
}
