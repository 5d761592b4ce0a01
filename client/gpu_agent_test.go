// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
)

// gpuAgentSocket is the socket of an agent running with its GPU engines in another process (the IPC handles this
// test registers cannot be opened by the process that made them), as the Python GPU tests use it.
func gpuAgentSocket(tb testing.TB) string {
	tb.Helper()
	s := os.Getenv("FABRICXFER_SOCKET")
	if s == "" {
		tb.Skip("needs an agent with GPU engines in another process: set FABRICXFER_SOCKET to its socket (agent standalone)")
	}
	return s
}

// gpuBuffers is device memory of GPU 0 the test fills and reads back.
type gpuBuffers struct {
	tb  testing.TB
	drv *cuda.Driver
	ctx cuda.Context
}

func (g gpuBuffers) do(fn func() error) {
	g.tb.Helper()
	if err := g.drv.WithContext(g.ctx, fn); err != nil {
		g.tb.Fatal(err)
	}
}

func (g gpuBuffers) write(p cuda.DevicePtr, b []byte) {
	g.do(func() error { return g.drv.MemcpyHtoD(p, b) })
}

func (g gpuBuffers) read(p cuda.DevicePtr, n uint64) []byte {
	b := make([]byte, n)
	g.do(func() error { return g.drv.MemcpyDtoH(b, p) })
	return b
}

// gpuRegions is two allocations of GPU 0 registered through an agent in another process, each as regions of one
// size (two: a layer's K and V): the source a cudaMalloc allocation by its IPC handle, the destination a VMM
// allocation by its POSIX fd.
type gpuRegions struct {
	gpuBuffers
	c                      *client.Client
	src, dst               cuda.DevicePtr
	srcRegions, dstRegions []*client.Region
}

// registerGPURegions sets up gpuRegions of n regions of size bytes a side; everything is released when tb ends.
func registerGPURegions(tb testing.TB, ctx context.Context, size, n uint64) *gpuRegions {
	tb.Helper()
	socket := gpuAgentSocket(tb)
	drv, err := cuda.Load()
	if err != nil {
		tb.Skipf("needs a GPU: %v", err)
	}
	if n, err := drv.DeviceCount(); err != nil || n == 0 {
		tb.Skipf("needs a GPU: %d devices, %v", n, err)
	}
	dev, err := drv.DeviceGet(0)
	if err != nil {
		tb.Fatal(err)
	}
	cctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = drv.PrimaryContextRelease(dev) })
	g := &gpuRegions{gpuBuffers: gpuBuffers{tb: tb, drv: drv, ctx: cctx}}
	var vmm *cuda.VMMAllocation
	var handle cuda.IPCMemHandle
	var fd int
	g.do(func() (err error) {
		if g.src, err = drv.MemAlloc(n * size); err != nil {
			return err
		}
		if handle, err = drv.IPCGetMemHandle(g.src); err != nil {
			return err
		}
		if vmm, err = drv.VMMAlloc(dev, n*size, cuda.HandleTypePosixFD); err != nil {
			return err
		}
		fd, err = drv.ExportPosixFD(vmm.Handle)
		return err
	})
	tb.Cleanup(func() { g.do(func() error { return drv.MemFree(g.src) }) })
	tb.Cleanup(func() { g.do(func() error { return drv.VMMFree(vmm) }) })
	vmmFile := os.NewFile(uintptr(fd), "vmm")
	tb.Cleanup(func() { vmmFile.Close() })
	g.dst = vmm.Ptr

	if g.c, err = client.Dial(ctx, socket, client.WithName("go-gpu-test")); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.c.Close() }) // the agent drops the connection's regions and layouts
	for k := range n {
		r, err := g.c.RegisterGPU(ctx, client.GPUMemory{GPUIndex: 0, IPCHandle: handle[:], Offset: k * size, Length: size})
		if err != nil {
			tb.Fatalf("registering the cudaMalloc allocation's region %d by its IPC handle: %v", k, err)
		}
		g.srcRegions = append(g.srcRegions, r)
		r, err = g.c.RegisterGPU(ctx, client.GPUMemory{GPUIndex: 0, VMMFiles: []*os.File{vmmFile}, AllocationSize: vmm.Size,
			Offset: k * size, Length: size})
		if err != nil {
			tb.Fatalf("registering the VMM allocation's region %d by its fd: %v", k, err)
		}
		g.dstRegions = append(g.dstRegions, r)
	}
	return g
}

