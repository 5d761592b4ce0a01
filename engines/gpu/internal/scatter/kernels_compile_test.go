// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// clangCUDA finds a clang that compiles CUDA device code (Debian's clang-14 or later).
func clangCUDA() string {
	for _, name := range []string{"clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

var (
	ptxEntry = regexp.MustCompile(`(?s)\.visible \.entry (\w+)\((.*?)\)`)
	ptxParam = regexp.MustCompile(`\.param (.*?) \w+_param_\d+(\[\d+\])?`)
)

// TestCUDAKernelsCompileAndTakeTheLaunchArguments compiles copy.cu to PTX with clang's CUDA front end (no CUDA
// toolkit or GPU needed; testdata/clang_cuda_prelude.h stands in for what NVRTC provides) and checks every
// kernel the Go side launches takes as many arguments as Args lays out, the copy kernels their fx_signal last as
// a 24-byte, 8-aligned argument (Signal's layout): a kernel and its launch that disagree would read garbage on
// the GPU, where nothing in CI runs.
func TestCUDAKernelsCompileAndTakeTheLaunchArguments(t *testing.T) {
	clang := clangCUDA()
	if clang == "" {
		t.Skip("no clang to compile CUDA device code with: apt-get install clang (the GPU machine compiles with NVRTC)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "copy.cu")
	if err := os.WriteFile(src, []byte(kernels.CUDA), 0o644); err != nil {
		t.Fatal(err)
	}
	prelude, err := filepath.Abs(filepath.Join("testdata", "clang_cuda_prelude.h"))
	if err != nil {
		t.Fatal(err)
	}
	ptx := filepath.Join(dir, "copy.ptx")
	out, err := exec.Command(clang, "-x", "cuda", "--cuda-gpu-arch=sm_80", "--cuda-device-only", "-nocudainc",
		"-nocudalib", "-std=c++17", "-O2", "-include", prelude, "-S", "-o", ptx, src).CombinedOutput()
	if err != nil {
		t.Fatalf("copy.cu does not compile with %s: %v\n%s", clang, err, out)
	}
	text, err := os.ReadFile(ptx)
	if err != nil {
		t.Fatal(err)
	}
	params := map[string][]string{}
	for _, m := range ptxEntry.FindAllStringSubmatch(string(text), -1) {
		for _, p := range ptxParam.FindAllStringSubmatch(m[2], -1) {
			params[m[1]] = append(params[m[1]], strings.TrimSpace(p[1]+p[2]))
		}
	}
	l := Layout{Uniform: true, Flat16: true, Pieces: 10, PieceSize: 720, Unit: 720, SrcBits: 18, DstBits: 18}
	var a Args
	want := map[string]int{}
	for kind, name := range map[Kernel]string{KernelGeneral: kernels.ScatterGeneral, KernelUniform: kernels.ScatterUniform,
		KernelFlat16: kernels.ScatterFlat16, KernelPacked: kernels.ScatterPacked} {
		_, n := a.Signalled(kind, l, 0, 0, Signal{})
		want[name] = n
	}
	_, want[kernels.ContigCopy] = a.Contig(0, 0, 0, Signal{})
	want[kernels.BlocksCopy16] = 11 // engines/gpu/cudacopy/checked.go's launch of fx_blocks16
	for name, n := range want {
		got := params[name]
		if len(got) != n {
			t.Errorf("%s takes %d arguments %v; its launch passes %d", name, len(got), got, n)
			continue
		}
		if last := got[n-1]; last != ".align 8 .b8[24]" {
			t.Errorf("%s's last argument is %q, want the 24-byte fx_signal", name, last)
		}
	}
	if _, ok := params[kernels.BlocksCheck]; !ok {
		t.Errorf("no %s in the PTX (entries: %v)", kernels.BlocksCheck, params)
	}
}
