// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
)

// gpuEnv opens the driver (skipping with the reason when there is none) and
// NVRTC (nil when missing: the copier then reports its fallback).
func gpuEnv(t testing.TB) (*cuda.Driver, *cuda.NVRTC) {
	t.Helper()
	drv, err := cuda.Load()
	if err != nil {
		t.Skipf("needs a GPU: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		t.Skipf("needs a GPU: %d devices (%v)", n, err)
	}
	nv, err := cuda.LoadNVRTC()
	if err != nil {
		t.Logf("kernels unavailable: %v", err)
	}
	return drv, nv
}

// newCopier opens a copier on GPU 0, closed when the test ends (after its deferred frees).
func newCopier(t testing.TB, drv *cuda.Driver, opts cudacopy.Options) *cudacopy.Copier {
	t.Helper()
	c, err := cudacopy.NewCopier(drv, 0, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randomBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// devicePair allocates a source and a destination of size bytes on c's GPU;
// free them (defer) before closing c.
func devicePair(t testing.TB, drv *cuda.Driver, c *cudacopy.Copier, size uint64) (src, dst cuda.DevicePtr, free func()) {
	t.Helper()
	err := drv.WithContext(c.Context(), func() error {
		var err error
		if src, err = drv.MemAlloc(size); err != nil {
			return err
		}
		dst, err = drv.MemAlloc(size)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return src, dst, func() {
		_ = drv.WithContext(c.Context(), func() error { drv.MemFree(src); return drv.MemFree(dst) })
	}
}

// shape makes a set of non-overlapping destination segments of one kind.
type shape struct {
	name  string
	build func(r *rand.Rand, size uint64) []cudacopy.Segment // offsets, applied to bases later
}

var shapes = []shape{
	{"uniform-720B", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		const blk = 720
		n := int(size / blk)
		src, dst := r.Perm(n), r.Perm(n)
		segs := make([]cudacopy.Segment, 0, 15360)
		for i := 0; i < min(n, 15360); i++ {
			segs = append(segs, cudacopy.Segment{Src: uint64(src[i]) * blk, Dst: uint64(dst[i]) * blk, Size: blk})
		}
		return segs
	}},
	{"uniform-720B-at-16B-offsets", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		// Destinations 736 B apart and sources at any 16-byte offset: the
		// packed descriptors count in 16-byte units, not blocks.
		return equalBlocks(r, size, 720, 736, 15360)
	}},
	{"equal-64KiB-cut-into-pieces", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		// Items twice the piece size: the flat kernel over 8-byte descriptors.
		return equalBlocks(r, size, 64<<10, 64<<10, 500)
	}},
	{"odd-sizes-odd-offsets", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		// Destinations in disjoint slots of 40 KiB, each item at a random odd
		// offset inside its slot, random sizes, random source positions.
		const slot = 40 << 10
		n := int(size / slot)
		segs := make([]cudacopy.Segment, 0, n)
		for i := 0; i < n; i++ {
			sz := 1 + r.Uint64N(slot-64)
			off := r.Uint64N(slot - sz)
			segs = append(segs, cudacopy.Segment{Src: r.Uint64N(size - sz), Dst: uint64(i)*slot + off, Size: sz})
		}
		return segs
	}},
	{"many-tiny", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		n := int(min(size/64, 100000))
		segs := make([]cudacopy.Segment, 0, n)
		for i, d := range r.Perm(n) {
			sz := 1 + r.Uint64N(63)
			segs = append(segs, cudacopy.Segment{Src: uint64(i)*64 + r.Uint64N(64-sz+1), Dst: uint64(d) * 64, Size: sz})
		}
		return segs
	}},
	{"large-and-small", func(r *rand.Rand, size uint64) []cudacopy.Segment {
		// One item above the copy-engine threshold, the rest small.
		big := uint64(20 << 20)
		segs := []cudacopy.Segment{{Src: 3, Dst: 5, Size: big}}
		for off := big + 4096; off+5000 < size; off += 8192 {
			segs = append(segs, cudacopy.Segment{Src: off + 1, Dst: off + 3, Size: 1 + r.Uint64N(5000)})
		}
		return segs
	}},
}