// The Go client's typed GPU registrations on a real GPU, through an agent in another process: a cudaMalloc
// allocation by its IPC handle (two regions at offsets into it) and a VMM allocation by its POSIX fd (two more),
// grouped as layouts of two regions each (a layer's K and V); blocks moved by TransferBlocks, then a 16 MiB block
// a region moved again and again by a prepared transfer (the agent replays that copy-engine range from its second
// run), every byte compared after each; ids out of range refused with InvalidArgument and nothing moved.
func TestGPUGoClientMovesLayoutBlocksOfRegisteredGPUMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const region = 16 << 20 // each of K and V
	g := registerGPURegions(t, ctx, region, 2)
	c, src, dst, srcRegions, dstRegions := g.c, g.src, g.dst, g.srcRegions, g.dstRegions
	defer func() {
		for _, r := range append(srcRegions, dstRegions...) {
			if err := c.Deregister(ctx, r); err != nil {
				t.Error(err)
			}
		}
	}()

	r := rand.New(rand.NewPCG(14, 3))
	fresh := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	// want mirrors the destination: poisoned, then every block copied into it.
	want := bytes.Repeat([]byte{0xA5}, 2*region)
	g.write(dst, want)
	check := func(when string) {
		t.Helper()
		if got := g.read(dst, 2*region); !bytes.Equal(got, want) {
			t.Fatalf("%s: the destination differs from what was copied into it", when)
		}
	}

	// 64 KiB blocks: 64 of the 256 of each region, scattered, into other places.
	const bs = 64 << 10
	from, err := c.RegisterLayout(ctx, srcRegions, bs)
	if err != nil {
		t.Fatal(err)
	}
	into, err := c.RegisterLayout(ctx, dstRegions, bs)
	if err != nil {
		t.Fatal(err)
	}
	source := fresh(2 * region)
	g.write(src, source)
	perm, permTo := r.Perm(region/bs), r.Perm(region/bs)
	ids, toIDs := make([]uint32, 64), make([]uint32, 64)
	for i := range ids {
		ids[i], toIDs[i] = uint32(perm[i]), uint32(permTo[i])
		for k := range 2 {
			at, to := k*region+perm[i]*bs, k*region+permTo[i]*bs
			copy(want[to:to+bs], source[at:at+bs])
		}
	}
	if st, err := c.TransferBlocks(ctx, client.Write, from, ids, client.ToLayout(into), toIDs, client.TransferOptions{}); err != nil {
		t.Fatalf("moving 64 blocks of each region: %v (%v)", err, st)
	}
	check("after TransferBlocks")

	// Ids out of range: refused, nothing moved.
	if _, err := c.TransferBlocks(ctx, client.Write, from, []uint32{1, region / bs}, client.ToLayout(into), []uint32{2, 3},
		client.TransferOptions{}); client.Code(err) != codes.InvalidArgument {
		t.Fatalf("a block id past the layout: %v, want InvalidArgument", err)
	}
	check("after the refused transfer")

	// One 16 MiB block a region, prepared once and run again and again with a fresh source each time.
	whole, err := c.RegisterLayout(ctx, srcRegions, region)
	if err != nil {
		t.Fatal(err)
	}
	wholeInto, err := c.RegisterLayout(ctx, dstRegions, region)
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.PrepareBlocks(client.Write, whole, []uint32{0}, client.ToLayout(wholeInto), []uint32{0}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		source = fresh(2 * region)
		g.write(src, source)
		copy(want, source)
		if st, err := run.Run(ctx); err != nil {
			t.Fatalf("prepared run %d: %v (%v)", i, err, st)
		}
		check("after a prepared run")
	}
	refused, err := c.PrepareBlocks(client.Write, whole, []uint32{1}, client.ToLayout(wholeInto), []uint32{0}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g.write(src, fresh(2*region))
	if _, err := refused.Run(ctx); client.Code(err) != codes.InvalidArgument {
		t.Fatalf("a prepared transfer of a block past the layout: %v, want InvalidArgument", err)
	}
	check("after the refused prepared run")
	for _, l := range []*client.Layout{from, into, whole, wholeInto} {
		if err := c.DeregisterLayout(ctx, l); err != nil {
			t.Error(err)
		}
	}
}

