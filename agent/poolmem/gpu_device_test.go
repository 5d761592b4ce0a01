// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// The borrower is this test binary exec'd again: the driver does not support a forked child that touches CUDA
// without exec. It gets the pool's fd as fd 3 and the slice in the environment.
const borrowerEnv = "FXPOOL_BORROWER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(borrowerEnv); spec != "" {
		if err := borrower(spec); err != nil {
			fmt.Fprintln(os.Stderr, "borrower:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func pattern(n uint64) []byte {
	r := rand.New(rand.NewPCG(11, 13))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// borrower does what an inference pod does with a lent slice: import the fd, map the whole allocation, use its
// slice (here: write a pattern), unmap.
func borrower(spec string) error {
	runtime.LockOSThread()
	var off, length, allocSize uint64
	if _, err := fmt.Sscanf(spec, "%d %d %d", &off, &length, &allocSize); err != nil {
		return fmt.Errorf("parsing %q: %w", spec, err)
	}
	drv, err := cuda.Load()
	if err != nil {
		return err
	}
	dev, err := drv.DeviceGet(0)
	if err != nil {
		return err
	}
	ctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		return err
	}
	defer drv.PrimaryContextRelease(dev)
	if err := drv.CtxSetCurrent(ctx); err != nil {
		return err
	}
	h, err := drv.ImportPosixFD(3)
	if err != nil {
		return err
	}
	defer drv.MemRelease(h)
	g, err := drv.Granularity(dev, cuda.HandleTypePosixFD)
	if err != nil {
		return err
	}
	ptr, err := drv.MapHandle(h, allocSize, g, []cuda.Device{dev})
	if err != nil {
		return err
	}
	defer drv.UnmapRange(ptr, allocSize)
	if err := drv.MemcpyHtoD(ptr+cuda.DevicePtr(off), pattern(length)); err != nil {
		return err
	}
	return drv.CtxSynchronize()
}

func TestGPUPoolSliceMappedByAnotherProcess(t *testing.T) {
	drv, err := cuda.Load()
	if err != nil {
		if strings.HasPrefix(err.Error(), "no CUDA driver") {
			t.Skip(err.Error())
		}
		t.Skipf("no CUDA driver: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		t.Skipf("no CUDA device: %d devices, %v", n, err)
	}
	dev, _ := drv.DeviceGet(0)
	bus, err := drv.DevicePCIBusID(dev)
	if err != nil {
		t.Fatal(err)
	}
	const poolSize = 64 << 20
	pool, err := poolmem.NewGPU(drv, []poolmem.GPUTarget{{Index: 0, BusID: strings.ToLower(bus)}}, poolSize)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	d := pool.Devices()[0]
	t.Logf("pool on GPU 0 (%s): %d bytes, fabric-exportable %v %s", d.BusID, d.Total, d.FabricExportable, d.FabricReason)

	// A first slice so the borrower's is not at offset 0, then the borrower's: odd length, 3 MiB and change.
	first, err := pool.AllocateOn("pod/a", 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := pool.AllocateOn("pod/a", 0, 3<<20+123)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lent slices at offsets %d (+%d) and %d (+%d) of a %d-byte slab", first.Offset, first.Length, sl.Offset, sl.Length, sl.AllocSize)
	// The fd a borrower gets is its slab's (an eighth of the GPU's share by default), shared with no other owner.
	if sl.AllocSize != d.SlabBytes || sl.AllocSize >= d.Total || sl.Ptr-sl.Offset != first.Ptr-first.Offset {
		t.Fatalf("slices of one owner: slab %d bytes at %#x and %#x; want one %d-byte slab", sl.AllocSize, sl.Ptr-sl.Offset, first.Ptr-first.Offset, d.SlabBytes)
	}
	other, err := pool.AllocateOn("pod/b", 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if other.Ptr-other.Offset == sl.Ptr-sl.Offset {
		t.Fatal("a second owner was lent a slice of the first owner's slab")
	}
	if err := pool.Free(other.ID); err != nil {
		t.Fatal(err)
	}

	// Register the slice through the composite the agent runs: same-node engine with the GPU backend, and the
	// fabric engine, which exports it when it can.
	be, err := cudacopy.NewBackend(drv, cudacopy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, be, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	rt := fabric.NewCUDARuntime(drv, cudacopy.Options{})
	defer rt.Close()
	fe, err := fabric.New(fabric.Options{Node: "node-a", Runtime: rt})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x, fe)
	if err != nil {
		t.Fatal(err)
	}
	defer comp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	desc, err := comp.Register(ctx, engines.MemoryDesc{ID: "node-a/pool-slice", Node: "node-a", Size: sl.Length,
		Location: engines.Location{Kind: engines.LocationGPU, Device: 0, Vendor: engines.VendorNVIDIA, BusID: sl.BusID},
		Handles:  engines.Handles{Ptr: uintptr(sl.Ptr), VMM: &engines.VMMHandle{FDs: []*os.File{sl.File}, Offset: sl.Offset, AllocSize: sl.AllocSize}}})
	if err != nil {
		t.Fatalf("registering the slice: %v", err)
	}
	fabricOK, fabricWhy := fe.Available()
	t.Logf("fabric engine available %v (%s); slice has a fabric handle: %v", fabricOK, fabricWhy, desc.Handles.Fabric != nil)
	if fabricOK && sl.FabricExportable && desc.Handles.Fabric == nil {
		t.Error("fabric-exportable pool memory registered without a fabric handle")
	}
	if desc.Handles.Fabric != nil && desc.Handles.Fabric.Offset != sl.Offset {
		t.Errorf("fabric handle offset %d, want the slice's %d", desc.Handles.Fabric.Offset, sl.Offset)
	}

	// The borrower gets a dup of the fd (exported fds are close-on-exec) and writes its slice.
	dup, err := syscall.Dup(int(sl.File.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	fdFile := os.NewFile(uintptr(dup), "pool-fd")
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), borrowerEnv+"="+strconv.FormatUint(sl.Offset, 10)+" "+strconv.FormatUint(sl.Length, 10)+" "+strconv.FormatUint(sl.AllocSize, 10))
	cmd.ExtraFiles = []*os.File{fdFile}
	out, err := cmd.CombinedOutput()
	fdFile.Close()
	if err != nil {
		t.Fatalf("borrower: %v: %s", err, out)
	}

	// The agent reads the slice through the engine into host memory.
	host := make([]byte, sl.Length)
	if _, err := comp.Register(ctx, engines.MemoryDesc{ID: "node-a/host", Node: "node-a", Size: sl.Length,
		Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: host}}); err != nil {
		t.Fatal(err)
	}
	b := comp.NewPlan()
	if err := b.Add(engines.Item{Src: "node-a/pool-slice", Dst: "node-a/host", Size: sl.Length, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ps := b.Build()
	if len(ps.Rejected) > 0 {
		t.Fatalf("rejected: %v", ps.Rejected[0])
	}
	tr, err := comp.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host, pattern(sl.Length)) {
		t.Fatal("the agent does not see the borrower's bytes in the slice")
	}
	// The neighbouring slice is untouched.
	pctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.PrimaryContextRelease(dev)
	neighbour := make([]byte, first.Length)
	if err := drv.WithContext(pctx, func() error { return drv.MemcpyDtoH(neighbour, cuda.DevicePtr(first.Ptr)) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(neighbour, make([]byte, first.Length)) {
		t.Fatal("the borrower's write reached the neighbouring slice")
	}

	// Release: deregister, free; the range is zero for the next borrower and back in the pool.
	for _, id := range []engines.MemoryID{"node-a/pool-slice", "node-a/host"} {
		if err := comp.Deregister(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := pool.Free(sl.ID); err != nil {
		t.Fatal(err)
	}
	again := make([]byte, sl.Length)
	if err := drv.WithContext(pctx, func() error { return drv.MemcpyDtoH(again, cuda.DevicePtr(sl.Ptr)) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, make([]byte, sl.Length)) {
		t.Fatal("a freed slice still holds the borrower's bytes")
	}
	if err := pool.Free(first.ID); err != nil {
		t.Fatal(err)
	}
	if total, free := pool.Usage(); free != total {
		t.Fatalf("after releasing everything %d of %d bytes are free", free, total)
	}
}
