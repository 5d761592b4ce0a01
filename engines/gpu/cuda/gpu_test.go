// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cuda

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
)

// gpu opens the driver and device 0's primary context, or skips with the reason.
func gpu(t *testing.T) (*Driver, Device, Context) {
	t.Helper()
	d, err := Load()
	if err != nil {
		t.Skipf("needs a GPU: %v", err)
	}
	n, err := d.DeviceCount()
	if err != nil || n == 0 {
		t.Skipf("needs a GPU: %d devices, %v", n, err)
	}
	dev, err := d.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.PrimaryContextRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.PrimaryContextRelease(dev) })
	return d, dev, ctx
}

func TestGPUDeviceFacts(t *testing.T) {
	d, dev, _ := gpu(t)
	name, err := d.DeviceName(dev)
	if err != nil || name == "" {
		t.Fatalf("DeviceName = %q, %v", name, err)
	}
	bus, err := d.DevicePCIBusID(dev)
	if err != nil || bus == "" {
		t.Fatalf("DevicePCIBusID = %q, %v", bus, err)
	}
	mem, err := d.DeviceTotalMem(dev)
	if err != nil || mem == 0 {
		t.Fatalf("DeviceTotalMem = %d, %v", mem, err)
	}
	attrs := map[string]int{}
	for name, a := range map[string]int{"cc.major": AttrComputeCapabilityMajor, "cc.minor": AttrComputeCapabilityMinor, "sms": AttrMultiprocessorCount,
		"vmm": AttrVirtualMemoryManagement, "posix_fd": AttrHandleTypePosixFD, "fabric": AttrHandleTypeFabricSupported,
		"dmabuf": AttrDmaBufSupported, "gdr": AttrGPUDirectRDMA, "gdr_vmm": AttrGPUDirectRDMAWithVMM} {
		v, err := d.DeviceAttribute(dev, a)
		if err != nil {
			t.Fatalf("attribute %s: %v", name, err)
		}
		attrs[name] = v
	}
	t.Logf("device 0: %s at %s, %d GiB, driver %d, batch copy %v, attributes %v", name, bus, mem>>30, d.Version(), d.HasBatchCopy(), attrs)
}

func TestGPUWithContextRestoresCallersContext(t *testing.T) {
	d, _, ctx := gpu(t)
	err := d.WithContext(0, func() error {
		// The caller has no context; inside, ours is current; after, none again.
		if err := d.WithContext(ctx, func() error {
			cur, err := d.CtxGetCurrent()
			if err == nil && cur != ctx {
				t.Errorf("inside WithContext the current context is %#x, want %#x", cur, ctx)
			}
			return err
		}); err != nil {
			return err
		}
		cur, err := d.CtxGetCurrent()
		if err == nil && cur != 0 {
			t.Errorf("after WithContext the current context is %#x, want none", cur)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGPUCopiesAndVMMRoundTrip(t *testing.T) {
	d, dev, ctx := gpu(t)
	err := d.WithContext(ctx, func() error {
		const n = 3<<20 + 17
		src := make([]byte, n)
		r := rand.New(rand.NewPCG(7, 8))
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		plain, err := d.MemAlloc(n)
		if err != nil {
			return err
		}
		defer d.MemFree(plain)
		vmm, err := d.VMMAlloc(dev, n, HandleTypePosixFD)
		if err != nil {
			return err
		}
		defer d.VMMFree(vmm)
		if err := d.MemcpyHtoD(plain, src); err != nil {
			return err
		}
		if err := d.MemcpyDtoD(vmm.Ptr, plain, n); err != nil {
			return err
		}
		got := make([]byte, n)
		if err := d.MemcpyDtoH(got, vmm.Ptr); err != nil {
			return err
		}
		if !bytes.Equal(got, src) {
			t.Error("bytes changed on the way host → cuMemAlloc → VMM → host")
		}
		types, err := d.PointerHandleTypes(uint64(vmm.Ptr))
		if err != nil {
			return err
		}
		if types&HandleTypePosixFD == 0 {
			t.Errorf("VMM allocation reports handle types %#x, want POSIX fd", types)
		}
		h, base, size, err := d.AllocationOf(vmm.Ptr + 4096)
		if err != nil {
			return err
		}
		defer d.MemRelease(h)
		if base != vmm.Ptr || size != vmm.Size {
			t.Errorf("AllocationOf = base %#x size %d, want %#x %d", base, size, vmm.Ptr, vmm.Size)
		}
		info, err := d.PointerGetInfo(uint64(plain) + 100)
		if err != nil {
			return err
		}
		if info.Type != MemoryTypeDevice || info.RangeStart != uint64(plain) {
			t.Errorf("PointerGetInfo = %+v", info)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGPUFabricHandleAllocation(t *testing.T) {
	d, dev, ctx := gpu(t)
	supported, err := d.DeviceAttribute(dev, AttrHandleTypeFabricSupported)
	if err != nil {
		t.Fatal(err)
	}
	err = d.WithContext(ctx, func() error {
		a, err := d.VMMAlloc(dev, 2<<20, HandleTypeFabric)
		if err != nil {
			// Without an IMEX channel the driver refuses fabric allocations.
			t.Logf("fabric-exportable allocation (attribute %d): %v", supported, err)
			if !IsResult(err, ErrNotPermitted) && !IsResult(err, ErrNotSupported) && !IsResult(err, ErrInvalidValue) {
				t.Errorf("unexpected failure: %v", err)
			}
			return nil
		}
		defer d.VMMFree(a)
		fh, err := d.ExportFabric(a.Handle)
		if err != nil {
			return err
		}
		if fh == (FabricHandle{}) {
			t.Error("exported fabric handle is all zero")
		}
		t.Logf("fabric handle exported (attribute %d)", supported)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestGPUDMABufExport(t *testing.T) {
	d, dev, ctx := gpu(t)
	if v, err := d.DeviceAttribute(dev, AttrDmaBufSupported); err != nil || v == 0 {
		t.Skipf("GPU reports no dma-buf support (%d, %v)", v, err)
	}
	err := d.WithContext(ctx, func() error {
		p, err := d.MemAlloc(4 << 20)
		if err != nil {
			return err
		}
		defer d.MemFree(p)
		fd, err := d.DMABufFD(p, 4<<20)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			return fmt.Errorf("fstat of the dma-buf fd %d: %w", fd, err)
		}
		t.Logf("dma-buf fd %d for 4 MiB of device memory (mode %#o)", fd, st.Mode)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