// BenchmarkGPUGoClientContiguousCopy times a waited 64 MiB copy within GPU 0 from this process through the agent's
// socket, as TransferBlocks, as a prepared transfer and submitted then waited for, beside what this process does
// alone in the same run: a cuMemcpyAsync on the default stream and a context synchronize (what torch's copy_ and
// synchronize() do).
func BenchmarkGPUGoClientContiguousCopy(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const size = 64 << 20
	g := registerGPURegions(b, ctx, size, 1)
	from, err := g.c.RegisterLayout(ctx, g.srcRegions, size)
	if err != nil {
		b.Fatal(err)
	}
	into, err := g.c.RegisterLayout(ctx, g.dstRegions, size)
	if err != nil {
		b.Fatal(err)
	}
	zero := []uint32{0}
	run, err := g.c.PrepareBlocks(client.Write, from, zero, client.ToLayout(into), zero, client.TransferOptions{})
	if err != nil {
		b.Fatal(err)
	}
	benchCopies(b, size, []benchCopy{
		{"cuMemcpyAsync+synchronize", func(int) error { return g.bare(g.dst, g.src, size) }},
		{"TransferBlocks", func(int) error {
			_, err := g.c.TransferBlocks(ctx, client.Write, from, zero, client.ToLayout(into), zero, client.TransferOptions{})
			return err
		}},
		{"prepared", func(int) error { _, err := run.Run(ctx); return err }},
		{"SubmitBlocks+Wait", func(int) error {
			tr, err := g.c.SubmitBlocks(ctx, client.Write, from, zero, client.ToLayout(into), zero, client.TransferOptions{})
			if err != nil {
				return err
			}
			_, err = tr.Wait(ctx)
			return err
		}},
	})
}

// BenchmarkGPUGoClientSmallCopy times a waited 4 KiB block copied within GPU 0 through the agent's socket, another
// block of 256 at each call, beside a cuMemcpyAsync of the same block and a context synchronize in this process;
// besides the mean it reports the median and the 99th percentile.
func BenchmarkGPUGoClientSmallCopy(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const bs, blocks = 4096, 256
	g := registerGPURegions(b, ctx, bs*blocks, 1)
	from, err := g.c.RegisterLayout(ctx, g.srcRegions, bs)
	if err != nil {
		b.Fatal(err)
	}
	into, err := g.c.RegisterLayout(ctx, g.dstRegions, bs)
	if err != nil {
		b.Fatal(err)
	}
	ids := make([][]uint32, blocks)
	for i := range ids {
		ids[i] = []uint32{uint32(i)}
	}
	benchCopies(b, bs, []benchCopy{
		{"cuMemcpyAsync+synchronize", func(i int) error {
			at := cuda.DevicePtr(i%blocks) * bs
			return g.bare(g.dst+at, g.src+at, bs)
		}},
		{"TransferBlocks", func(i int) error {
			_, err := g.c.TransferBlocks(ctx, client.Write, from, ids[i%blocks], client.ToLayout(into), ids[i%blocks], client.TransferOptions{})
			return err
		}},
	})
}

// benchCopy is one way of making the i-th copy of a benchmark.
type benchCopy struct {
	name string
	copy func(i int) error
}

// benchCopies runs each case as a sub-benchmark of size-byte copies after a warm-up (the agent replays a large
// range from its second copy), reporting the median and 99th percentile beside the mean.
func benchCopies(b *testing.B, size int64, cases []benchCopy) {
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			for i := range 20 {
				if err := bc.copy(i); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			var took []time.Duration
			i := 0
			for b.Loop() {
				start := time.Now()
				if err := bc.copy(i); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
				i++
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// bare copies n bytes within the GPU on the default stream and synchronizes the context, as torch's copy_ and
// synchronize() do.
func (g *gpuRegions) bare(dst, src cuda.DevicePtr, n uint64) error {
	return g.drv.WithContext(g.ctx, func() error {
		if err := g.drv.MemcpyAsync(uint64(dst), uint64(src), n, 0); err != nil {
			return err
		}
		return g.drv.CtxSynchronize()
	})
}