func shapeNamed(t *testing.T, name string) shape {
	t.Helper()
	for _, sh := range shapes {
		if sh.name == name {
			return sh
		}
	}
	t.Fatalf("no shape %q", name)
	return shape{}
}

// The shapes the GPU tests copy reach every descriptor form of the kernels.
func TestShapesCoverEveryScatterForm(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	const size = 64 << 20
	for name, want := range map[string]string{
		"uniform-720B":                "packed in blocks",
		"uniform-720B-at-16B-offsets": "packed in 16-byte units",
		"equal-64KiB-cut-into-pieces": "flat",
		"odd-sizes-odd-offsets":       "general",
		"many-tiny":                   "general",
	} {
		segs := shapeNamed(t, name).build(r, size)
		for i := range segs { // as on the GPU: offsets from 256-byte aligned allocations
			segs[i].Src += 1 << 40
			segs[i].Dst += 2 << 40
		}
		l, err := scatter.Plan(segs, 32<<10)
		if err != nil {
			t.Fatal(err)
		}
		got := "general"
		switch {
		case l.Packed && l.Unit == l.PieceSize:
			got = "packed in blocks"
		case l.Packed && l.Unit == 16:
			got = "packed in 16-byte units"
		case l.Flat16:
			got = "flat"
		case l.Uniform:
			got = "uniform"
		}
		if got != want {
			t.Errorf("%s: %s descriptors, want %s (%+v)", name, got, want, l)
		}
	}
}

// equalBlocks is up to n blocks of blk bytes, each in its own destination slot
// of slot bytes, read from any 16-byte offset of the source.
func equalBlocks(r *rand.Rand, size, blk, slot uint64, n int) []cudacopy.Segment {
	n = min(int(size/slot), n)
	segs := make([]cudacopy.Segment, 0, n)
	for _, d := range r.Perm(int(size / slot))[:n] {
		segs = append(segs, cudacopy.Segment{Src: 16 * r.Uint64N((size-blk)/16), Dst: uint64(d) * slot, Size: blk})
	}
	return segs
}

// checkCopies runs segs (offsets into src and dst buffers of size bytes) with
// c and compares the whole destination with a host reference; it returns the
// completed submission.
func checkCopies(t *testing.T, drv *cuda.Driver, c *cudacopy.Copier, r *rand.Rand, segs []cudacopy.Segment, size uint64, srcPtr, dstPtr uint64) *cudacopy.Pending {
	t.Helper()
	return checkSubmitted(t, drv, c, r, segs, size, srcPtr, dstPtr, c.Submit)
}

