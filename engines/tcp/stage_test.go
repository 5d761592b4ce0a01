// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// fakeStager stands in for the GPU copy backend: "GPU memory" is host memory it was given, and every copy runs
// on a goroutine of its own, after the hooks let it, as a GPU copy runs beside the host.
type fakeStager struct {
	t   testing.TB
	mu  sync.Mutex
	mem map[engines.MemoryID][]byte
	// refuse makes Stage fail for a region with that reason.
	refuse map[engines.MemoryID]string
	// beforeCopy, when set, runs before the k-th copy (1-based, per direction) does anything; an error fails it.
	beforeToHost, beforeFromHost func(k int) error
	// queueErr fails ToHost/FromHost's queueing for the k-th call.
	queueToHostErr func(k int) error
	// segmentsOnly makes its regions stage segments only (no StagedBlocks), as a stager without a block form.
	segmentsOnly bool

	toHost, fromHost atomic.Int32
	blockCalls       atomic.Int32 // ToHost/FromHost calls that came by block index (StagedBlocks)
	segs             atomic.Int64 // segments copied, all calls
	allocs, frees    atomic.Int32
	released         atomic.Int32
	// lastFromHostStart is when the latest FromHost was queued.
	lastFromHostStart atomic.Int64
}

func newFakeStager(t testing.TB) *fakeStager {
	return &fakeStager{t: t, mem: map[engines.MemoryID][]byte{}, refuse: map[engines.MemoryID]string{}}
}

func (s *fakeStager) Stage(d engines.MemoryDesc) (StagedRegion, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if why, ok := s.refuse[d.ID]; ok {
		return nil, errors.New(why)
	}
	m, ok := s.mem[d.ID]
	if !ok || uint64(len(m)) != d.Size {
		return nil, fmt.Errorf("fake: no device memory for %s", d.ID)
	}
	if s.segmentsOnly {
		return &fakeRegion{s: s, mem: m}, nil
	}
	return fakeBlockRegion{&fakeRegion{s: s, mem: m}}, nil
}

func (s *fakeStager) AllocPinned(n int) ([]byte, func() error, error) {
	s.allocs.Add(1)
	return make([]byte, n), func() error { s.frees.Add(1); return nil }, nil
}

type fakeRegion struct {
	s   *fakeStager
	mem []byte
}

type fakeWait struct {
	done chan struct{}
	err  error
}

// Done says whether the copy finished, as the CUDA stager's copies can.
func (w *fakeWait) Done() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

func (w *fakeWait) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *fakeRegion) copy(dst, src []byte, segs []engines.Segment, before func(int) error, k int) *fakeWait {
	w := &fakeWait{done: make(chan struct{})}
	for _, sg := range segs {
		if sg.SrcOffset+sg.Size > uint64(len(src)) || sg.DstOffset+sg.Size > uint64(len(dst)) {
			r.s.t.Errorf("staging segment %+v outside a buffer (src %d, dst %d bytes)", sg, len(src), len(dst))
		}
	}
	r.s.segs.Add(int64(len(segs)))
	go func() {
		defer close(w.done)
		if before != nil {
			if w.err = before(k); w.err != nil {
				return
			}
		}
		for _, sg := range segs {
			copy(dst[sg.DstOffset:sg.DstOffset+sg.Size], src[sg.SrcOffset:sg.SrcOffset+sg.Size])
		}
	}()
	return w
}

func (r *fakeRegion) ToHost(buf []byte, segs []engines.Segment) (StageWait, error) {
	k := int(r.s.toHost.Add(1))
	if r.s.queueToHostErr != nil {
		if err := r.s.queueToHostErr(k); err != nil {
			return nil, err
		}
	}
	return r.copy(buf, r.mem, segs, r.s.beforeToHost, k), nil
}

func (r *fakeRegion) FromHost(buf []byte, segs []engines.Segment) (StageWait, error) {
	k := int(r.s.fromHost.Add(1))
	r.s.lastFromHostStart.Store(time.Now().UnixNano())
	return r.copy(r.mem, buf, segs, r.s.beforeFromHost, k), nil
}

func (r *fakeRegion) Release() error { r.s.released.Add(1); return nil }

