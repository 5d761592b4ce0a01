// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// TestGPUSignalsWhatLanded: a waited block transfer of one GPU submission has the GPU set the signal word behind
// its copies (a small block through the kernel, a large one on the copy engine), into shared memory the composite
// registered; an unwaited one, a list the GPU checks as it runs, and a word outside registered memory are never
// written, and their copies land all the same. Releasing the memory waits for a copy still running that writes
// there, and signals after the release are not written.
func TestGPUSignalsWhatLanded(t *testing.T) {
	drv, nv := gpuEnv(t)
	be, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, be, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv}) // holds the context the memory lives in
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	const size = 1 << 30
	src, dst, free := devicePair(t, drv, c, size)
	t.Cleanup(free)
	rng := rand.New(rand.NewPCG(5, 6))
	fill := randomBytes(rng, 64<<20)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, fill) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, d := range []engines.MemoryDesc{gpuDesc("src", src, size), gpuDesc("dst", dst, size)} {
		if _, err := eng.Register(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	shared := func() []byte {
		m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	mem, unregistered := shared(), shared()
	release, err := eng.RegisterSignalMemory(mem)
	if err != nil {
		t.Fatal(err)
	}
	word := (*uint32)(unsafe.Pointer(&mem[256]))
	stray := (*uint32)(unsafe.Pointer(&unregistered[256]))
	// submit submits a block list; onGPU says whether planning must have left its check to the GPU.
	submit := func(bs uint64, srcIDs, dstIDs []uint32, waited bool, sig *engines.Signal, onGPU ...bool) engines.Transfer {
		t.Helper()
		plan := eng.NewPlan()
		if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{{Src: "src", Dst: "dst"}},
			BlockBytes: bs, SrcIDs: srcIDs, DstIDs: dstIDs}); err != nil {
			t.Fatal(err)
		}
		ps := plan.Build()
		if len(onGPU) > 0 && ps.Plans[0].Blocks.Unchecked != onGPU[0] {
			t.Fatalf("planning left the list of %d ids unchecked: %v, want %v", len(srcIDs), ps.Plans[0].Blocks.Unchecked, onGPU[0])
		}
		tr, err := eng.Submit(ctx, ps, engines.SubmitOptions{Waited: waited, Signal: sig})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	landed := func(what string, bs uint64, srcID, dstID uint32) {
		t.Helper()
		got := make([]byte, bs)
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst+cuda.DevicePtr(uint64(dstID)*bs)) }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fill[uint64(srcID)*bs:][:bs]) {
			t.Fatalf("%s: the block did not land", what)
		}
	}
	wait := func(what string, tr engines.Transfer) {
		t.Helper()
		if err := tr.Wait(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}

	for i, tc := range []struct {
		name string
		bs   uint64
	}{{"4 KiB through the kernel", 4 << 10}, {"64 MiB on the copy engine", 64 << 20}} {
		value := uint32(10 + i)
		tr := submit(tc.bs, []uint32{0}, []uint32{1}, true, &engines.Signal{Word: word, Value: value})
		wait(tc.name, tr)
		if got := atomic.LoadUint32(word); got != value {
			t.Fatalf("%s: the signal word is %d after the transfer, want %d", tc.name, got, value)
		}
		landed(tc.name, tc.bs, 0, 1)
	}

	const before = 11
	tr := submit(4<<10, []uint32{2}, []uint32{3}, false, &engines.Signal{Word: word, Value: 20})
	wait("unwaited", tr)
	landed("unwaited", 4<<10, 2, 3)
	ids := rng.Perm(4096)
	srcIDs, dstIDs := make([]uint32, 2048), make([]uint32, 2048)
	for i := range srcIDs {
		srcIDs[i], dstIDs[i] = uint32(ids[i]), uint32(ids[2048+i])
	}
	wait("checked on the GPU", submit(4<<10, srcIDs, dstIDs, true, &engines.Signal{Word: word, Value: 21}, true))
	landed("checked on the GPU", 4<<10, srcIDs[7], dstIDs[7])
	if got := atomic.LoadUint32(word); got != before {
		t.Fatalf("an unwaited transfer or a list checked on the GPU wrote the signal word (%d)", got)
	}
	wait("unregistered memory", submit(4<<10, []uint32{4}, []uint32{5}, true, &engines.Signal{Word: stray, Value: 22}))
	landed("unregistered memory", 4<<10, 4, 5)
	if got := atomic.LoadUint32(stray); got != 0 {
		t.Fatalf("a signal into memory nobody registered was written (%d)", got)
	}

	// 1 GiB takes about half a millisecond: the release comes while it runs and must wait for its write.
	big := submit(size/2, []uint32{0}, []uint32{1}, true, &engines.Signal{Word: word, Value: 30})
	if err := release(); err != nil {
		t.Fatalf("releasing signal memory: %v", err)
	}
	if got := atomic.LoadUint32(word); got != 30 {
		t.Fatalf("the release returned before the running copy wrote its signal (word %d)", got)
	}
	wait("1 GiB", big)
	wait("after the release", submit(4<<10, []uint32{6}, []uint32{7}, true, &engines.Signal{Word: word, Value: 31}))
	if got := atomic.LoadUint32(word); got != 30 {
		t.Fatalf("a signal into released memory was written (%d)", got)
	}
	landed("after the release", 4<<10, 6, 7)
}