// checkSubmitted copies segs (offsets) from a random source into a poisoned destination with submit and compares
// every byte of the destination.
func checkSubmitted(t *testing.T, drv *cuda.Driver, c *cudacopy.Copier, r *rand.Rand, segs []cudacopy.Segment, size uint64, srcPtr, dstPtr uint64,
	submit func([]cudacopy.Segment) (*cudacopy.Pending, error)) *cudacopy.Pending {
	t.Helper()
	src := randomBytes(r, int(size))
	poison := bytes.Repeat([]byte{0xA5}, int(size))
	want := append([]byte(nil), poison...)
	abs := make([]cudacopy.Segment, len(segs))
	for i, s := range segs {
		copy(want[s.Dst:s.Dst+s.Size], src[s.Src:s.Src+s.Size])
		abs[i] = cudacopy.Segment{Src: srcPtr + s.Src, Dst: dstPtr + s.Dst, Size: s.Size}
	}
	got := make([]byte, size)
	err := drv.WithContext(c.Context(), func() error {
		if err := drv.Memcpy(srcPtr, hostAddr(src), size); err != nil {
			return err
		}
		if err := drv.Memcpy(dstPtr, hostAddr(poison), size); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p, err := submit(abs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("second Wait: %v", err)
	}
	if err := drv.WithContext(c.Context(), func() error { return drv.Memcpy(hostAddr(got), dstPtr, size) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d segments: first wrong byte at %d: got %#x want %#x", len(segs), i, got[i], want[i])
			}
		}
	}
	t.Logf("%d segments, %d bytes checked, crc32 %08x", len(segs), size, crc32.ChecksumIEEE(got))
	return p
}

func TestGPUCopierMovesEveryShapeInEveryMode(t *testing.T) {
	drv, nv := gpuEnv(t)
	const size = 64 << 20
	modes := []struct {
		name string
		opts cudacopy.Options
	}{
		{"kernel", cudacopy.Options{NVRTC: nv}},
		{"kernel-uploaded-descriptors", cudacopy.Options{NVRTC: nv, UploadDescriptors: true}},
		{"driver-batch", cudacopy.Options{Force: cudacopy.ModeBatch}},
		{"driver-per-item", cudacopy.Options{Force: cudacopy.ModePerItem}},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			c, err := cudacopy.NewCopier(drv, 0, m.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			t.Logf("mode %s %s", c.Mode(), c.Reason())
			srcPtr, dstPtr, free := devicePair(t, drv, c, size)
			defer free()
			r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 9))
			for _, sh := range shapes {
				if m.name == "driver-per-item" && sh.name == "many-tiny" {
					continue // 100k driver calls: minutes, and proves nothing new
				}
				t.Run(sh.name, func(t *testing.T) {
					checkCopies(t, drv, c, r, sh.build(r, size), size, uint64(srcPtr), uint64(dstPtr))
				})
			}
		})
	}
}

// The same block list at another layer's base addresses launches from the
// descriptors its first launch left on the GPU; a list pushed out of the kept
// sets is staged again; every copy is checked in full either way.
func TestGPUCopierKeepsDescriptorsForTheNextLayer(t *testing.T) {
	drv, nv := gpuEnv(t)
	if nv == nil {
		t.Skip("needs NVRTC: descriptors are kept by the scatter kernel")
	}
	const layers, layerBytes = 3, 16 << 20
	for _, upload := range []bool{false, true} {
		t.Run(fmt.Sprintf("upload=%v", upload), func(t *testing.T) {
			c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, ResidentLayouts: 2, UploadDescriptors: upload})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.Mode() != cudacopy.ModeKernel {
				t.Fatalf("mode %s: %s", c.Mode(), c.Reason())
			}
			src, dst, free := devicePair(t, drv, c, layers*layerBytes)
			defer free()
			r := rand.New(rand.NewPCG(11, uint64(time.Now().UnixNano())))
			kv := shapeNamed(t, "uniform-720B")
			lists := [][]cudacopy.Segment{kv.build(r, layerBytes), kv.build(r, layerBytes), kv.build(r, layerBytes)}
			at := func(list, layer int) []cudacopy.Segment {
				out := make([]cudacopy.Segment, len(lists[list]))
				for i, s := range lists[list] {
					out[i] = cudacopy.Segment{Src: s.Src + uint64(layer)*layerBytes, Dst: s.Dst + uint64(layer)*layerBytes, Size: s.Size}
				}
				return out
			}
			for i, step := range []struct {
				list, layer int
				reused      bool
			}{
				{0, 0, false}, {0, 1, true}, {0, 2, true}, // the next layers
				{1, 0, false}, {2, 1, false}, // two more lists push list 0 out (2 kept)
				{0, 2, false}, {2, 0, true}, {0, 1, true},
			} {
				p := checkCopies(t, drv, c, r, at(step.list, step.layer), layers*layerBytes, uint64(src), uint64(dst))
				if p.ReusedDescriptors() != step.reused {
					t.Errorf("step %d (list %d, layer %d): reused descriptors %v, want %v", i, step.list, step.layer, p.ReusedDescriptors(), step.reused)
				}
			}
		})
	}
}

