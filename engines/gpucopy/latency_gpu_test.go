package gpucopy_test

import (
	"context"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpucopy"
	"github.com/fabricxfer/fabricxfer/engines/internal/scatter"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// BenchmarkGPULatencyLadder times one small block copy, waited for, at each floor of the stack the socket
// path climbs: the driver alone (launch, record, poll), the copier (descriptors from ids, launch, wait), the
// xgmi engine (plan, tracker, completion) and the composite above it. The difference between two floors is
// what that floor costs per transfer; the driver floor is what any process on this GPU pays.
func BenchmarkGPULatencyLadder(b *testing.B) {
	drv, nv := gpuEnv(b)
	const bs, blocks = 4096, 16
	for _, shape := range []struct {
		name   string
		bs     uint64
		blocks int
		ids    int
	}{{"1x4KiB", bs, blocks, 1}, {"15360x720B", 720, 1 << 18, 15360}} {
		size := shape.bs * uint64(shape.blocks)
		srcIDs, dstIDs := make([]uint32, shape.ids), make([]uint32, shape.ids)
		for i := range srcIDs {
			srcIDs[i] = uint32(i)
			dstIDs[i] = uint32(shape.blocks - 1 - i)
		}
		b.Run(shape.name+"/driver", func(b *testing.B) {
			c, err := gpucopy.NewCopier(drv, 0, gpucopy.Options{NVRTC: nv})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			src, dst := allocPair(b, drv, c, size)
			n := uint64(shape.ids) * shape.bs
			err = drv.WithContext(c.Context(), func() error {
				ev, err := drv.EventCreate(false)
				if err != nil {
					return err
				}
				defer drv.EventDestroy(ev)
				return timed(b, func() error {
					if err := c.LaunchContiguous(uint64(dst), uint64(src), n); err != nil {
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
		b.Run(shape.name+"/copier", func(b *testing.B) {
			c, err := gpucopy.NewCopier(drv, 0, gpucopy.Options{NVRTC: nv})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			src, dst := allocPair(b, drv, c, size)
			pairs := []scatter.BlockBases{{Src: uint64(src), Dst: uint64(dst)}}
			ctx := context.Background()
			srcRange, dstRange := idRange(srcIDs), idRange(dstIDs) // planning's pass, not timed here
			if err := timed(b, func() error {
				p, err := c.SubmitBlocks(pairs, shape.bs, srcIDs, dstIDs, srcRange, dstRange)
				if err != nil {
					return err
				}
				return p.Wait(ctx)
			}); err != nil {
				b.Fatal(err)
			}
		})
		b.Run(shape.name+"/copier-checked", func(b *testing.B) {
			c, err := gpucopy.NewCopier(drv, 0, gpucopy.Options{NVRTC: nv})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			src, dst := allocPair(b, drv, c, size)
			pairs := []scatter.BlockBases{{Src: uint64(src), Dst: uint64(dst)}}
			ctx := context.Background()
			if err := timed(b, func() error {
				p, err := c.SubmitCheckedBlocks(pairs, shape.bs, srcIDs, dstIDs, uint32(shape.blocks), uint32(shape.blocks))
				if err != nil {
					return err
				}
				return p.Wait(ctx)
			}); err != nil {
				b.Fatal(err)
			}
		})
		for _, composite := range []bool{false, true} {
			name := shape.name + "/engine"
			if composite {
				name = shape.name + "/composite"
			}
			b.Run(name, func(b *testing.B) {
				be, err := gpucopy.NewBackend(drv, gpucopy.Options{NVRTC: nv})
				if err != nil {
					b.Fatal(err)
				}
				defer be.Close()
				x, err := xgmi.New(xgmi.Options{Node: "node-a"}, be, xgmi.NewHostBackend())
				if err != nil {
					b.Fatal(err)
				}
				var eng engines.Engine = x
				if composite {
					if eng, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x); err != nil {
						b.Fatal(err)
					}
				}
				defer eng.Close()
				c, err := gpucopy.NewCopier(drv, 0, gpucopy.Options{NVRTC: nv})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				src, dst := allocPair(b, drv, c, size)
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
					t, err := eng.Submit(ctx, plan.Build(), engines.SubmitOptions{})
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

// allocPair allocates two device buffers of size on c's GPU, freed when b ends.
func allocPair(b *testing.B, drv *cuda.Driver, c *gpucopy.Copier, size uint64) (src, dst cuda.DevicePtr) {
	b.Helper()
	err := drv.WithContext(c.Context(), func() error {
		var err error
		if src, err = drv.MemAlloc(size); err != nil {
			return err
		}
		dst, err = drv.MemAlloc(size)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = drv.WithContext(c.Context(), func() error { drv.MemFree(src); drv.MemFree(dst); return nil })
	})
	return src, dst
}

// BenchmarkGPUDriverWaits compares ways of waiting for one small copy on this GPU (the floor of every round
// trip): the kernel or the copy engine, completion seen by polling an event, by the driver's event or stream
// synchronize, and, for scale, a launch alone (queued back to back) and a query of a completed event. Large
// copies (64 MiB, 1 GiB) compare the contiguous kernel with the copy engine.
func BenchmarkGPUDriverWaits(b *testing.B) {
	drv, nv := gpuEnv(b)
	c, err := gpucopy.NewCopier(drv, 0, gpucopy.Options{NVRTC: nv})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	src, dst := allocPair(b, drv, c, 1<<30)
	s := c.Stream()
	// Sub-benchmarks run on goroutines of their own: each makes the copier's context current on its thread.
	in := func(b *testing.B, fn func() error) {
		if err := drv.WithContext(c.Context(), fn); err != nil {
			b.Fatal(err)
		}
	}
	var ev cuda.Event
	in(b, func() error { var err error; ev, err = drv.EventCreate(false); return err })
	defer in(b, func() error { return drv.EventDestroy(ev) })
	kernel := func(n uint64) error { return c.LaunchContiguous(uint64(dst), uint64(src), n) }
	engine := func(n uint64) error { return drv.MemcpyDtoDAsync(dst, src, n, s) }
	poll := func() error {
		if err := drv.EventRecord(ev, s); err != nil {
			return err
		}
		for {
			if done, err := drv.EventQuery(ev); err != nil || done {
				return err
			}
		}
	}
	evSync := func() error {
		if err := drv.EventRecord(ev, s); err != nil {
			return err
		}
		return drv.EventSynchronize(ev)
	}
	streamSync := func() error { return drv.StreamSynchronize(s) }
	for _, tc := range []struct {
		name string
		n    uint64
		copy func(uint64) error
		wait func() error
	}{
		{"4KiB/kernel/poll", 4 << 10, kernel, poll},
		{"4KiB/kernel/event-sync", 4 << 10, kernel, evSync},
		{"4KiB/kernel/stream-sync", 4 << 10, kernel, streamSync},
		{"4KiB/copy-engine/poll", 4 << 10, engine, poll},
		{"4KiB/copy-engine/stream-sync", 4 << 10, engine, streamSync},
		{"64MiB/kernel/poll", 64 << 20, kernel, poll},
		{"64MiB/copy-engine/poll", 64 << 20, engine, poll},
		{"1GiB/kernel/poll", 1 << 30, kernel, poll},
		{"1GiB/copy-engine/poll", 1 << 30, engine, poll},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(tc.n))
			in(b, func() error {
				return timed(b, func() error {
					if err := tc.copy(tc.n); err != nil {
						return err
					}
					return tc.wait()
				})
			})
		})
	}
	b.Run("4KiB/kernel/launch-only", func(b *testing.B) {
		in(b, func() error {
			for i := range b.N {
				if err := kernel(4 << 10); err != nil {
					return err
				}
				if i%256 == 255 {
					b.StopTimer()
					_ = streamSync()
					b.StartTimer()
				}
			}
			b.StopTimer()
			return streamSync()
		})
	})
	b.Run("query-completed-event", func(b *testing.B) {
		in(b, func() error {
			if err := evSync(); err != nil {
				return err
			}
			for range b.N {
				if _, err := drv.EventQuery(ev); err != nil {
					return err
				}
			}
			return nil
		})
	})
}
