// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
)

// TestGPUStagedTCP moves GPU memory between two tcp engines in this process (two nodes over loopback), each
// staging through its own CUDA backend: 256 MiB contiguous and 15,360 scattered 720 B blocks, both ways, every
// byte checked. Deregistering releases the mapping only once both the backend and the tcp engine let go.
func TestGPUStagedTCP(t *testing.T) {
	drv, nv := gpuEnv(t)
	dev, err := drv.DeviceGet(0)
	if err != nil {
		t.Fatal(err)
	}
	cctx, err := drv.PrimaryContextRetain(dev)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drv.PrimaryContextRelease(dev) })
	const size = 256 << 20
	node := func(name string, serve bool) (*cudacopy.Backend, *tcp.Engine, engines.MemoryDesc, cuda.DevicePtr) {
		be, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
		if err != nil {
			t.Fatal(err)
		}
		opts := tcp.Options{Node: name, Stager: be.Stager(), Logf: t.Logf}
		if serve {
			if opts.Listener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
				t.Fatal(err)
			}
		}
		te, err := tcp.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		var p cuda.DevicePtr
		if err := drv.WithContext(cctx, func() (err error) { p, err = drv.MemAlloc(size); return }); err != nil {
			t.Fatal(err)
		}
		d := engines.MemoryDesc{ID: engines.MemoryID(name + "/gpu"), Node: name, Size: size,
			Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA, Device: 0},
			Handles:  engines.Handles{Ptr: uintptr(p)}}
		ctx := context.Background()
		if d, err = be.Register(ctx, d); err != nil {
			t.Fatal(err)
		}
		if d, err = te.Register(ctx, d); err != nil {
			t.Fatal(err)
		}
		if ok, why := te.Staging(); !ok {
			t.Fatalf("staging unavailable: %s", why)
		}
		t.Cleanup(func() {
			te.Close()
			be.Close()
			drv.WithContext(cctx, func() error { return drv.MemFree(p) })
		})
		return be, te, d, p
	}
	_, a, da, pa := node("node-a", false)
	bb, b, db, pb := node("node-b", true)
	if err := a.Import(context.Background(), db.Remote()); err != nil { // as the peer sees it, over the wire
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	srcBytes, dstBytes := randomBytes(r, size), randomBytes(r, size)
	put := func(p cuda.DevicePtr, b []byte) {
		if err := drv.WithContext(cctx, func() error { return drv.MemcpyHtoD(p, b) }); err != nil {
			t.Fatal(err)
		}
	}
	get := func(p cuda.DevicePtr) []byte {
		out := make([]byte, size)
		if err := drv.WithContext(cctx, func() error { return drv.MemcpyDtoH(out, p) }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	run := func(what string, items []engines.Item, blocks ...engines.Blocks) {
		t.Helper()
		pl := a.NewPlan()
		var n uint64
		for _, it := range items {
			if err := pl.Add(it); err != nil {
				t.Fatal(err)
			}
			n += it.Size
		}
		for _, bl := range blocks {
			if err := pl.(engines.BlockAdder).AddBlocks(bl); err != nil {
				t.Fatal(err)
			}
			n += bl.BlockBytes * uint64(len(bl.SrcIDs))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		start := time.Now()
		tr, err := a.Submit(ctx, pl.Build(), engines.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Wait(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		el := time.Since(start)
		t.Logf("%s: %d bytes in %v (%.2f GB/s)", what, n, el, float64(n)/el.Seconds()/1e9)
	}
	for _, dir := range []string{"write", "read"} {
		put(pa, srcBytes)
		put(pb, dstBytes)
		src, dst, to := da, db, pb
		if dir == "read" {
			src, dst, to = db, da, pa
			put(pb, srcBytes)
			put(pa, dstBytes)
		}
		run(dir+" 256 MiB contiguous", []engines.Item{{Src: src.ID, Dst: dst.ID, Size: size}})
		if got := get(to); !bytes.Equal(got, srcBytes) {
			t.Fatalf("%s contiguous: destination differs", dir)
		}
		// 15,360 blocks of 720 B at random distinct places.
		const blk, nblk = 720, 15360
		put(to, dstBytes)
		perm := r.Perm(size / blk)
		want := bytes.Clone(dstBytes)
		var items []engines.Item
		for i := 0; i < nblk; i++ {
			so, do := uint64(perm[i])*blk, uint64(perm[nblk+i])*blk
			items = append(items, engines.Item{Src: src.ID, Dst: dst.ID, SrcOffset: so, DstOffset: do, Size: blk, Tag: engines.Tag(i)})
			copy(want[do:do+blk], srcBytes[so:so+blk])
		}
		run(dir+" 15,360 x 720 B", items)
		if got := get(to); !bytes.Equal(got, want) {
			t.Fatalf("%s blocks: destination differs", dir)
		}
		// The same blocks as a block list: staged by block index on both sides.
		put(to, dstBytes)
		bl := engines.Blocks{Pairs: []engines.BlockPair{{Src: src.ID, Dst: dst.ID}}, BlockBytes: blk,
			SrcIDs: make([]uint32, nblk), DstIDs: make([]uint32, nblk)}
		for i := range nblk {
			bl.SrcIDs[i], bl.DstIDs[i] = uint32(perm[i]), uint32(perm[nblk+i])
		}
		run(dir+" 15,360 x 720 B block list", nil, bl)
		if got := get(to); !bytes.Equal(got, want) {
			t.Fatalf("%s block list: destination differs", dir)
		}
	}
	// The same-node engine lets go first (deregistration runs the engines in parallel): the tcp engine's
	// staging keeps the mapping until it is released.
	if err := bb.Release(context.Background(), &db); err != nil {
		t.Fatal(err)
	}
	pl := a.NewPlan()
	if err := pl.Add(engines.Item{Src: da.ID, Dst: db.ID, Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := a.Submit(ctx, pl.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatalf("staged write after the backend released its registration: %v", err)
	}
	if err := b.Deregister(ctx, db.ID); err != nil {
		t.Fatal(err)
	}
}

// TestGPUStagedBlocksRefused: the stager copies whole blocks by index only within the region and the buffer; a
// block past either is refused before anything is queued.
func TestGPUStagedBlocksRefused(t *testing.T) {
	drv, nv := gpuEnv(t)
	be, err := cudacopy.NewBackend(drv, cudacopy.Options{NVRTC: nv})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	c, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bs, blocks = 720, 64
	src, _, free := devicePair(t, drv, c, bs*blocks)
	defer free()
	d := engines.MemoryDesc{ID: "gpu", Node: "n", Size: bs * blocks,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA, Device: 0},
		Handles:  engines.Handles{Ptr: uintptr(src)}}
	if d, err = be.Register(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	sr, err := be.Stager().Stage(d)
	if err != nil {
		t.Fatal(err)
	}
	defer sr.Release()
	sb := sr.(tcp.StagedBlocks)
	buf, freeBuf, err := be.Stager().AllocPinned(bs * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer freeBuf()
	for _, tc := range []struct {
		name string
		ids  []uint32
		buf  []byte
	}{
		{"block past the region", []uint32{0, blocks}, buf},
		{"block index 2^32-1", []uint32{1, 1<<32 - 1}, buf},
		{"more blocks than the buffer holds", []uint32{0, 1, 2, 3, 4}, buf},
	} {
		for _, toHost := range []bool{true, false} {
			var err error
			if toHost {
				_, err = sb.BlocksToHost(tc.buf, bs, tc.ids)
			} else {
				_, err = sb.BlocksFromHost(tc.buf, bs, tc.ids)
			}
			if !errors.Is(err, engines.ErrOutOfBounds) {
				t.Errorf("%s (to host %v): %v, want out of bounds", tc.name, toHost, err)
			}
		}
	}
	host := randomBytes(rand.New(rand.NewPCG(7, 8)), bs*blocks)
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyHtoD(src, host) }); err != nil {
		t.Fatal(err)
	}
	// Within both, the blocks arrive in order: blocks of 720 B in the kernel's block form, blocks of 100 B (not a
	// multiple of 16) as segments.
	for _, size := range []uint64{bs, 100} {
		ids := []uint32{5, uint32(bs*blocks/size) - 1, 0}
		clear(buf)
		w, err := sb.BlocksToHost(buf, size, ids)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		for k, id := range ids {
			if !bytes.Equal(buf[uint64(k)*size:][:size], host[uint64(id)*size:][:size]) {
				t.Fatalf("staged block %d (block %d of %d bytes of the region) differs", k, id, size)
			}
		}
	}
	// And back: blocks of the buffer into the region by index.
	for k := range buf[:bs*2] {
		buf[k] = byte(k * 7)
	}
	w, err := sb.BlocksFromHost(buf[:bs*2], bs, []uint32{9, 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := drv.WithContext(c.Context(), func() error { return drv.MemcpyDtoH(host, src) }); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(host[9*bs:10*bs], buf[:bs]) || !bytes.Equal(host[3*bs:4*bs], buf[bs:2*bs]) {
		t.Fatal("blocks written by index into the region differ")
	}
}

// BenchmarkGPUBouncedChunk times one staged chunk of the tcp engine's block transfers: 1,024 scattered 720 B
// blocks (737,280 bytes) gathered into pinned host memory through device staging, and scattered back, with the
// host's queueing time (queue-µs, what the staging goroutine spends before the next chunk) beside the whole
// submission waited for. The direct row has the kernel write the blocks into host memory itself (no device
// staging), the batch rows move them as one cuMemcpyBatchAsync of 1,024 copy-engine copies (no kernel); the
// contiguous row is the same bytes as one copy-engine transfer, the floor.
func BenchmarkGPUBouncedChunk(b *testing.B) {
	drv, nv := gpuEnv(b)
	c := newCopier(b, drv, cudacopy.Options{NVRTC: nv})
	const bs, blocks, n = 720, 1 << 18, 1024
	src, _, free := devicePair(b, drv, c, bs*blocks)
	defer free()
	var host uintptr
	if err := drv.WithContext(c.Context(), func() (err error) { host, err = drv.MemHostAlloc(bs * n); return }); err != nil {
		b.Fatal(err)
	}
	defer drv.WithContext(c.Context(), func() error { return drv.MemFreeHost(host) })
	rng := rand.New(rand.NewPCG(1, 2))
	ids := rng.Perm(blocks)[:n]
	parts := make([]cudacopy.StagedPart, n)
	blockIDs := make([]uint32, n)
	within := scatter.IDRange{Min: math.MaxUint32}
	for i, id := range ids {
		parts[i] = cudacopy.StagedPart{Addr: uint64(src) + uint64(id)*bs, Off: uint64(i) * bs, Size: bs}
		blockIDs[i] = uint32(id)
		within = scatter.IDRange{Min: min(within.Min, uint32(id)), Max: max(within.Max, uint32(id))}
	}
	direct, back := make([]cudacopy.Segment, n), make([]cudacopy.Segment, n)
	for i, p := range parts {
		direct[i] = cudacopy.Segment{Src: p.Addr, Dst: uint64(host) + p.Off, Size: p.Size}
		back[i] = cudacopy.Segment{Src: uint64(host) + p.Off, Dst: p.Addr, Size: p.Size}
	}
	batch, err := cudacopy.NewCopier(drv, 0, cudacopy.Options{NVRTC: nv, Force: cudacopy.ModeBatch})
	if err != nil {
		b.Fatal(err)
	}
	defer batch.Close()
	b.Logf("batch copier: %s (%s)", batch.Mode(), batch.Reason())
	for _, tc := range []struct {
		name   string
		submit func() (*cudacopy.Pending, error)
	}{
		{"gather-to-host", func() (*cudacopy.Pending, error) { return c.SubmitBounced(parts, uint64(host), bs*n, true) }},
		{"scatter-from-host", func() (*cudacopy.Pending, error) { return c.SubmitBounced(parts, uint64(host), bs*n, false) }},
		{"gather-by-index-to-host", func() (*cudacopy.Pending, error) {
			return c.SubmitBouncedBlocks(uint64(src), bs, blockIDs, within, uint64(host), true)
		}},
		{"scatter-by-index-from-host", func() (*cudacopy.Pending, error) {
			return c.SubmitBouncedBlocks(uint64(src), bs, blockIDs, within, uint64(host), false)
		}},
		{"gather-direct-to-host", func() (*cudacopy.Pending, error) { return c.Submit(direct) }},
		{"gather-batch-to-host", func() (*cudacopy.Pending, error) { return batch.Submit(direct) }},
		{"scatter-batch-from-host", func() (*cudacopy.Pending, error) { return batch.Submit(back) }},
		{"contiguous-to-host", func() (*cudacopy.Pending, error) {
			return c.SubmitRoute([]cudacopy.Segment{{Src: uint64(src), Dst: uint64(host), Size: bs * n}}, cudacopy.RouteDriver)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var queued time.Duration
			calls := 0
			if err := timed(b, func() error {
				start := time.Now()
				p, err := tc.submit()
				queued += time.Since(start)
				calls++
				if err != nil {
					return err
				}
				return p.Wait(context.Background())
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(queued.Nanoseconds())/1e3/float64(calls), "queue-µs")
		})
	}
}