// Timed submissions wait for their queueing to finish, so the GPU time is
// never longer than the host's wall clock from Submit to the end of Wait, and
// the gate never holds a submission back for good.
func TestGPUCopierTimingIsGated(t *testing.T) {
	drv, nv := gpuEnv(t)
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, TimeDevice: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if gated, why := c.TimingGated(); !gated {
		t.Fatalf("timing not gated on this GPU: %s", why)
	}
	const size = 8 << 20
	src, dst, free := devicePair(t, drv, c, size)
	defer free()
	r := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 50; i++ {
		segs := shapeNamed(t, "uniform-720B").build(r, size)
		start := time.Now()
		p := checkCopies(t, drv, c, r, segs, size, uint64(src), uint64(dst))
		wall := time.Since(start)
		if d := p.DeviceTime(); d <= 0 || d > wall {
			t.Fatalf("submission %d: GPU time %v, host wall %v", i, d, wall)
		}
		if i == 0 {
			t.Logf("GPU time %v of %v host wall (with uploads and the check)", p.DeviceTime(), wall)
		}
	}
	// A copy into pageable memory returns from the driver only once it has run, so it must not be held.
	pageable := make([]byte, 1<<20)
	p, err := c.SubmitRoute([]cudacopy.Segment{{Src: uint64(src), Dst: hostAddr(pageable), Size: uint64(len(pageable))}}, cudacopy.RouteDriver)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		t.Fatalf("copy to pageable memory: %v", err)
	}
	if p.DeviceTime() <= 0 {
		t.Errorf("copy to pageable memory has no GPU time")
	}
}

