// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
)

// A copy-engine range copied again and again is captured once, on its second copy, and replayed from then on
// with every byte in place (a fresh source each time); a released mapping drops it and it is captured anew.
func TestGPUCopierReplaysRepeatedCopyEngineRanges(t *testing.T) {
	drv, nv := gpuEnv(t)
	if !drv.HasGraphs() {
		t.Skip("the driver exports no graph capture and launch")
	}
	var epoch atomic.Uint64
	var off []string // what the copiers reported off
	report := func(ord int, f cudacopy.Feature, why string) {
		off = append(off, fmt.Sprintf("GPU %d %s: %s", ord, f, why))
	}
	c := newCopier(t, drv, cudacopy.Options{NVRTC: nv, MappingEpoch: epoch.Load, FeatureOff: report})
	if c.Mode() != cudacopy.ModeKernel {
		t.Skipf("copies go to the copy engine by size only beside the kernels, which are unavailable: %s", c.Reason())
	}
	const size = 32 << 20 // past the default copy-engine threshold of 16 MiB
	src, dst, free := devicePair(t, drv, c, size)
	defer free()
	r := rand.New(rand.NewPCG(7, 11))
	whole := []cudacopy.Segment{{Size: size}}
	half := []cudacopy.Segment{{Src: size / 2, Dst: 0, Size: size / 2}, {Src: 0, Dst: size / 2, Size: size / 2}}
	for i := range 5 {
		checkCopies(t, drv, c, r, whole, size, uint64(src), uint64(dst))
		if got, off := c.ReplayCaptures(); off != "" || got != min(i, 1) {
			t.Fatalf("after %d copies of one range: %d captures (replays off: %q), want %d", i+1, got, off, min(i, 1))
		}
		if st := c.State(); st.Replayed != uint64(i) {
			t.Fatalf("after %d copies of one range: %d launched from the graph, want %d (all but the first)", i+1, st.Replayed, i)
		}
	}
	for range 3 {
		checkCopies(t, drv, c, r, half, size, uint64(src), uint64(dst))
	}
	if got, off := c.ReplayCaptures(); got != 3 || off != "" {
		t.Fatalf("two more ranges copied three times: %d captures in all (off %q), want 3", got, off)
	}
	epoch.Add(1) // some mapping was released: nothing kept may be launched again
	for range 3 {
		checkCopies(t, drv, c, r, whole, size, uint64(src), uint64(dst))
	}
	if got, off := c.ReplayCaptures(); got != 4 || off != "" {
		t.Fatalf("after a release, the range copied three times: %d captures in all (off %q), want 4", got, off)
	}
	// 4 launches of the whole range, then the two halves' 2 and 2, then the whole range's 2 after the release.
	if st := c.State(); st.Replayed != 10 || len(st.Off) != 0 {
		t.Fatalf("state after the copies: %+v, want 10 launched from graphs and nothing off", st)
	}
	// A copy without a mapping epoch (a copier of its own) never replays, and was not asked to: nothing reported.
	plain := newCopier(t, drv, cudacopy.Options{NVRTC: nv, FeatureOff: report})
	for range 3 {
		checkCopies(t, drv, plain, r, whole, size, uint64(src), uint64(dst))
	}
	if got, why := plain.ReplayCaptures(); got != 0 || why == "" {
		t.Fatalf("a copier without a mapping epoch: %d captures (off: %q)", got, why)
	}
	if len(off) != 0 {
		t.Fatalf("copiers with their kernels, done word and (asked for) replays reported %q off", off)
	}
}

