// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// TestGPUImportsARangeOfVMMAllocations lays memory out as PyTorch's expandable segments do: k VMM allocations
// of one granularity-multiple size mapped back to back in one reserved range, each exported as a POSIX fd. The
// backend imports the k fds as one region (one pointer); copies through it that cross every allocation boundary
// land where the owner's own mapping sees them, byte for byte, in both directions; deregistering unmaps it all.
func TestGPUImportsARangeOfVMMAllocations(t *testing.T) {
	eng, _, drv, ctx := gpuEngine(t)
	const k = 5
	dev, err := drv.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	var (
		alloc uint64
		owner cuda.DevicePtr
		hs    []cuda.AllocHandle
		files []*os.File
	)
	// The owner's side: create, reserve, map each at i*alloc, grant access, export every handle.
	err = drv.WithContext(ctx, func() error {
		g, err := drv.Granularity(dev, cuda.HandleTypePosixFD)
		if err != nil {
			return err
		}
		alloc = g
		for range k {
			h, err := drv.MemCreate(dev, alloc, cuda.HandleTypePosixFD)
			if err != nil {
				return err
			}
			hs = append(hs, h)
		}
		if owner, err = drv.MemAddressReserve(k*alloc, g); err != nil {
			return err
		}
		for i, h := range hs {
			if err := drv.MemMap(owner+cuda.DevicePtr(uint64(i)*alloc), alloc, h); err != nil {
				return err
			}
		}
		if err := drv.MemSetAccess(owner, k*alloc, []cuda.Device{dev}); err != nil {
			return err
		}
		for _, h := range hs {
			fd, err := drv.ExportPosixFD(h)
			if err != nil {
				return err
			}
			files = append(files, os.NewFile(uintptr(fd), "vmm-export"))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("laying out %d VMM allocations as expandable segments do: %v", k, err)
	}
	t.Cleanup(func() {
		drv.WithContext(ctx, func() error {
			for i := range hs {
				drv.MemUnmap(owner+cuda.DevicePtr(uint64(i)*alloc), alloc)
			}
			drv.MemAddressFree(owner, k*alloc)
			for _, h := range hs {
				drv.MemRelease(h)
			}
			return nil
		})
		for _, f := range files {
			f.Close()
		}
	})
	span := k * alloc
	pattern := randomBytes(rand.New(rand.NewPCG(11, 5)), int(span))
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyHtoD(owner, pattern) }); err != nil {
		t.Fatal(err)
	}

	// The region starts inside the first allocation and ends inside the last, as a tensor in a segment does.
	off, size := alloc/3+5, span-alloc/3-alloc/7
	desc := engines.MemoryDesc{ID: "node-a/segments", Node: "node-a", Size: size,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles:  engines.Handles{VMM: &engines.VMMHandle{FDs: files, Offset: off, AllocSize: alloc}}}
	if _, err := eng.Register(context.Background(), desc); err != nil {
		t.Fatalf("registering %d VMM allocations as one region: %v", k, err)
	}
	var local cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { local, err = drv.MemAlloc(size); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(local) })
	if _, err := eng.Register(context.Background(), gpuDesc("node-a/local", local, size)); err != nil {
		t.Fatal(err)
	}

	// Read all of it, and pieces straddling each boundary, through the imported mapping.
	items := []engines.Item{{Src: "node-a/segments", Dst: "node-a/local", Size: size, Tag: 0}}
	run(t, eng, items)
	got := make([]byte, size)
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(got, local) }); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, pattern[off:off+size]); i >= 0 {
		t.Fatalf("byte %d of the region (allocation %d) read through the imported range differs", i, (off+uint64(i))/alloc)
	}

	// Write a new pattern through the imported mapping, in pieces that cross every boundary, and check every byte
	// with the owner's mapping.
	fresh := randomBytes(rand.New(rand.NewPCG(12, 6)), int(size))
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyHtoD(local, fresh) }); err != nil {
		t.Fatal(err)
	}
	var writes []engines.Item
	for i := uint64(1); i < k; i++ {
		b := i*alloc - off // boundary i, in region offsets
		writes = append(writes, engines.Item{Src: "node-a/local", SrcOffset: b - 4097, Dst: "node-a/segments", DstOffset: b - 4097,
			Size: 8193, Tag: engines.Tag(i)})
	}
	run(t, eng, writes)
	run(t, eng, []engines.Item{{Src: "node-a/local", Dst: "node-a/segments", Size: size, Tag: 99}})
	all := make([]byte, span)
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(all, owner) }); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(all[off:off+size], fresh); i >= 0 {
		t.Fatalf("byte %d of the region (allocation %d) written through the imported range differs in the owner's view", i, (off+uint64(i))/alloc)
	}
	if !bytes.Equal(all[:off], pattern[:off]) || !bytes.Equal(all[off+size:], pattern[off+size:]) {
		t.Fatal("bytes outside the region changed")
	}
	if err := eng.Deregister(context.Background(), "node-a/segments"); err != nil {
		t.Fatalf("deregistering: %v", err)
	}
	// The owner's memory outlives the importer's mapping.
	if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(all, owner) }); err != nil {
		t.Fatalf("owner's mapping after the importer let go: %v", err)
	}
	if i := firstDiff(all[off:off+size], fresh); i >= 0 {
		t.Fatalf("byte %d changed when the importer let go", i)
	}
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
