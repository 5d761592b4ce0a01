// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hipcopy"
)

// amdEnv opens HIP (skipping with the reason when there is no AMD GPU) and
// hipRTC (nil when missing: copiers then report their fallback).
func amdEnv(t *testing.T) (*hip.Runtime, *hip.RTC, int) {
	t.Helper()
	rt, err := hip.Load()
	if err != nil {
		t.Skipf("no AMD GPU (%v)", err)
	}
	n, err := rt.DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("no AMD GPU (%d HIP devices: %v)", n, err)
	}
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.Logf("kernels unavailable: %v", err)
	}
	return rt, rtc, n
}

func alloc(t *testing.T, rt *hip.Runtime, dev hip.Device, n uint64) hip.DevicePtr {
	t.Helper()
	var p hip.DevicePtr
	if err := rt.WithDevice(dev, func() (err error) { p, err = rt.Malloc(n); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rt.WithDevice(dev, func() error { return rt.Free(p) }) })
	return p
}

// scatterPlan is 4,000 blocks of 720 B at random slots plus one 20 MiB item
// (the copy engine's) and odd-sized items (the general kernel's).
func scatterPlan(r *rand.Rand) (*engines.Plan, uint64) {
	const blk, slots = 720, 8192
	p := &engines.Plan{}
	src, dst := r.Perm(slots), r.Perm(slots)
	for i := 0; i < 4000; i++ {
		p.Segments = append(p.Segments, engines.Segment{SrcOffset: uint64(src[i]) * blk, DstOffset: uint64(dst[i]) * blk, Size: blk})
	}
	base := uint64(slots * blk)
	p.Segments = append(p.Segments, engines.Segment{SrcOffset: base, DstOffset: base, Size: 20 << 20})
	for i := uint64(0); i < 50; i++ {
		off := base + 20<<20 + i*4099
		p.Segments = append(p.Segments, engines.Segment{SrcOffset: off + 3, DstOffset: off + 1, Size: 1 + i*61})
	}
	for _, s := range p.Segments {
		p.Bytes += s.Size
	}
	return p, base + 20<<20 + 51*4099
}

// TestBackendScatterCopy copies a mixed plan between two regions of GPU 0
// (and to the last GPU when there are several) in kernel and per-item mode,
// checks every byte, and checks the caller's current device is kept.
func TestBackendScatterCopy(t *testing.T) {
	rt, rtc, n := amdEnv(t)
	for _, force := range []hipcopy.Mode{"", hipcopy.ModePerItem} {
		t.Run("mode="+string(force), func(t *testing.T) {
			be, err := hipcopy.NewBackend(rt, hipcopy.Options{RTC: rtc, Force: force, CacheDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer be.Close()
			mode, why, err := be.Mode(0)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("GPU 0 mode %s %s", mode, why)
			r := rand.New(rand.NewPCG(5, 6))
			plan, size := scatterPlan(r)
			data := make([]byte, size)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			dstDev := hip.Device(n - 1)
			sp, dp := alloc(t, rt, 0, size), alloc(t, rt, dstDev, size)
			if err := rt.MemcpyHtoD(sp, data); err != nil {
				t.Fatal(err)
			}
			if err := rt.WithDevice(dstDev, func() error { return rt.Memset(dp, 0, size) }); err != nil {
				t.Fatal(err)
			}
			mk := func(id string, dev int, p hip.DevicePtr) engines.MemoryDesc {
				return engines.MemoryDesc{ID: engines.MemoryID(id), Node: "n", Size: size, Handles: engines.Handles{Ptr: uintptr(p)},
					Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorAMD, Device: dev}}
			}
			ctx := context.Background()
			src, err := be.Register(ctx, mk("src", 0, sp))
			if err != nil {
				t.Fatal(err)
			}
			dst, err := be.Register(ctx, mk("dst", int(dstDev), dp))
			if err != nil {
				t.Fatal(err)
			}
			if ok, why := be.Claims(&src, &dst); !ok {
				t.Skipf("GPU 0 and GPU %d: %s", dstDev, why)
			}
			before, _ := rt.GetDevice()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := be.Copy(cctx, engines.Work{Plan: plan, Src: &src, Dst: &dst}); err != nil {
				t.Fatal(err)
			}
			if after, _ := rt.GetDevice(); after != before {
				t.Errorf("current device %d after Copy, was %d", after, before)
			}
			got := make([]byte, size)
			if err := rt.MemcpyDtoH(got, dp); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			for _, s := range plan.Segments {
				copy(want[s.DstOffset:s.DstOffset+s.Size], data[s.SrcOffset:s.SrcOffset+s.Size])
			}
			if !bytes.Equal(got, want) {
				t.Fatal("destination differs from the expected scatter")
			}
		})
	}
}
