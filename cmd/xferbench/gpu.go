// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

func init() {
	registerMode(Mode{Name: "xgmi-gpu",
		Description: "same-GPU copies through the xgmi engine's CUDA backend (GPU 0); baseline: the copy engine (cuMemcpyDtoDAsync + stream sync) over the same bytes",
		Setup:       setupGPU})
}

// setupGPU registers two device buffers of GPU 0 with the xgmi engine over
// the CUDA backend (copy kernels compiled with NVRTC when present).
func setupGPU(ctx context.Context, cfg SetupConfig) (*Target, error) {
	drv, err := cuda.Load()
	if err != nil {
		return nil, err
	}
	nv, nvErr := cuda.LoadNVRTC()
	if nvErr != nil {
		nv = nil
	}
	back, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
	if err != nil {
		return nil, err
	}
	mode, why, err := back.Mode(0)
	if err != nil {
		back.Close()
		return nil, err
	}
	if mode != cudacopy.ModeKernel {
		fmt.Printf("xgmi-gpu: copy kernels unavailable, using %s: %s\n", mode, why)
	}
	const node = "bench"
	eng, err := xgmi.New(xgmi.Options{Node: node}, back, xgmi.NewHostBackend())
	if err != nil {
		back.Close()
		return nil, err
	}
	dev, err := drv.DeviceGet(0)
	if err != nil {
		return nil, errors.Join(err, eng.Close(), back.Close())
	}
	cctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		return nil, errors.Join(err, eng.Close(), back.Close())
	}
	var src, dst cuda.DevicePtr
	var streams []cuda.Stream
	var mu sync.Mutex
	release := func() error {
		errs := []error{eng.Close(), back.Close()}
		errs = append(errs, drv.WithContext(cctx, func() error {
			var es []error
			for _, s := range streams {
				es = append(es, drv.StreamDestroy(s))
			}
			for _, p := range []cuda.DevicePtr{src, dst} {
				if p != 0 {
					es = append(es, drv.MemFree(p))
				}
			}
			return errors.Join(es...)
		}), drv.PrimaryContextRelease(dev))
		return errors.Join(errs...)
	}
	err = drv.WithContext(cctx, func() error {
		var err error
		if src, err = drv.MemAlloc(cfg.Capacity); err != nil {
			return err
		}
		if dst, err = drv.MemAlloc(cfg.Capacity); err != nil {
			return err
		}
		// Distinct bytes, so a copy that does nothing cannot pass for one.
		if err := drv.MemsetD8(src, 0x5a, cfg.Capacity); err != nil {
			return err
		}
		return drv.MemsetD8(dst, 0xa5, cfg.Capacity)
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("allocating 2 x %d bytes on GPU 0: %w", cfg.Capacity, err), release())
	}
	t := &Target{Engine: eng, Src: node + "/gpu-src", Dst: node + "/gpu-dst", BaselineName: "cuMemcpyDtoDAsync",
		Close: release}
	for _, r := range []struct {
		id engines.MemoryID
		p  cuda.DevicePtr
	}{{t.Src, src}, {t.Dst, dst}} {
		d := engines.MemoryDesc{ID: r.id, Node: node, Size: cfg.Capacity, Handles: engines.Handles{Ptr: uintptr(r.p)},
			Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}
		if _, err := eng.Register(ctx, d); err != nil {
			return nil, errors.Join(err, release())
		}
	}
	t.Baseline = func(_ context.Context, thread int, off, n uint64) error {
		return drv.WithContext(cctx, func() error {
			mu.Lock()
			for len(streams) <= thread {
				s, err := drv.StreamCreate()
				if err != nil {
					mu.Unlock()
					return err
				}
				streams = append(streams, s)
			}
			s := streams[thread]
			mu.Unlock()
			if err := drv.MemcpyDtoDAsync(dst+cuda.DevicePtr(off), src+cuda.DevicePtr(off), n, s); err != nil {
				return err
			}
			return drv.StreamSynchronize(s)
		})
	}
	return t, nil
}
