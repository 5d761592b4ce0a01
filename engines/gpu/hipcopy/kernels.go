// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// Kernels are the copy kernels loaded onto one device.
type Kernels struct {
	module hip.Module
	copy   gpushare.CopyKernels[hip.Function]
	Image
}

// Image is the kernels' compiled code object and where it came from.
type Image struct {
	Code []byte
	// Origin is "hiprtc" (compiled now) or "cache".
	Origin string
	// Arch is the gfx target, e.g. "gfx942"; empty: hipRTC's current device.
	Arch string
	// CachePath is the on-disk code object, empty when there is none.
	CachePath string
}

// cacheKey names a code object: the source, the gfx target and the HIP
// runtime version decide whether a cached one is still good.
func cacheKey(arch string, runtimeVersion int) string {
	return fmt.Sprintf("fxcopy-%s-%s-hip%d.hsaco", kernels.Hash(kernels.HIP)[:16], arch, runtimeVersion)
}

// CompileImage returns the copy kernels' code object for arch: from cacheDir
// when one for this source, target and runtime is there, else compiled with
// rtc (nil: unavailable) and written to cacheDir (empty: no cache). No GPU is
// needed when arch is given; arch "" compiles for the current device and is
// never cached (the name would not say which target it holds).
func CompileImage(rtc *hip.RTC, arch string, runtimeVersion int, cacheDir string) (Image, error) {
	var path string
	if cacheDir != "" && arch != "" {
		path = filepath.Join(cacheDir, cacheKey(arch, runtimeVersion))
	}
	code, origin, cached, err := gpushare.CachedImage(path, "hiprtc", func() ([]byte, error) {
		if rtc == nil {
			return nil, errors.New("no compiled copy kernels: hipRTC is not available and no cached code object for " + archName(arch))
		}
		opts := []string{"-O3"}
		if arch != "" {
			opts = append(opts, hip.ArchOption(arch))
		}
		out, err := rtc.Compile(kernels.HIP, "fxcopy.hip", opts)
		if err != nil {
			return nil, fmt.Errorf("compiling the copy kernels for %s with hipRTC %s: %w", archName(arch), rtc.Version(), err)
		}
		return out.Code, nil
	})
	if err != nil {
		return Image{}, err
	}
	return Image{Code: code, Origin: origin, Arch: arch, CachePath: cached}, nil
}

func archName(arch string) string {
	if arch == "" {
		return "the current device"
	}
	return arch
}

// LoadKernels loads the copy kernels onto the current device (which must be
// the one arch describes), compiling them when the cache has none.
func LoadKernels(rt *hip.Runtime, rtc *hip.RTC, arch, cacheDir string) (*Kernels, error) {
	img, err := CompileImage(rtc, arch, rt.RuntimeVersion(), cacheDir)
	if err != nil {
		return nil, err
	}
	k := &Kernels{Image: img}
	if k.module, err = rt.ModuleLoadData(img.Code); err != nil {
		if img.Origin == "cache" {
			// A damaged cache entry must not disable the kernels: drop it and compile.
			_ = os.Remove(img.CachePath)
			if rtc != nil {
				return LoadKernels(rt, rtc, arch, cacheDir)
			}
		}
		return nil, fmt.Errorf("loading the copy kernels for %s: %w", archName(arch), err)
	}
	if err := k.copy.Lookup(func(name string) (hip.Function, error) { return rt.ModuleFunction(k.module, name) }); err != nil {
		_ = rt.ModuleUnload(k.module)
		return nil, err
	}
	return k, nil
}