func TestGPUCopierHostAndDevice(t *testing.T) {
	drv, nv := gpuEnv(t)
	c := newCopier(t, drv, cudacopy.Options{NVRTC: nv})
	const size = 8 << 20
	var dev cuda.DevicePtr
	var pinned uintptr
	err := drv.WithContext(c.Context(), func() error {
		var err error
		if dev, err = drv.MemAlloc(size); err != nil {
			return err
		}
		pinned, err = drv.MemHostAlloc(size)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(c.Context(), func() error { drv.MemFreeHost(pinned); return drv.MemFree(dev) })
	r := rand.New(rand.NewPCG(5, 6))
	segs := shapeNamed(t, "odd-sizes-odd-offsets").build(r, size)
	t.Run("pinned-host-to-device", func(t *testing.T) { checkCopies(t, drv, c, r, segs, size, uint64(pinned), uint64(dev)) })
	t.Run("device-to-pinned-host", func(t *testing.T) { checkCopies(t, drv, c, r, segs, size, uint64(dev), uint64(pinned)) })
}

func TestGPUKernelCache(t *testing.T) {
	drv, nv := gpuEnv(t)
	if nv == nil {
		t.Skip("needs NVRTC to fill the cache")
	}
	dir := t.TempDir()
	var origins []string
	for i := 0; i < 2; i++ {
		c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, CacheDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if c.Kernels() == nil {
			t.Fatalf("no kernels: %s", c.Reason())
		}
		origins = append(origins, c.Kernels().Origin)
		path := c.Kernels().CachePath
		c.Close()
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("cache entry: %v", err)
		}
	}
	if origins[0] != "nvrtc" || origins[1] != "cache" {
		t.Fatalf("origins %v, want [nvrtc cache]", origins)
	}
	// Without NVRTC the cached image still loads.
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{CacheDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() != cudacopy.ModeKernel {
		t.Fatalf("cached kernels without NVRTC: mode %s (%s)", c.Mode(), c.Reason())
	}
}

func TestGPUFallbackWithoutNVRTCSaysSo(t *testing.T) {
	drv, _ := gpuEnv(t)
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Mode() == cudacopy.ModeKernel || c.Reason() == "" {
		t.Fatalf("mode %s reason %q: want a driver mode and a reason", c.Mode(), c.Reason())
	}
	t.Logf("mode %s: %s", c.Mode(), c.Reason())
	fmt.Fprintln(os.Stderr, "fallback:", c.Mode(), c.Reason())
}

// TestGPUCopiesInFlightEndInAnyWaitOrder: copies in flight on one copier are waited for in reverse order, and
// again all at once from a goroutine each (the agent's unwaited transfers); every wait returns, within its
// deadline, and every byte lands.
func TestGPUCopiesInFlightEndInAnyWaitOrder(t *testing.T) {
	drv, nv := gpuEnv(t)
	c := newCopier(t, drv, cudacopy.Options{NVRTC: nv})
	const n, size = 8, 8 << 20
	src, dst, free := devicePair(t, drv, c, n*size)
	defer free()
	r := rand.New(rand.NewPCG(7, 7))
	data := randomBytes(r, n*size)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, data) }); err != nil {
		t.Fatal(err)
	}
	submit := func(round int) []*cudacopy.Pending {
		ps := make([]*cudacopy.Pending, n)
		for i := range ps {
			// Each round writes every chunk from another one, so a copy that did not run leaves the old bytes.
			from := (i + round) % n
			var err error
			ps[i], err = c.Submit([]cudacopy.Segment{{Src: uint64(src) + uint64(from*size), Dst: uint64(dst) + uint64(i*size), Size: size}})
			if err != nil {
				t.Fatal(err)
			}
		}
		return ps
	}
	check := func(round int) {
		got := make([]byte, n*size)
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			from := (i + round) % n
			if !bytes.Equal(got[i*size:(i+1)*size], data[from*size:(from+1)*size]) {
				t.Fatalf("round %d: chunk %d is not chunk %d of the source", round, i, from)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ps := submit(1)
	for i := n - 1; i >= 0; i-- {
		if err := ps[i].Wait(ctx); err != nil {
			t.Fatalf("waiting for copy %d of %d, the later ones first: %v", i, n, err)
		}
	}
	check(1)

	ps = submit(2)
	errs := make(chan error, n)
	for _, p := range ps {
		go func() { errs <- p.Wait(ctx) }()
	}
	for range ps {
		if err := <-errs; err != nil {
			t.Fatalf("waiting from a goroutine each: %v", err)
		}
	}
	check(2)

	// A wait whose deadline passes while an earlier copy is unfinished returns with it; the copy still ends.
	ps = submit(3)
	short, cancelShort := context.WithCancel(context.Background())
	cancelShort()
	if err := ps[n-1].Wait(short); err == nil && !ps[n-1].Done() {
		t.Fatal("a wait with an ended context returned no error for an unfinished copy")
	}
	for _, p := range ps {
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	check(3)
}

// TestGPUWaitersSeeTheDoneWord: every submission ends with a write of the copier's done word (by the stream, or
// by the kernel that runs last), which the waiter polls instead of the driver. The word must show a copy's number only once the copy's bytes
// are there: not right after a 512 MiB copy is queued (it runs for about 250 µs), and always when Wait returns.
func TestGPUWaitersSeeTheDoneWord(t *testing.T) {
	drv, nv := gpuEnv(t)
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			c.Close()
		}
	}()
	if on, why := c.DoneWord(); !on {
		t.Skipf("this driver cannot write a word from a stream (%s): waiters ask the driver", why)
	}
	const big, small = 512 << 20, 4096
	src, dst, free := devicePair(t, drv, c, big)
	freed := false
	defer func() {
		if !freed {
			free()
		}
	}()
	r := rand.New(rand.NewPCG(11, 11))
	data := randomBytes(r, big)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, data) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, err := c.Submit([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: big}})
	if err != nil {
		t.Fatal(err)
	}
	seq := p.DoneSeq()
	if seq == 0 {
		t.Fatal("a submission of a copier with a done word got no sequence number")
	}
	if c.DoneWordReached(seq) {
		t.Fatal("the done word showed a 512 MiB copy ended right after it was queued")
	}
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !c.DoneWordReached(seq) {
		t.Fatal("Wait returned before the done word showed the copy's end")
	}
	got := make([]byte, big)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the 512 MiB copy's bytes differ after its wait")
	}

	// Small copies one after another, each from another offset, on the kernel path: each wait sees its own bytes.
	for i := range 2000 {
		off := uint64(r.IntN(big/small)) * small
		p, err := c.Submit([]cudacopy.Segment{{Src: uint64(src) + off, Dst: uint64(dst), Size: small}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if p.DoneSeq() != seq+uint32(i)+1 || !c.DoneWordReached(p.DoneSeq()) {
			t.Fatalf("copy %d: sequence %d (previous %d), reached %v", i, p.DoneSeq(), seq+uint32(i), c.DoneWordReached(p.DoneSeq()))
		}
		if i%100 == 0 {
			got := make([]byte, small)
			if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data[off:off+small]) {
				t.Fatalf("copy %d: the 4 KiB at the destination are not the source's at %d", i, off)
			}
		}
	}

	// A waiter that polls after its copier closed (an agent shutting down) reads "not yet" instead of the
	// word the driver has unmapped, which would fault.
	last, err := c.Submit([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: small}})
	if err != nil {
		t.Fatal(err)
	}
	if err := last.Wait(ctx); err != nil || !c.DoneWordReached(last.DoneSeq()) {
		t.Fatalf("the last copy before closing: %v, reached %v", err, c.DoneWordReached(last.DoneSeq()))
	}
	free()
	freed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if c.DoneWordReached(last.DoneSeq()) {
		t.Fatal("a closed copier's done word still answered")
	}
}

