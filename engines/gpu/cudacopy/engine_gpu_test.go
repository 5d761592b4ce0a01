// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// gatedCUDA holds copies at a gate so the suite can keep a transfer in flight.
type gatedCUDA struct {
	*cudacopy.Backend
	mu   sync.Mutex
	gate chan struct{}
}

func (g *gatedCUDA) Copy(ctx context.Context, w engines.Work) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Backend.Copy(ctx, w)
}

func (g *gatedCUDA) close(testing.TB) func() {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{})
	g.gate = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.gate = nil
			g.mu.Unlock()
			close(ch)
		})
	}
}

// gpuEngine is the xgmi engine over the CUDA backend (and the host backend,
// with the disjointness check on).
func gpuEngine(t *testing.T) (*xgmi.Engine, *gatedCUDA, *cuda.Driver, cuda.Context) {
	drv, nv := gpuEnv(t)
	b, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedCUDA{Backend: b}
	eng, err := xgmi.New(xgmi.Options{Node: "node-a", CheckDisjoint: true}, g, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	mode, reason, err := b.Mode(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cuda backend on GPU 0: %s %s", mode, reason)
	dev, _ := drv.DeviceGet(0)
	ctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng.Close()
		b.Close()
		drv.PrimaryContextRelease(dev)
	})
	return eng, g, drv, ctx
}

func gpuDesc(id engines.MemoryID, ptr cuda.DevicePtr, size uint64) engines.MemoryDesc {
	return engines.MemoryDesc{ID: id, Node: "node-a", Size: size,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA, Device: 0},
		Handles:  engines.Handles{Ptr: uintptr(ptr)}}
}

func TestGPUEngineContract(t *testing.T) {
	eng, g, drv, ctx := gpuEngine(t)
	var next atomic.Uint64
	alloc := func(t testing.TB, size uint64) cuda.DevicePtr {
		var p cuda.DevicePtr
		if err := drv.WithContext(ctx, func() (err error) { p, err = drv.MemAlloc(size); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { drv.WithContext(ctx, func() error { return drv.MemFree(p) }) })
		return p
	}
	h := enginetest.Harness{
		Engine:     eng,
		Directions: []engines.Direction{engines.DirLocal},
		NewPair: func(t testing.TB, _ engines.Direction, size uint64) enginetest.Pair {
			src, dst := alloc(t, size), alloc(t, size)
			var ids [2]engines.MemoryID
			for i, p := range []cuda.DevicePtr{src, dst} {
				ids[i] = engines.MemoryID(fmt.Sprintf("node-a/gpu-%d", next.Add(1)))
				if _, err := eng.Register(context.Background(), gpuDesc(ids[i], p, size)); err != nil {
					t.Fatalf("Register: %v", err)
				}
			}
			return enginetest.Pair{Src: ids[0], Dst: ids[1], Size: size,
				Fill: func(off uint64, b []byte) {
					if err := drv.WithContext(ctx, func() error { return drv.MemcpyHtoD(src+cuda.DevicePtr(off), b) }); err != nil {
						t.Fatal(err)
					}
				},
				Read: func(off, n uint64) []byte {
					b := make([]byte, n)
					if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(b, dst+cuda.DevicePtr(off)) }); err != nil {
						t.Fatal(err)
					}
					return b
				},
			}
		},
		Gate:         g.close,
		SetDstNotify: func(_ engines.Direction, fn engines.NotifyFunc) { eng.SetNotifyHandler(fn) },
	}
	enginetest.Run(t, h)
}

func TestGPURegisterRefusesOverrunAndForeignPointers(t *testing.T) {
	eng, _, drv, ctx := gpuEngine(t)
	var p cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { p, err = drv.MemAlloc(1 << 20); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(p) })
	if _, err := eng.Register(context.Background(), gpuDesc("node-a/overrun", p+4096, 1<<20)); err == nil {
		t.Error("a region running past its allocation was registered")
	} else {
		t.Logf("overrun refused: %v", err)
	}
	host := make([]byte, 4096)
	if _, err := eng.Register(context.Background(), gpuDesc("node-a/hostptr", cuda.DevicePtr(hostAddr(host)), 4096)); err == nil {
		t.Error("a host pointer was registered as GPU memory")
	}
	d, err := eng.Register(context.Background(), gpuDesc("node-a/ok", p, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Handles.IPC) != engines.IPCHandleSize {
		t.Errorf("cuMemAlloc memory registered without an IPC handle for other processes")
	}
}

