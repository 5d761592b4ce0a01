// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/gpushare"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// Kernels are the copy kernels loaded into one context.
type Kernels struct {
	module cuda.Module
	copy   gpushare.CopyKernels[cuda.Function]
	// Block lists checked on the GPU (fx_blocks_check, fx_blocks16).
	blocksCheck, blocks16 cuda.Function
	// Origin says where the image came from: "nvrtc" (compiled now) or "cache".
	Origin string
	// Arch is the target, e.g. "sm_90".
	Arch string
	// CachePath is the on-disk image, empty when it could not be written.
	CachePath string
}

// cacheKey names a compiled image: the source, the GPU architecture and the
// driver version decide whether a cached cubin is still good.
func cacheKey(arch string, driverVersion int) string {
	return fmt.Sprintf("fxcopy-%s-%s-drv%d.cubin", kernels.Hash(kernels.CUDA)[:16], arch, driverVersion)
}

// deviceArch is "sm_<major><minor>" for dev.
func deviceArch(drv *cuda.Driver, dev cuda.Device) (string, error) {
	major, err := drv.DeviceAttribute(dev, cuda.AttrComputeCapabilityMajor)
	if err != nil {
		return "", err
	}
	minor, err := drv.DeviceAttribute(dev, cuda.AttrComputeCapabilityMinor)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("sm_%d%d", major, minor), nil
}

// LoadKernels loads the copy kernels into the current context (which must be
// dev's): from cacheDir when a cubin for this source, architecture and driver
// is there, else compiled with nvrtc (nil: unavailable) and written to
// cacheDir (empty: no cache).
func LoadKernels(drv *cuda.Driver, nvrtc *cuda.NVRTC, dev cuda.Device, cacheDir string) (*Kernels, error) {
	arch, err := deviceArch(drv, dev)
	if err != nil {
		return nil, fmt.Errorf("reading the GPU architecture: %w", err)
	}
	k := &Kernels{Arch: arch}
	var cachePath string
	if cacheDir != "" {
		cachePath = filepath.Join(cacheDir, cacheKey(arch, drv.Version()))
	}
	image, origin, cached, err := gpushare.CachedImage(cachePath, "nvrtc", func() ([]byte, error) {
		if nvrtc == nil {
			return nil, errors.New("no compiled copy kernels: NVRTC is not available and no cached image for " + arch)
		}
		out, err := nvrtc.Compile(kernels.CUDA, "fxcopy.cu", []string{"--gpu-architecture=" + arch, "--std=c++17"})
		if err != nil {
			return nil, fmt.Errorf("compiling the copy kernels for %s with NVRTC %s: %w", arch, nvrtc.Version(), err)
		}
		return out.Image, nil
	})
	if err != nil {
		return nil, err
	}
	k.Origin, k.CachePath = origin, cached
	if k.module, err = drv.ModuleLoadData(image); err != nil {
		if k.Origin == "cache" {
			// A damaged cache entry must not disable the kernels: drop it and compile.
			_ = os.Remove(cachePath)
			if nvrtc != nil {
				return LoadKernels(drv, nvrtc, dev, cacheDir)
			}
		}
		return nil, fmt.Errorf("loading the copy kernels: %w", err)
	}
	get := func(name string) (cuda.Function, error) { return drv.ModuleFunction(k.module, name) }
	err = k.copy.Lookup(get)
	if err == nil {
		k.blocksCheck, err = get(kernels.BlocksCheck)
	}
	if err == nil {
		k.blocks16, err = get(kernels.BlocksCopy16)
	}
	if err != nil {
		_ = drv.ModuleUnload(k.module)
		return nil, err
	}
	return k, nil
}
