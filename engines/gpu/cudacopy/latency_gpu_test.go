// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"context"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// BenchmarkGPULatencyLadder times one block copy (4 KiB, a KV batch, 64 MiB), waited for, at each floor of the stack the socket
// path climbs: the driver alone (the contiguous kernel or the copy engine: launch, record, poll), the copier (descriptors from ids, launch, wait), the
// xgmi engine (plan, tracker, completion) and the composite above it. The difference between two floors is
// what that floor costs per transfer; the driver floor is what any process on this GPU pays.
func BenchmarkGPULatencyLadder(b *testing.B) {
	drv, nv := gpuEnv(b)
	const bs, blocks = 4096, 16
	// benchCopier is a fresh copier with a source and a destination of size bytes, released when b ends.
	benchCopier := func(b *testing.B, size uint64) (*cudacopy.Copier, cuda.DevicePtr, cuda.DevicePtr) {
		c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv})
		if err != nil {
			b.Fatal(err)
		}
		src, dst, free := devicePair(b, drv, c, size)
		b.Cleanup(func() { free(); c.Close() })
		return c, src, dst
	}
	for _, shape := range []struct {
		name   string
		bs     uint64
		blocks int
		ids    int
	}{{"1x4KiB", bs, blocks, 1}, {"15360x720B", 720, 1 << 18, 15360}, {"1x64MiB", 64 << 20, 2, 1}} {
		size := shape.bs * uint64(shape.blocks)
		srcIDs, dstIDs := make([]uint32, shape.ids), make([]uint32, shape.ids)
		for i := range srcIDs {
			srcIDs[i] = uint32(i)
			dstIDs[i] = uint32(shape.blocks - 1 - i)
		}
		// The floors: the contiguous kernel, and the copy engine (cuMemcpyAsync), each launched and its event polled.
		for _, floor := range []string{"/driver", "/copy-engine"} {
			b.Run(shape.name+floor, func(b *testing.B) {
				c, src, dst := benchCopier(b, size)
				n := uint64(shape.ids) * shape.bs
				err := drv.WithContext(c.Context(), func() error {
					ev, err := drv.EventCreate(false)
					if err != nil {
						return err
					}
					defer drv.EventDestroy(ev)
					return timed(b, func() error {
						if floor == "/driver" {
							err = c.LaunchContiguous(uint64(dst), uint64(src), n)
						} else {
							err = drv.MemcpyAsync(uint64(dst), uint64(src), n, c.Stream())
						}
						if err != nil {
							return err
						}
						if err := drv.EventRecord(ev, c.Stream()); err != nil {
							return err
						}
						for {
							if done, err := drv.EventQuery(ev); err != nil || done {
								return err
							}
						}
					})
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
		srcRange, dstRange := idRange(srcIDs), idRange(dstIDs) // planning's pass, not timed here
		for _, checked := range []bool{false, true} {
			name := map[bool]string{false: "/copier", true: "/copier-checked"}[checked]
			b.Run(shape.name+name, func(b *testing.B) {
				c, src, dst := benchCopier(b, size)
				if checked && !c.CanCheckBlocks(shape.bs, uint32(shape.blocks)) {
					b.Skipf("%d-byte blocks are not checked on the GPU (the copy engine takes them)", shape.bs)
				}
				pairs := []scatter.BlockBases{{Src: uint64(src), Dst: uint64(dst)}}
				ctx := context.Background()
				if err := timed(b, func() error {
					var p *cudacopy.Pending
					var err error
					if checked {
						p, err = c.SubmitCheckedBlocks(pairs, shape.bs, srcIDs, dstIDs, uint32(shape.blocks), uint32(shape.blocks))
					} else {
						p, err = c.SubmitBlocks(pairs, shape.bs, srcIDs, dstIDs, srcRange, dstRange)
					}
					if err != nil {
						return err
					}
					return p.Wait(ctx)
				}); err != nil {
					b.Fatal(err)
				}
			})
		}
		for _, composite := range []bool{false, true} {
			name := shape.name + "/engine"
			if composite {
				name = shape.name + "/composite"
			}
			b.Run(name, func(b *testing.B) {
				be, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				// The composite as the agent assembles it: one region table shared by the engine and the composite.
				var shared *engines.Registry
				if composite {
					shared = engines.NewRegistry("node-a", 0)
				}
				x, err := xgmi.New(xgmi.Options{Node: "node-a", Registry: shared}, be, xgmi.NewHostBackend())
				if err != nil {
					b.Fatal(err)
				}
				var eng engines.Engine = x
				if composite {
					if eng, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a", Registry: shared}, x); err != nil {
						b.Fatal(err)
					}
				}
				defer eng.Close()
				_, src, dst := benchCopier(b, size) // the copier only holds the context the memory is allocated in
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				for _, d := range []engines.MemoryDesc{gpuDesc("src", src, size), gpuDesc("dst", dst, size)} {
					if _, err := eng.Register(ctx, d); err != nil {
						b.Fatal(err)
					}
				}
				batch := engines.Blocks{Pairs: []engines.BlockPair{{Src: "src", Dst: "dst"}}, BlockBytes: shape.bs,
					SrcIDs: srcIDs, DstIDs: dstIDs}
				if err := timed(b, func() error {
					plan := eng.NewPlan()
					if err := plan.(engines.BlockAdder).AddBlocks(batch); err != nil {
						return err
					}
					t, err := eng.Submit(ctx, plan.Build(), engines.SubmitOptions{Waited: true}) // as the socket submits a waited call
					if err != nil {
						return err
					}
					return t.Wait(ctx)
				}); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// timed runs op for a warm-up of 200 ms first (a GPU idling at its lowest clock takes about that long to
// come up, and the first thousands of round trips would measure its clock, not the code), then b.N times.
func timed(b *testing.B, op func() error) error {
	for start := time.Now(); time.Since(start) < 200*time.Millisecond; {
		if err := op(); err != nil {
			return err
		}
	}
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			return err
		}
	}
	return nil
}
