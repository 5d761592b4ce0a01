// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
)

// TestGPUContiguousKernelMovesAnyRange sends single ranges below the copy engine's threshold (the contiguous
// kernel, its addresses as the launch's arguments) of sizes around its grid's shapes, at every relative alignment,
// and checks every byte of the destination, the bytes around the range included.
func TestGPUContiguousKernelMovesAnyRange(t *testing.T) {
	drv, nv := gpuEnv(t)
	if nv == nil {
		t.Skip("needs NVRTC: without it every range goes to the driver")
	}
	c := newCopier(t, drv, cudacopy.Options{NVRTC: nv})
	if c.Mode() != cudacopy.ModeKernel {
		t.Skipf("copier in mode %s: %s", c.Mode(), c.Reason())
	}
	const size = 17 << 20
	src, dst, free := devicePair(t, drv, c, size)
	defer free()
	r := rand.New(rand.NewPCG(11, 12))
	for _, n := range []uint64{1, 15, 4095, 4097, 16384 + 7, 1<<20 + 3, 16<<20 - 48} {
		for _, off := range [][2]uint64{{0, 0}, {1, 0}, {8, 24}, {20, 4}, {4096 + 3, 5}} {
			segs := []cudacopy.Segment{{Src: off[0], Dst: off[1], Size: n}}
			t.Run(fmt.Sprintf("%dB-from-%d-to-%d", n, off[0], off[1]), func(t *testing.T) {
				if p := checkCopies(t, drv, c, r, segs, size, uint64(src), uint64(dst)); !p.SignalledByKernel() {
					t.Errorf("a %d-byte range was not moved by the kernel (it writes the done word itself)", n)
				}
			})
		}
	}
}

// BenchmarkGPUContiguousCopy times one waited copy of a large range within one GPU (launch, record an event, poll
// it) through the copy engine and through the copier's contiguous kernel, with each one's GPU time by events
// ("gpu-us"): why ranges from Options.CopyEngineMin (16 MiB) up go to the copy engine.
func BenchmarkGPUContiguousCopy(b *testing.B) {
	drv, nv := gpuEnv(b)
	if nv == nil {
		b.Skip("needs NVRTC for the contiguous kernel")
	}
	c := newCopier(b, drv, cudacopy.Options{NVRTC: nv})
	routes := []struct {
		name   string
		launch func(dst, src, n uint64) error
	}{
		{"copy-engine", func(dst, src, n uint64) error { return drv.MemcpyAsync(dst, src, n, c.Stream()) }},
		{"kernel", func(dst, src, n uint64) error { return c.LaunchContiguous(dst, src, n) }},
	}
	for _, size := range []uint64{16 << 20, 64 << 20, 256 << 20, 1 << 30} {
		src, dst, free := devicePair(b, drv, c, size)
		want := randomBytes(rand.New(rand.NewPCG(size, 5)), int(size))
		if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, want) }); err != nil {
			b.Fatal(err)
		}
		for _, r := range routes {
			b.Run(fmt.Sprintf("%dMiB/%s", size>>20, r.name), func(b *testing.B) {
				err := drv.WithContext(c.Context(), func() error {
					ev, err := drv.EventCreate(false)
					if err != nil {
						return err
					}
					defer drv.EventDestroy(ev)
					waited := func() error {
						if err := r.launch(uint64(dst), uint64(src), size); err != nil {
							return err
						}
						if err := drv.EventRecord(ev, c.Stream()); err != nil {
							return err
						}
						for deadline := time.Now().Add(10 * time.Second); ; {
							if done, err := drv.EventQuery(ev); err != nil || done {
								return err
							}
							if time.Now().After(deadline) {
								return fmt.Errorf("a %d-byte copy not done within 10 s", size)
							}
						}
					}
					// The stream is non-blocking: the memset is waited for before the copy may start.
					if err := drv.MemsetD8(dst, 0, size); err != nil {
						return err
					}
					if err := drv.CtxSynchronize(); err != nil {
						return err
					}
					if err := waited(); err != nil {
						return err
					}
					got := make([]byte, size)
					if err := drv.MemcpyDtoH(got, dst); err != nil {
						return err
					}
					if !bytes.Equal(got, want) {
						return fmt.Errorf("the copy differs from its source at byte %d", firstDiff(got, want))
					}
					if err := timed(b, waited); err != nil {
						return err
					}
					b.StopTimer()
					gpu, err := gpuMicros(drv, c.Stream(), func() error { return r.launch(uint64(dst), uint64(src), size) }, 30)
					b.ReportMetric(gpu, "gpu-us")
					b.SetBytes(int64(size))
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
		free()
	}
}

// gpuMicros is the median GPU time in µs of n launches, each between two timing events.
func gpuMicros(drv *cuda.Driver, s cuda.Stream, launch func() error, n int) (float64, error) {
	start, err := drv.EventCreate(true)
	if err != nil {
		return 0, err
	}
	defer drv.EventDestroy(start)
	end, err := drv.EventCreate(true)
	if err != nil {
		return 0, err
	}
	defer drv.EventDestroy(end)
	times := make([]float64, 0, n)
	for range n {
		if err := drv.EventRecord(start, s); err != nil {
			return 0, err
		}
		if err := launch(); err != nil {
			return 0, err
		}
		if err := drv.EventRecord(end, s); err != nil {
			return 0, err
		}
		if err := drv.EventSynchronize(end); err != nil {
			return 0, err
		}
		ms, err := drv.EventElapsed(start, end)
		if err != nil {
			return 0, err
		}
		times = append(times, float64(ms)*1e3)
	}
	sort.Float64s(times)
	return times[len(times)/2], nil
}

// BenchmarkGPUCopyEngineStreams times the same 64 MiB copy-engine copy within one GPU on the context's legacy
// stream and on eight fresh non-blocking streams (the kind the copier creates), GPU time by events ("gpu-us"):
// does the stream a copy is queued on decide its speed? Through the socket the 64 MiB call's median moved by
// 15 µs between agent starts while torch's own copy held within 3.5 µs (H200, 2026-12-05 12:13); a stream
// bound to a slower copy engine would do that. It does not: 38.0–39.7 µs on every stream (H200, 2026-12-06 03:05).
func BenchmarkGPUCopyEngineStreams(b *testing.B) {
	drv, _ := gpuEnv(b)
	c := newCopier(b, drv, cudacopy.Options{})
	const size = 64 << 20
	src, dst, free := devicePair(b, drv, c, size)
	defer free()
	const legacy = cuda.Stream(1) // CU_STREAM_LEGACY
	streams := []cuda.Stream{legacy}
	err := drv.WithContext(c.Context(), func() error {
		for range 8 {
			s, err := drv.StreamCreate()
			if err != nil {
				return err
			}
			streams = append(streams, s)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = drv.WithContext(c.Context(), func() error {
			for _, s := range streams[1:] {
				_ = drv.StreamDestroy(s)
			}
			return nil
		})
	}()
	for i, s := range streams {
		name := fmt.Sprintf("stream%d", i)
		if s == legacy {
			name = "legacy"
		}
		b.Run(name, func(b *testing.B) {
			err := drv.WithContext(c.Context(), func() error {
				copyOnce := func() error { return drv.MemcpyAsync(uint64(dst), uint64(src), size, s) }
				if _, err := gpuMicros(drv, s, copyOnce, 20); err != nil { // warm-up
					return err
				}
				b.ResetTimer()
				gpu, err := gpuMicros(drv, s, copyOnce, max(b.N, 50))
				b.ReportMetric(gpu, "gpu-us")
				b.SetBytes(size)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