// BenchmarkGPUCopyEngineReplay times one waited 64 MiB copy within one GPU through the copier, queued as a
// cuMemcpyAsync (a copier without a mapping epoch) and replayed from its kept graph, beside the bare
// cuMemcpyAsync with a stream synchronize in the same run (the ceiling): the host time a replay saves before
// the copy starts is what a waited call through the agent gains; then what a capture costs the copy that makes it
// ("capture+destroy").
func BenchmarkGPUCopyEngineReplay(b *testing.B) {
	drv, nv := gpuEnv(b)
	var epoch atomic.Uint64
	replayed := newCopier(b, drv, cudacopy.Options{NVRTC: nv, MappingEpoch: epoch.Load})
	plain := newCopier(b, drv, cudacopy.Options{NVRTC: nv})
	if replayed.Mode() != cudacopy.ModeKernel || !drv.HasGraphs() {
		b.Skipf("needs the kernels and graphs: mode %s (%s), graphs %v", replayed.Mode(), replayed.Reason(), drv.HasGraphs())
	}
	const size = 64 << 20
	src, dst, free := devicePair(b, drv, plain, size)
	defer free()
	segs := []cudacopy.Segment{{Src: uint64(src), Dst: uint64(dst), Size: size}}
	waited := func(c *cudacopy.Copier) func() error {
		return func() error {
			p, err := c.Submit(segs)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return p.Wait(ctx)
		}
	}
	bare := func() error {
		return drv.WithContext(plain.Context(), func() error {
			if err := drv.MemcpyAsync(uint64(dst), uint64(src), size, plain.Stream()); err != nil {
				return err
			}
			return drv.StreamSynchronize(plain.Stream())
		})
	}
	for _, bc := range []struct {
		name string
		copy func() error
	}{{"memcpy+sync", bare}, {"copier", waited(plain)}, {"copier-replayed", waited(replayed)}} {
		b.Run(bc.name, func(b *testing.B) {
			for range 20 { // warm-up; the replayed copier captures the range at its second copy
				if err := bc.copy(); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			for b.Loop() {
				if err := bc.copy(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	if n, off := replayed.ReplayCaptures(); n != 1 || off != "" {
		b.Fatalf("the replayed copier captured %d ranges (off %q), want 1", n, off)
	}
	// What a range's second copy adds to its host time, under the copier's lock: capturing and instantiating
	// the copy, and destroying the graph again (as a release or an eviction does).
	b.Run("capture+destroy", func(b *testing.B) {
		err := drv.WithContext(plain.Context(), func() error {
			s, err := drv.StreamCreate()
			if err != nil {
				return err
			}
			defer drv.StreamDestroy(s)
			for b.Loop() {
				x, err := drv.CaptureCopy(uint64(dst), uint64(src), size, s)
				if err != nil {
					return err
				}
				if err := drv.GraphExecDestroy(x); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	})
}

// Through the engine, as the agent copies: a large item copied again is replayed from the backend copier's graph,
// every byte in place each time; deregistering one of its regions drops the graph, and the same memory registered
// anew is copied correctly and captured again only at its second copy.
func TestGPUEngineReplaysRangesUntilARegionIsReleased(t *testing.T) {
	eng, g, drv, ctx := gpuEngine(t)
	c, err := g.CopierOf(0)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != cudacopy.ModeKernel || !drv.HasGraphs() {
		t.Skipf("needs the kernels and graphs: mode %s (%s), graphs %v", c.Mode(), c.Reason(), drv.HasGraphs())
	}
	const size = 32 << 20
	src, dst, free := devicePair(t, drv, c, size)
	defer free()
	register := func(id engines.MemoryID, p cuda.DevicePtr) {
		if _, err := eng.Register(context.Background(), gpuDesc(id, p, size)); err != nil {
			t.Fatal(err)
		}
	}
	register("node-a/replay-src", src)
	register("node-a/replay-dst", dst)
	r := rand.New(rand.NewPCG(5, 6))
	copyOnce := func(dstID engines.MemoryID) {
		t.Helper()
		want := randomBytes(r, size)
		if err := drv.WithContext(ctx, func() error { return drv.MemcpyHtoD(src, want) }); err != nil {
			t.Fatal(err)
		}
		run(t, eng, []engines.Item{{Src: "node-a/replay-src", Dst: dstID, Size: size, Tag: 1}})
		got := make([]byte, size)
		if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(got, dst) }); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("the destination differs from the source after the copy")
		}
	}
	captures := func() int {
		n, off := c.ReplayCaptures()
		if off != "" {
			t.Fatalf("replays stopped: %s", off)
		}
		return n
	}
	for range 3 {
		copyOnce("node-a/replay-dst")
	}
	if n := captures(); n != 1 {
		t.Fatalf("one range copied three times through the engine: %d captures, want 1", n)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := eng.Deregister(dctx, "node-a/replay-dst"); err != nil {
		t.Fatal(err)
	}
	register("node-a/replay-dst-again", dst)
	copyOnce("node-a/replay-dst-again")
	if n := captures(); n != 1 {
		t.Fatalf("the first copy after a release: %d captures, want still 1 (the range is new again)", n)
	}
	copyOnce("node-a/replay-dst-again")
	if n := captures(); n != 2 {
		t.Fatalf("the second copy after a release: %d captures, want 2", n)
	}
}