// TestGPUBlockedWaitersRecordTheirOwnEvent: with the done word a submission records no completion event; a
// waiter that outlasts its spin records one behind the stream's work and blocks on it. Copies in flight waited
// for in reverse order each end with their own bytes, and a copier without the word still records its events.
func TestGPUBlockedWaitersRecordTheirOwnEvent(t *testing.T) {
	drv, nv := gpuEnv(t)
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, SpinWait: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if on, why := c.DoneWord(); !on {
		t.Skipf("this driver cannot write a word from a stream (%s): every submission records its event", why)
	}
	const part, parts = 128 << 20, 4
	src, dst, free := devicePair(t, drv, c, part*parts)
	defer free()
	r := rand.New(rand.NewPCG(12, 12))
	data := randomBytes(r, part*parts)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, data) }); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pend []*cudacopy.Pending
	for i := range parts {
		off := uint64(i) * part
		p, err := c.Submit([]cudacopy.Segment{{Src: uint64(src) + off, Dst: uint64(dst) + off, Size: part}})
		if err != nil {
			t.Fatal(err)
		}
		if p.HasEvent() {
			t.Fatalf("copy %d recorded a completion event although the done word tells its end", i)
		}
		pend = append(pend, p)
	}
	errs := make(chan error, parts)
	for i := parts - 1; i >= 0; i-- {
		go func(p *cudacopy.Pending) { errs <- p.Wait(ctx) }(pend[i])
	}
	for range parts {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range pend {
		if !p.Done() || !c.DoneWordReached(p.DoneSeq()) {
			t.Fatalf("copy %d: waited for, but done %v, word reached %v", i, p.Done(), c.DoneWordReached(p.DoneSeq()))
		}
	}
	got := make([]byte, part*parts)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("copies waited for by blocked waiters left other bytes than the source's")
	}

	// Timed copies keep their event: the GPU time is measured between two.
	timed, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, TimeDevice: true})
	if err != nil {
		t.Fatal(err)
	}
	defer timed.Close()
	p, err := timed.Submit([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: part}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasEvent() {
		t.Fatal("a timed copy recorded no completion event")
	}
	if err := p.Wait(ctx); err != nil || p.DeviceTime() <= 0 {
		t.Fatalf("timed copy: %v, GPU time %v", err, p.DeviceTime())
	}
}