func stagedEngine(t testing.TB, node string, serve bool, s Stager, mod func(*Options)) *Engine {
	t.Helper()
	opts := Options{Node: node, Stager: s, PeerTimeout: 5 * time.Second, Logf: t.Logf}
	if serve {
		opts.Listener = listen(t)
	}
	if mod != nil {
		mod(&opts)
	}
	e, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// registerGPU registers mem as GPU memory of e's node; s (when set) is given mem as its device memory.
func registerGPU(t testing.TB, e *Engine, s *fakeStager, id string, mem []byte) engines.MemoryDesc {
	t.Helper()
	if s != nil {
		s.mu.Lock()
		s.mem[engines.MemoryID(id)] = mem
		s.mu.Unlock()
	}
	d, err := e.Register(context.Background(), engines.MemoryDesc{ID: engines.MemoryID(id), Node: e.opts.Node,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}, Size: uint64(len(mem))})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// transfer submits items as one plan set and waits.
func transfer(t testing.TB, e *Engine, items []engines.Item, timeout time.Duration) (engines.Transfer, error) {
	t.Helper()
	pb := e.NewPlan()
	for _, it := range items {
		if err := pb.Add(it); err != nil {
			t.Fatalf("planning %+v: %v", it, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	tr, err := e.Submit(ctx, pb.Build(), engines.SubmitOptions{Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return tr, tr.Wait(ctx)
}

func seq(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// stagedWriteBed is node-a with size bytes of GPU memory (seeded) staged by a fake stager and node-b serving size
// bytes of host memory (zeroed), b's region imported into a.
type stagedWriteBed struct {
	sa            *fakeStager
	a, b          *Engine
	local, remote []byte
	ld, rd        engines.MemoryDesc
}

func newStagedWriteBed(t *testing.T, size int, seed uint64) *stagedWriteBed {
	t.Helper()
	w := &stagedWriteBed{sa: newFakeStager(t), local: seq(size, seed), remote: make([]byte, size)}
	w.a = stagedEngine(t, "node-a", false, w.sa, nil)
	w.b = stagedEngine(t, "node-b", true, nil, nil)
	w.ld = registerGPU(t, w.a, w.sa, "a/1", w.local)
	w.rd = register(t, w.b, "b/1", w.remote)
	imp(t, w.a, w.rd)
	return w
}

// TestStagedPairs moves every byte of contiguous and scattered items in every direction of every pairing with
// a GPU side (local GPU with remote host or GPU, local host with remote GPU), and checks it; scattered blocks
// are gathered with one copy per chunk, never one per block.
func TestStagedPairs(t *testing.T) {
	sa, sb := newFakeStager(t), newFakeStager(t)
	a := stagedEngine(t, "node-a", false, sa, nil)
	b := stagedEngine(t, "node-b", true, sb, nil)
	const size = 10<<20 + 4096 // three slots and a bit
	const block, blocks = 720, 3000
	var n int
	for _, kinds := range [][2]string{{"gpu", "host"}, {"gpu", "gpu"}, {"host", "gpu"}} {
		for _, dir := range []engines.Direction{engines.DirWrite, engines.DirRead} {
			for _, scattered := range []bool{false, true} {
				n++
				name := fmt.Sprintf("%s-%s/%v/scattered=%v", kinds[0], kinds[1], dir, scattered)
				t.Run(name, func(t *testing.T) {
					localMem, remoteMem := seq(size, uint64(n)), seq(size, uint64(n)+1000)
					// Expectations come from copies: the serving side's goroutines touch the regions, ordered
					// with this test only through the network.
					origLocal, origRemote := bytes.Clone(localMem), bytes.Clone(remoteMem)
					var ld, rd engines.MemoryDesc
					if kinds[0] == "gpu" {
						ld = registerGPU(t, a, sa, fmt.Sprintf("a/%d", n), localMem)
					} else {
						ld = register(t, a, fmt.Sprintf("a/%d", n), localMem)
					}
					if kinds[1] == "gpu" {
						rd = registerGPU(t, b, sb, fmt.Sprintf("b/%d", n), remoteMem)
					} else {
						rd = register(t, b, fmt.Sprintf("b/%d", n), remoteMem)
					}
					if rd.Handles.TCP == "" {
						t.Fatal("a staged region got no TCP endpoint")
					}
					imp(t, a, rd)
					src, dst, srcMem, dstMem, want := ld, rd, origLocal, remoteMem, origRemote
					if dir == engines.DirRead {
						src, dst, srcMem, dstMem, want = rd, ld, origRemote, localMem, origLocal
					}
					var items []engines.Item
					if scattered {
						perm := rand.New(rand.NewPCG(uint64(n), 1)).Perm(size / block)
						for i := 0; i < blocks; i++ {
							so, do := uint64(perm[i])*block, uint64(perm[blocks+i])*block
							items = append(items, engines.Item{Src: src.ID, Dst: dst.ID, SrcOffset: so, DstOffset: do, Size: block, Tag: engines.Tag(i)})
							copy(want[do:do+block], srcMem[so:so+block])
						}
					} else {
						items = []engines.Item{{Src: src.ID, Dst: dst.ID, SrcOffset: 100, DstOffset: 200, Size: size - 300}}
						copy(want[200:size-100], srcMem[100:size-200])
					}
					toA, fromA, toB, fromB := sa.toHost.Load(), sa.fromHost.Load(), sb.toHost.Load(), sb.fromHost.Load()
					if _, err := transfer(t, a, items, 10*time.Second); err != nil {
						t.Fatal(err)
					}
					// The serving side copies into or out of its GPU memory once the request was answered or
					// written; its pins end before the next request is read, which the pin below waits out.
					got := dstMem
					if dst.Node == "node-b" {
						_, unpin, err := b.reg.Pin(dst.ID)
						if err != nil {
							t.Fatal(err)
						}
						got = bytes.Clone(dstMem)
						unpin()
					}
					if !bytes.Equal(got, want) {
						t.Fatalf("destination differs from the expected bytes (first difference at %d)", firstDiff(got, want))
					}
					copies := (sa.toHost.Load() - toA) + (sa.fromHost.Load() - fromA) + (sb.toHost.Load() - toB) + (sb.fromHost.Load() - fromB)
					sides := int32(0)
					if kinds[0] == "gpu" {
						sides++
					}
					if kinds[1] == "gpu" {
						sides++
					}
					// One copy per request: chunks of at most a slot and 1024 parts.
					maxChunks := wantStagedChunks(1, size, false)
					if scattered {
						maxChunks = wantStagedChunks(blocks, block, false)
					}
					if copies > sides*maxChunks {
						t.Fatalf("%d staging copies for %d staged sides, want at most %d each (gathered per chunk, not per block)", copies, sides, maxChunks)
					}
				})
			}
		}
	}
	// Slots are bounded per peer: 64 MiB default, 4 MiB each, per side.
	if n := sa.allocs.Load(); n > defaultStagingBytes/stageSlot {
		t.Fatalf("node-a allocated %d staging slots, at most %d", n, defaultStagingBytes/stageSlot)
	}
}

// wantStagedChunks is how many chunks, one staging copy per staged side each, a staged plan of n parts of
// partBytes each (a block list's blocks when blocks) is cut into over the default connections: parts below
// vecPartMax are packed up to the chunk size and maxVecParts per chunk, larger ones cut at the chunk size.
func wantStagedChunks(n int, partBytes uint64, blocks bool) int32 {
	total := uint64(n) * partBytes
	chunk := uint64(stagedChunkBytes(total, defaultConnsPerPeer, blocks))
	if partBytes > vecPartMax {
		return int32(uint64(n) * ((partBytes + chunk - 1) / chunk))
	}
	per := min(uint64(maxVecParts), chunk/partBytes)
	return int32((uint64(n) + per - 1) / per)
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestStagedPipelineOverlaps: writing, the gather of chunk 2 only finishes once the peer has received chunk 1
// (a pipeline that gathers everything before sending, or one chunk at a time, never gets there); reading, the
// scatter of chunk 1 only finishes once chunk 2 has arrived.
func TestStagedPipelineOverlaps(t *testing.T) {
	const size = 6 * stageSlot
	w := newStagedWriteBed(t, size, 1)
	sa, a, b, local, remote, ld, rd := w.sa, w.a, w.b, w.local, w.remote, w.ld, w.rd

	waitUntil := func(what string, cond func() bool) error {
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pipeline stalled: %s never happened while a staging copy ran", what)
			}
		}
		return nil
	}
	chunk := uint64(stagedChunkBytes(size, defaultConnsPerPeer, false))
	sa.beforeToHost = func(k int) error {
		if k == 2 {
			return waitUntil("the peer received chunk 1", func() bool { return b.Stats().ServedIn >= chunk })
		}
		return nil
	}
	if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	view, unpin, err := b.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(view, local) {
		unpin()
		t.Fatal("written bytes differ")
	}
	unpin()

	clear(local)
	sa.beforeFromHost = func(k int) error {
		if k == 1 {
			return waitUntil("chunk 2 arrived", func() bool { return a.Stats().Received >= 2*chunk })
		}
		return nil
	}
	if _, err := transfer(t, a, []engines.Item{{Src: rd.ID, Dst: ld.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(local, remote) {
		t.Fatal("read bytes differ")
	}
}

// TestStagedGathersQueuedAhead: a staged write queues the next chunks' gathers while the first still runs (the
// GPU runs them back to back), at most gathersAhead of them, and the chunks still land in order and whole.
func TestStagedGathersQueuedAhead(t *testing.T) {
	const size = 8 * stageSlot
	w := newStagedWriteBed(t, size, 3)
	sa, a, b, local, ld, rd := w.sa, w.a, w.b, w.local, w.ld, w.rd
	var queuedWhileFirstRan atomic.Int32
	sa.beforeToHost = func(k int) error {
		if k != 1 {
			return nil
		}
		for deadline := time.Now().Add(5 * time.Second); sa.toHost.Load() < gathersAhead; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return fmt.Errorf("only %d gathers queued while the first ran, want %d", sa.toHost.Load(), gathersAhead)
			}
		}
		time.Sleep(20 * time.Millisecond) // room for any gather beyond the bound to be queued
		queuedWhileFirstRan.Store(sa.toHost.Load())
		return nil
	}
	if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := queuedWhileFirstRan.Load(); got != gathersAhead {
		t.Errorf("%d gathers queued while the first ran, want exactly %d", got, gathersAhead)
	}
	view, unpin, err := b.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if !bytes.Equal(view, local) {
		t.Fatal("written bytes differ")
	}
}

// TestStagedServingOverlaps: on one connection, the serving node copies a received chunk into its GPU memory
// while it receives the next one (the first copy only finishes once the second has been queued), and gathers
// the next chunk of a read while it answers the one before.
func TestStagedServingOverlaps(t *testing.T) {
	sb := newFakeStager(t)
	b := stagedEngine(t, "node-b", true, sb, nil)
	a := stagedEngine(t, "node-a", false, nil, func(o *Options) { o.ConnsPerPeer = 1 })
	const size = 4 * stageSlot
	remote := make([]byte, size)
	rd := registerGPU(t, b, sb, "b/1", remote)
	imp(t, a, rd)
	local := seq(size, 5)
	ld := register(t, a, "a/1", local)
	// The hooks are set before the serving goroutines start: the write uses only the first, the read only
	// the second.
	sb.beforeToHost = func(k int) error {
		if k != 1 {
			return nil
		}
		for deadline := time.Now().Add(5 * time.Second); sb.toHost.Load() < 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("the next chunk was not gathered while the first one was")
			}
		}
		return nil
	}
	sb.beforeFromHost = func(k int) error {
		if k != 1 {
			return nil
		}
		for deadline := time.Now().Add(5 * time.Second); sb.fromHost.Load() < 2; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("the next chunk was not received while the first one was copied in")
			}
		}
		return nil
	}
	if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_, unpin, err := b.reg.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	same := bytes.Equal(remote, local)
	unpin()
	if !same {
		t.Fatal("written bytes differ")
	}

	back := make([]byte, size)
	bd := register(t, a, "a/back", back)
	if _, err := transfer(t, a, []engines.Item{{Src: rd.ID, Dst: bd.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	view, unpin, err := a.Pin(bd.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if !bytes.Equal(view, local) {
		t.Fatal("read bytes differ")
	}
}

// TestStagedFailures: a staging copy that cannot be queued, or fails on the GPU, fails its transfer with that
// error; the slots come back (later transfers run), and the regions stay registered.
func TestStagedFailures(t *testing.T) {
	sa := newFakeStager(t)
	a := stagedEngine(t, "node-a", false, sa, func(o *Options) { o.StagingBytes = 2 * stageSlot })
	b := stagedEngine(t, "node-b", true, nil, nil)
	const size = 5 * stageSlot
	local := seq(size, 3)
	ld := registerGPU(t, a, sa, "a/1", local)
	rd := register(t, b, "b/1", make([]byte, size))
	imp(t, a, rd)
	write := []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}
	read := []engines.Item{{Src: rd.ID, Dst: ld.ID, Size: size}}

	sa.queueToHostErr = func(k int) error {
		if k == 3 {
			return errors.New("injected: launch failed")
		}
		return nil
	}
	if _, err := transfer(t, a, write, 10*time.Second); err == nil || !strings.Contains(err.Error(), "injected: launch failed") {
		t.Fatalf("transfer with a failing gather launch ended with %v", err)
	}
	sa.queueToHostErr = nil
	sa.toHost.Store(0)
	sa.beforeToHost = func(k int) error {
		if k == 2 {
			return errors.New("injected: illegal address")
		}
		return nil
	}
	if _, err := transfer(t, a, write, 10*time.Second); err == nil || !strings.Contains(err.Error(), "injected: illegal address") {
		t.Fatalf("transfer with a failing gather ended with %v", err)
	}
	sa.beforeToHost = nil
	sa.beforeFromHost = func(k int) error {
		if k == 1 {
			return errors.New("injected: scatter fault")
		}
		return nil
	}
	if _, err := transfer(t, a, read, 10*time.Second); err == nil || !strings.Contains(err.Error(), "injected: scatter fault") {
		t.Fatalf("transfer with a failing scatter ended with %v", err)
	}
	sa.beforeFromHost = nil
	// Both directions still run on the two slots the failures used.
	if _, err := transfer(t, a, write, 10*time.Second); err != nil {
		t.Fatalf("write after failures: %v", err)
	}
	if _, err := transfer(t, a, read, 10*time.Second); err != nil {
		t.Fatalf("read after failures: %v", err)
	}
	if n := sa.allocs.Load(); n > 2 {
		t.Fatalf("%d staging slots allocated with a bound of 2", n)
	}
	if sa.released.Load() != 0 {
		t.Fatal("a failed transfer released the region's staging")
	}
}

// TestStagedCancel: once a staged read is cancelled, no copy into the GPU region is queued any more, and the
// region does not change after the transfer ended.
func TestStagedCancel(t *testing.T) {
	sa := newFakeStager(t)
	a := stagedEngine(t, "node-a", false, sa, nil)
	b := stagedEngine(t, "node-b", true, nil, nil)
	const size = 12 * stageSlot
	local := make([]byte, size)
	ld := registerGPU(t, a, sa, "a/1", local)
	rd := register(t, b, "b/1", seq(size, 9))
	imp(t, a, rd)

	started := make(chan struct{})
	var once sync.Once
	sa.beforeFromHost = func(int) error {
		once.Do(func() { close(started) })
		time.Sleep(30 * time.Millisecond) // a slow GPU: chunks pile up behind it
		return nil
	}
	pb := a.NewPlan()
	if err := pb.Add(engines.Item{Src: rd.ID, Dst: ld.ID, Size: size}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := a.Submit(ctx, pb.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no scatter started")
	}
	tr.Cancel()
	cancelled := time.Now().UnixNano()
	if err := tr.Wait(ctx); !errors.Is(err, engines.ErrCancelled) {
		t.Fatalf("cancelled transfer ended with %v", err)
	}
	if last := sa.lastFromHostStart.Load(); last > cancelled {
		t.Fatalf("a copy into the region was queued %v after Cancel returned", time.Duration(last-cancelled))
	}
	if n := sa.fromHost.Load(); n >= size/stageSlot {
		t.Fatalf("all %d chunks were copied in despite the cancellation", n)
	}
	snap := bytes.Clone(local)
	time.Sleep(100 * time.Millisecond)
	if !bytes.Equal(snap, local) {
		t.Fatal("the region changed after the cancelled transfer ended")
	}
}

// TestStagedCancelWrite: once a staged write to a peer's GPU memory is cancelled, it ends only after the chunks
// already sent were answered, so the destination does not change after Wait returns.
func TestStagedCancelWrite(t *testing.T) {
	sa, sb := newFakeStager(t), newFakeStager(t)
	a := stagedEngine(t, "node-a", false, sa, nil)
	b := stagedEngine(t, "node-b", true, sb, nil)
	const size = 24 * stageSlot
	ld := registerGPU(t, a, sa, "a/1", seq(size, 21))
	remote := make([]byte, size)
	rd := registerGPU(t, b, sb, "b/1", remote)
	imp(t, a, rd)
	started := make(chan struct{})
	var once sync.Once
	sb.beforeFromHost = func(int) error {
		once.Do(func() { close(started) })
		time.Sleep(20 * time.Millisecond) // a slow GPU on the serving side: chunks wait for it
		return nil
	}
	pb := a.NewPlan()
	if err := pb.Add(engines.Item{Src: ld.ID, Dst: rd.ID, Size: size}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	tr, err := a.Submit(ctx, pb.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("no chunk reached the peer's GPU")
	}
	tr.Cancel()
	if err := tr.Wait(ctx); !errors.Is(err, engines.ErrCancelled) {
		t.Fatalf("cancelled transfer ended with %v", err)
	}
	copies := sb.fromHost.Load()
	if copies >= size/stageSlot {
		t.Fatalf("all %d chunks were copied in despite the cancellation", copies)
	}
	_, unpin, err := b.reg.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	snap := bytes.Clone(remote)
	unpin()
	time.Sleep(200 * time.Millisecond)
	_, unpin, err = b.reg.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if !bytes.Equal(snap, remote) || sb.fromHost.Load() != copies {
		t.Fatalf("the destination changed after the cancelled transfer ended (%d copies in, then %d)", copies, sb.fromHost.Load())
	}
}

// TestStagedPeerLost: a peer that goes silent mid-transfer fails staged transfers both ways within the liveness
// bound with a PeerLostError; the local GPU region stays registered and moves again once the link is back.
func TestStagedPeerLost(t *testing.T) {
	sa := newFakeStager(t)
	bLn := listen(t)
	link := newLinkProxy(t, bLn.Addr().String())
	b := stagedEngine(t, "node-b", false, nil, func(o *Options) { o.Listener, o.Advertise = bLn, link.Addr() })
	a := stagedEngine(t, "node-a", false, sa, func(o *Options) { o.MaxInFlightBytes = 32 << 20 })
	const size = 256 << 20
	aMem, bMem := mapRegion(t, size), mapRegion(t, size)
	ld := registerGPU(t, a, sa, "a/1", aMem)
	rd := register(t, b, "b/1", bMem)
	imp(t, a, rd)
	// Slow the GPU so the transfers are still running when the link goes.
	sa.beforeToHost = func(int) error { time.Sleep(20 * time.Millisecond); return nil }
	sa.beforeFromHost = sa.beforeToHost

	for _, it := range []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}, {Src: rd.ID, Dst: ld.ID, Size: size}} {
		pb := a.NewPlan()
		if err := pb.Add(it); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		tr, err := a.Submit(ctx, pb.Build(), engines.SubmitOptions{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "16 MiB moved", func() bool { s := a.Stats(); return s.Sent+s.Received >= 16<<20 })
		link.Partition(true)
		cut := time.Now()
		err = tr.Wait(ctx)
		lost := time.Since(cut)
		cancel()
		wantPeerLost(t, "staged transfer across a partition", err, "node-b")
		if lost > 2*time.Second {
			t.Fatalf("staged transfer failed %v after the partition, want within 2 s", lost)
		}
		link.Partition(false)
		a.Disconnect("node-b", "test: reconnect")
		b.Disconnect("node-a", "test: reconnect")
		a.stats.sent.Store(0)
		a.stats.received.Store(0)
	}
	if _, _, err := a.reg.Lookup(ld.ID); err != nil {
		t.Fatalf("the GPU region is gone after the peer was lost: %v", err)
	}
	sa.beforeToHost, sa.beforeFromHost = nil, nil
	if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: 1 << 20}}, 10*time.Second); err != nil {
		t.Fatalf("transfer after the link came back: %v", err)
	}
}

// TestStagingRefusals: without a stager, or for a region the stager cannot reach, GPU pairs are refused with the
// reason; a remote GPU region without a TCP endpoint is refused too; Yield hands GPU pairs to another engine.
func TestStagingRefusals(t *testing.T) {
	s := newFakeStager(t)
	s.refuse["a/amd"] = "AMD GPU memory: no HIP staging"
	yield := false
	a := stagedEngine(t, "node-a", true, s, func(o *Options) { o.Yield = func(_, _ *engines.MemoryDesc) bool { return yield } })
	plain := stagedEngine(t, "node-p", true, nil, func(o *Options) { o.NoStageReason = "CUDA driver not loaded" })
	b := stagedEngine(t, "node-b", true, nil, nil)
	hb := register(t, b, "b/host", make([]byte, 4096))
	imp(t, a, hb)
	imp(t, plain, hb)

	amd := registerGPU(t, a, s, "a/amd", make([]byte, 4096))
	if amd.Handles.TCP != "" {
		t.Fatal("a region the stager refused got a TCP endpoint")
	}
	if ok, why := a.CanHandle(&amd, &hb); ok || !strings.Contains(why, "no HIP staging") {
		t.Fatalf("CanHandle(unstageable GPU) = %v, %q", ok, why)
	}
	pg := registerGPU(t, plain, nil, "p/gpu", make([]byte, 4096))
	if ok, why := plain.CanHandle(&pg, &hb); ok || !strings.Contains(why, "CUDA driver not loaded") {
		t.Fatalf("CanHandle(GPU, no stager) = %v, %q", ok, why)
	}
	if ok, why := plain.Staging(); ok || !strings.Contains(why, "CUDA driver not loaded") {
		t.Fatalf("Staging() without a stager = %v, %q", ok, why)
	}
	if ok, why := a.Staging(); !ok || !strings.Contains(why, "64 MiB per peer") {
		t.Fatalf("Staging() = %v, %q", ok, why)
	}
	// A peer's GPU region without a TCP endpoint: its node does not stage.
	remoteGPU := engines.MemoryDesc{ID: "b/gpu", Node: "node-b", Size: 4096,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}
	imp(t, a, remoteGPU)
	ha := register(t, a, "a/host", make([]byte, 4096))
	if ok, why := a.CanHandle(&ha, &remoteGPU); ok || !strings.Contains(why, "does not stage") {
		t.Fatalf("CanHandle(host, unstaged remote GPU) = %v, %q", ok, why)
	}
	g := registerGPU(t, a, s, "a/gpu", make([]byte, 4096))
	if ok, why := a.CanHandle(&g, &hb); !ok {
		t.Fatalf("CanHandle(staged GPU, remote host) refused: %s", why)
	}
	yield = true
	if ok, why := a.CanHandle(&g, &hb); ok || !strings.Contains(why, "another engine") {
		t.Fatalf("CanHandle with a yielding pair = %v, %q", ok, why)
	}
	if ok, _ := a.CanHandle(&ha, &hb); !ok {
		t.Fatal("host pairs are yielded too")
	}
	if _, err := New(Options{Node: "x", StagingBytes: stageSlot}); err == nil {
		t.Fatal("a staging bound below two slots was accepted")
	}
	if err := a.Deregister(context.Background(), g.ID); err != nil {
		t.Fatal(err)
	}
	if s.released.Load() != 1 {
		t.Fatalf("deregistering released %d stagings, want 1", s.released.Load())
	}
}

// TestStagingReleasedWhenIdle: staging slots unused for the idle time go back to the stager on both sides, and
// the next transfer allocates them again.
func TestStagingReleasedWhenIdle(t *testing.T) {
	sa, sb := newFakeStager(t), newFakeStager(t)
	short := func(o *Options) { o.stageIdle = 100 * time.Millisecond }
	a := stagedEngine(t, "node-a", false, sa, short)
	b := stagedEngine(t, "node-b", true, sb, short)
	const size = 6 * stageSlot
	ld := registerGPU(t, a, sa, "a/1", seq(size, 31))
	rd := registerGPU(t, b, sb, "b/1", make([]byte, size))
	imp(t, a, rd)
	for round := range 2 {
		if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}, 10*time.Second); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if sa.allocs.Load() == 0 || sb.allocs.Load() == 0 {
			t.Fatalf("round %d: no staging slots allocated (%d, %d)", round, sa.allocs.Load(), sb.allocs.Load())
		}
		waitFor(t, 5*time.Second, "idle staging slots released", func() bool {
			return sa.frees.Load() == sa.allocs.Load() && sb.frees.Load() == sb.allocs.Load()
		})
	}
	if sa.allocs.Load() < 2 {
		t.Fatalf("the second transfer allocated no slots again (%d in all)", sa.allocs.Load())
	}
}
