// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric_test

import (
	"context"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
)

// TestGPUFabricOnThisNode reports what the fabric engine says on the machine
// it runs on: with IMEX it exports a handle for fabric memory; without, it
// refuses every pair with the driver's reason.
func TestGPUFabricOnThisNode(t *testing.T) {
	drv, err := cuda.Load()
	if err != nil {
		t.Skipf("needs a GPU: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		t.Skipf("needs a GPU: %d devices (%v)", n, err)
	}
	nv, _ := cuda.LoadNVRTC()
	rt := fabric.NewCUDARuntime(drv, cudacopy.Options{NVRTC: nv})
	defer rt.Close()
	e, err := fabric.New(fabric.Options{Node: "node-a", Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ok, why := e.Available()
	t.Logf("fabric engine available=%v reason=%q", ok, why)
	dev, _ := drv.DeviceGet(0)
	ctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.PrimaryContextRelease(dev)
	var p cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { p, err = drv.MemAlloc(1 << 20); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(p) })
	d := engines.MemoryDesc{ID: "node-a/kv", Node: "node-a", Size: 1 << 20, FabricDomain: domain,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}, Handles: engines.Handles{Ptr: uintptr(p)}}
	out, err := e.Register(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if out.Handles.Fabric != nil {
		t.Fatal("cuMemAlloc memory got a fabric handle")
	}
	remote := engines.MemoryDesc{ID: "node-b/kv", Node: "node-b", Size: 1 << 20, FabricDomain: domain,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles:  engines.Handles{Fabric: &engines.FabricHandle{AllocSize: 2 << 20}}}
	okPair, reason := e.CanHandle(&out, &remote)
	t.Logf("CanHandle(local cuMemAlloc, remote fabric) = %v %q", okPair, reason)
	if !ok {
		if okPair || !strings.Contains(reason, why) {
			t.Fatalf("unavailable engine claimed a pair or hid its reason: %v %q", okPair, reason)
		}
		if !strings.Contains(why, "CUDA_ERROR") {
			t.Errorf("reason %q does not carry the driver's result", why)
		}
		return
	}
	// With IMEX: memory made fabric-exportable gets a handle with its offset.
	var a *cuda.VMMAllocation
	if err := drv.WithContext(ctx, func() (err error) { a, err = drv.VMMAlloc(dev, 4<<20, cuda.HandleTypeFabric); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.VMMFree(a) })
	fd := d
	fd.ID, fd.Handles.Ptr = "node-a/fabric", uintptr(a.Ptr)+65536
	fout, err := e.Register(context.Background(), fd)
	if err != nil {
		t.Fatal(err)
	}
	if fout.Handles.Fabric == nil || fout.Handles.Fabric.Offset != 65536 || fout.Handles.Fabric.AllocSize != a.Size {
		t.Fatalf("fabric handle %+v, want offset 65536 in %d bytes", fout.Handles.Fabric, a.Size)
	}
}