// TestGPUEngineHostAndDevice moves bytes both ways between host memory (an
// mmap'd buffer, pinned by the backend at registration, and a Go slice) and
// GPU memory through the engine, next to the host backend.
func TestGPUEngineHostAndDevice(t *testing.T) {
	eng, _, drv, ctx := gpuEngine(t)
	const size = 6<<20 + 123
	var dev cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { dev, err = drv.MemAlloc(size); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(dev) })
	mapped, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mapped)
	goHeap := make([]byte, size)
	r := rand.New(rand.NewPCG(11, 12))
	for _, host := range []struct {
		name string
		buf  []byte
	}{{"mmap", mapped}, {"go-heap", goHeap}} {
		t.Run(host.name, func(t *testing.T) {
			copy(host.buf, randomBytes(r, size))
			hid := engines.MemoryID("node-a/host-" + host.name)
			gid := engines.MemoryID("node-a/dev-" + host.name)
			if _, err := eng.Register(context.Background(), engines.MemoryDesc{ID: hid, Node: "node-a", Size: size,
				Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: host.buf}}); err != nil {
				t.Fatal(err)
			}
			if _, err := eng.Register(context.Background(), gpuDesc(gid, dev, size)); err != nil {
				t.Fatal(err)
			}
			defer func() {
				dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				eng.Deregister(dctx, hid)
				eng.Deregister(dctx, gid)
			}()
			// Host → GPU: scattered odd blocks; GPU → host: one large item back.
			var items []engines.Item
			for i, s := range r.Perm(size / 4096)[:500] {
				items = append(items, engines.Item{Src: hid, SrcOffset: uint64(s)*4096 + 7, Dst: gid, DstOffset: uint64(i) * 4096, Size: 4000, Tag: engines.Tag(i)})
			}
			run(t, eng, items)
			got := make([]byte, size)
			if err := drv.WithContext(ctx, func() error { return drv.MemcpyDtoH(got, dev) }); err != nil {
				t.Fatal(err)
			}
			for _, it := range items {
				if !bytes.Equal(got[it.DstOffset:it.DstOffset+it.Size], host.buf[it.SrcOffset:it.SrcOffset+it.Size]) {
					t.Fatalf("host → GPU tag %d differs", it.Tag)
				}
			}
			want := append([]byte(nil), got[:size-1]...)
			run(t, eng, []engines.Item{{Src: gid, Dst: hid, DstOffset: 1, Size: size - 1, Tag: 1}})
			if !bytes.Equal(host.buf[1:], want) {
				t.Fatal("GPU → host bytes differ")
			}
		})
	}
}

// TestGPURegisterLeavesCallersContext checks that registration, which works
// in the GPU's primary context, leaves the calling thread's context as it was.
func TestGPURegisterLeavesCallersContext(t *testing.T) {
	eng, _, drv, ctx := gpuEngine(t)
	var p cuda.DevicePtr
	if err := drv.WithContext(ctx, func() (err error) { p, err = drv.MemAlloc(1 << 20); return }); err != nil {
		t.Fatal(err)
	}
	defer drv.WithContext(ctx, func() error { return drv.MemFree(p) })
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := drv.CtxSetCurrent(0); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Register(context.Background(), gpuDesc("node-a/ctx", p, 1<<20)); err != nil {
		t.Fatal(err)
	}
	cur, err := drv.CtxGetCurrent()
	if err != nil || cur != 0 {
		t.Fatalf("after Register the thread's context is %#x (%v), want none as before", cur, err)
	}
}
