// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi_test

import (
	"context"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// BenchmarkSubmitWait is the engine's own cost around one copy that goes through its worker goroutines (a host
// copy above the inline limit): plan, submit, wait. BenchmarkPlainCopy is the same bytes with copy().
func BenchmarkSubmitWait(b *testing.B) {
	const size = 128 << 10
	copyAll := hostCopyRig(b, make([]byte, size), make([]byte, size))
	b.SetBytes(size)
	for b.Loop() {
		copyAll()
	}
}

// hostCopyRig registers src and dst (of one size) with an engine of the host backend and returns one copy of
// all of src to dst through it: plan, submit, wait.
func hostCopyRig(b *testing.B, src, dst []byte) func() {
	size := uint64(len(src))
	e, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	ctx := context.Background()
	reg := func(id string, mem []byte) engines.MemoryDesc {
		d, err := e.Register(ctx, engines.MemoryDesc{ID: engines.MemoryID(id), Node: "node-a",
			Location: engines.Location{Kind: engines.LocationHost}, Size: size, Handles: engines.Handles{Host: mem}})
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	s, d := reg("node-a/src", src), reg("node-a/dst", dst)
	return func() {
		p := e.NewPlan()
		if err := p.Add(engines.Item{Src: s.ID, Dst: d.ID, Size: size, Tag: 1}); err != nil {
			b.Fatal(err)
		}
		tr, err := e.Submit(ctx, p.Build(), engines.SubmitOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := tr.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPlainCopy(b *testing.B) {
	const size = 128 << 10
	src, dst := make([]byte, size), make([]byte, size)
	b.SetBytes(size)
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkWaitedBlock is the engine's own cost around one small block copy submitted as waited and seen done
// by its waiter's first poll, the shape of a GPU block copy of a few microseconds: what the engine adds to the
// copier's floor per transfer (plan, tracker, completion), with the host's copy of 4 KiB standing in for the GPU.
func BenchmarkWaitedBlock(b *testing.B) {
	for _, composite := range []bool{false, true} {
		b.Run(map[bool]string{false: "engine", true: "composite"}[composite], func(b *testing.B) {
			copyOne := waitedBlockRig(b, composite)
			b.ReportAllocs()
			for b.Loop() {
				copyOne()
			}
		})
	}
}

// TestWaitedBlockAllocations bounds the allocations of one waited block copy through the engine and through the
// composite (BenchmarkWaitedBlock's copy): each is work for the collector on the latency-bound path, and the
// tracker (its context too: no timer until someone waits on Done), the registry's pins and the composite's wrapper
// of a one-part transfer keep their state inline. The composite is assembled as the agent's (one region table
// shared with the engine: 10 allocations; with a table of each engine's own, a path the agent does not take, 16).
// The bounds leave three for pools the collector emptied.
func TestWaitedBlockAllocations(t *testing.T) {
	for _, tc := range []struct {
		composite bool
		most      float64
	}{{false, 14}, {true, 13}} {
		copyOne := waitedBlockRig(t, tc.composite)
		copyOne()
		if got := testing.AllocsPerRun(500, copyOne); got > tc.most {
			t.Errorf("composite %v: %.1f allocations a copy, want at most %.0f", tc.composite, got, tc.most)
		}
	}
}

// waitedBlockRig registers two host regions of 16 blocks of 4 KiB with an engine whose backend's block copies
// end on their first poll (enginetest.PollingHost), through the composite when asked (assembled as the agent
// assembles it: one region table shared by the engine and the composite), and returns one waited copy of one
// block between them.
func waitedBlockRig(tb testing.TB, composite bool) func() {
	h := enginetest.NewPollingHost(1)
	var shared *engines.Registry
	if composite {
		shared = engines.NewRegistry("node-a", 0)
	}
	e, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: shared}, h)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	var eng engines.Engine = e
	if composite {
		c, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: shared}, e)
		if err != nil {
			tb.Fatal(err)
		}
		eng = c
	}
	ctx := context.Background()
	const bs, blocks = 4096, 16
	for _, id := range []string{"node-a/s", "node-a/d"} {
		if _, err := eng.Register(ctx, engines.MemoryDesc{ID: engines.MemoryID(id), Node: "node-a", Size: bs * blocks,
			Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: make([]byte, bs*blocks)}}); err != nil {
			tb.Fatal(err)
		}
	}
	tb.Cleanup(func() {
		for _, id := range []string{"node-a/s", "node-a/d"} {
			_ = eng.Deregister(ctx, engines.MemoryID(id))
		}
	})
	batch := engines.Blocks{Pairs: []engines.BlockPair{{Src: "node-a/s", Dst: "node-a/d"}}, BlockBytes: bs,
		SrcIDs: []uint32{3}, DstIDs: []uint32{9}}
	return func() {
		plan := eng.NewPlan()
		if err := plan.(engines.BlockAdder).AddBlocks(batch); err != nil {
			tb.Fatal(err)
		}
		t, err := eng.Submit(ctx, plan.Build(), engines.SubmitOptions{Waited: true})
		if err != nil {
			tb.Fatal(err)
		}
		if err := t.Wait(ctx); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkLargeHostCopy is a 256 MiB host copy through the engine (its parts on every processor, yielding
// between chunks) beside one memmove of the same bytes (the ceiling), in the same run.
func BenchmarkLargeHostCopy(b *testing.B) {
	const size = 256 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // both touched before timing
	b.Run("engine", func(b *testing.B) {
		copyAll := hostCopyRig(b, src, dst)
		b.SetBytes(size)
		for b.Loop() {
			copyAll()
		}
	})
	b.Run("memmove", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			copy(dst, src)
		}
	})
}
