// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"bytes"
	"debug/elf"
	"os"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// TestKernelLoaderCompilesForGfx90a compiles copy.hip through the loader's
// own path (options, cache) for an MI210/MI250X target: no GPU is needed,
// only hipRTC. The second load must come from the cache, byte for byte.
func TestKernelLoaderCompilesForGfx90a(t *testing.T) {
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.Skipf("hipRTC absent (Debian 12: apt-get install libamdhip64-5 libhiprtc-builtins5): %v", err)
	}
	const arch = "gfx90a"
	if !rtc.KnowsTarget(arch) {
		known, _ := rtc.Targets()
		t.Skipf("hipRTC %s at %s does not know %s (knows %v)", rtc.Version(), rtc.Path(), arch, known)
	}
	dir := t.TempDir()
	const version = 50200000 // any runtime version: it only keys the cache
	img, err := CompileImage(rtc, arch, version, dir)
	if err != nil {
		t.Fatalf("compiling copy.hip for %s: %v", arch, err)
	}
	if img.Origin != "hiprtc" || img.Arch != arch || img.CachePath == "" {
		t.Fatalf("image %q from %q, cached at %q", img.Arch, img.Origin, img.CachePath)
	}
	f, err := elf.NewFile(bytes.NewReader(img.Code))
	if err != nil {
		t.Fatalf("code object is not ELF: %v", err)
	}
	if f.Machine != 224 { // EM_AMDGPU
		t.Fatalf("code object machine %v, want EM_AMDGPU", f.Machine)
	}
	syms, err := f.DynamicSymbols()
	if err != nil || len(syms) == 0 {
		syms, _ = f.Symbols()
	}
	have := map[string]bool{}
	for _, s := range syms {
		have[s.Name] = true
	}
	for _, k := range []string{kernels.ContigCopy, kernels.ScatterGeneral, kernels.ScatterUniform, kernels.ScatterFlat16} {
		if !have[k+".kd"] {
			t.Errorf("code object lacks the kernel descriptor of %s", k)
		}
	}
	onDisk, err := os.ReadFile(img.CachePath)
	if err != nil || !bytes.Equal(onDisk, img.Code) {
		t.Fatalf("cache file %s does not hold the code object (%v)", img.CachePath, err)
	}
	again, err := CompileImage(rtc, arch, version, dir)
	if err != nil || again.Origin != "cache" || !bytes.Equal(again.Code, img.Code) {
		t.Fatalf("second load: origin %q, same bytes %t, %v", again.Origin, bytes.Equal(again.Code, img.Code), err)
	}
	t.Logf("hipRTC %s (%s): %d-byte code object for %s", rtc.Version(), rtc.Path(), len(img.Code), arch)
}
