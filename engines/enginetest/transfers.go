// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package enginetest

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// scatter builds n blocks of bs bytes at shuffled, non-overlapping slots of both regions.
func scatter(p Pair, n int, bs uint64, seed uint64) []engines.Item {
	rng := rand.New(rand.NewPCG(seed, 7))
	slots := int(p.Size / bs)
	srcSlots, dstSlots := rng.Perm(slots)[:n], rng.Perm(slots)[:n]
	items := make([]engines.Item, n)
	for i := range items {
		items[i] = engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: uint64(srcSlots[i]) * bs,
			DstOffset: uint64(dstSlots[i]) * bs, Size: bs, Tag: engines.Tag(i)}
	}
	return items
}

func plan(t testing.TB, e engines.Engine, items []engines.Item) *engines.PlanSet {
	t.Helper()
	b := e.NewPlan()
	for _, it := range items {
		if err := b.Add(it); err != nil {
			t.Fatalf("Add(%+v): %v", it, err)
		}
	}
	ps := b.Build()
	if len(ps.Rejected) > 0 {
		t.Fatalf("Build rejected %v", ps.Rejected)
	}
	return ps
}

func fillRandom(p Pair, seed uint64) []byte {
	data := make([]byte, p.Size)
	rng := rand.New(rand.NewPCG(seed, 3))
	for i := 0; i+8 <= len(data); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			data[i+k] = byte(v >> (8 * k))
		}
	}
	p.Fill(0, data)
	return data
}

func submitWait(t testing.TB, e engines.Engine, ps *engines.PlanSet, opts engines.SubmitOptions) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	tr, err := e.Submit(ctx, ps, opts)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return tr.Wait(ctx)
}

func verify(t testing.TB, p Pair, src []byte, items []engines.Item) {
	t.Helper()
	for _, it := range items {
		got := p.Read(it.DstOffset, it.Size)
		if !bytes.Equal(got, src[it.SrcOffset:it.SrcOffset+it.Size]) {
			t.Fatalf("tag %d: destination [%d, +%d) differs from source [%d, +%d)", it.Tag, it.DstOffset, it.Size, it.SrcOffset, it.Size)
		}
	}
}

func testData(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 4<<20)
	src := fillRandom(p, 11)
	items := scatter(p, 300, 720, 5)
	// Plus one large contiguous item in a slot range no block uses (the tail of the regions).
	items = append(items, engines.Item{Src: p.Src, Dst: p.Dst, SrcOffset: 0, DstOffset: p.Size - (1 << 20), Size: 1 << 20, Tag: 9999})
	for i := range items[:300] {
		if items[i].DstOffset+items[i].Size > p.Size-(1<<20) {
			items[i].Size = 0 // becomes an empty item, dropped
		}
	}
	ps := plan(t, h.Engine, items)
	if err := submitWait(t, h.Engine, ps, engines.SubmitOptions{}); err != nil {
		t.Fatalf("transfer: %v", err)
	}
	verify(t, p, src, items)
}

func testWaitIdempotent(t *testing.T, h Harness, dir engines.Direction) {
	p := h.NewPair(t, dir, 1<<16)
	src := fillRandom(p, 12)
	items := scatter(p, 32, 1024, 9)
	ps := plan(t, h.Engine, items)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	tr, err := h.Engine.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := tr.Wait(ctx); err != nil {
			t.Fatalf("Wait #%d: %v", i, err)
		}
	}
	if o := tr.Outcomes(); len(o) != len(ps.Plans) {
		t.Fatalf("%d outcomes for %d plans", len(o), len(ps.Plans))
	}
	tr.Cancel() // after completion: no effect
	if err := tr.Wait(ctx); err != nil {
		t.Fatalf("Wait after Cancel of a finished transfer: %v", err)
	}
	verify(t, p, src, items)
	// The same plan set submitted again is a prepared batch.
	src2 := fillRandom(p, 13)
	if err := submitWait(t, h.Engine, ps, engines.SubmitOptions{}); err != nil {
		t.Fatalf("resubmitted plan set: %v", err)
	}
	verify(t, p, src2, items)
}

func testFailureTags(t *testing.T, h Harness, dir engines.Direction) {
	good := h.NewPair(t, dir, 1<<16)
	doomed := h.NewPair(t, dir, 1<<16)
	items := []engines.Item{
		{Src: good.Src, Dst: good.Dst, Size: 64, Tag: 1},
		{Src: doomed.Src, Dst: doomed.Dst, Size: 64, Tag: 2},
		{Src: doomed.Src, Dst: doomed.Dst, SrcOffset: 512, DstOffset: 512, Size: 64, Tag: 3},
	}
	ps := plan(t, h.Engine, items)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := h.Engine.Deregister(ctx, doomed.Dst); err != nil {
		t.Fatal(err)
	}
	err := submitWait(t, h.Engine, ps, engines.SubmitOptions{})
	var te *engines.TransferError
	if !errors.As(err, &te) || !errors.Is(err, engines.ErrUnknownMemory) {
		t.Fatalf("Wait = %v, want *TransferError wrapping ErrUnknownMemory", err)
	}
	failed := te.FailedTags()
	slices.Sort(failed)
	if !slices.Equal(failed, []engines.Tag{2, 3}) {
		t.Fatalf("failed tags %v, want [2 3]", failed)
	}
}

// stalled submits a transfer while the data path is gated, so it is certainly in flight.
func stalled(t *testing.T, h Harness, dir engines.Direction, opts engines.SubmitOptions) (Pair, engines.Transfer, func()) {
	t.Helper()
	if h.Gate == nil {
		t.Skip("harness cannot stall this engine's data path")
	}
	p := h.NewPair(t, dir, 1<<20)
	ps := plan(t, h.Engine, scatter(p, 64, 4096, 3))
	release := h.Gate(t)
	tr, err := h.Engine.Submit(context.Background(), ps, opts)
	if err != nil {
		release()
		t.Fatal(err)
	}
	select {
	case <-tr.Done():
		release()
		t.Fatal("transfer finished while the data path was stalled")
	case <-time.After(20 * time.Millisecond):
	}
	return p, tr, release
}

func waitDone(t *testing.T, tr engines.Transfer, within time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	err := tr.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatalf("transfer still running %v later", within)
	}
	return err
}

func testCancel(t *testing.T, h Harness, dir engines.Direction) {
	_, tr, release := stalled(t, h, dir, engines.SubmitOptions{})
	defer release()
	tr.Cancel()
	err := waitDone(t, tr, 2*time.Second)
	if !errors.Is(err, engines.ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after Cancel = %v, want ErrCancelled and context.Canceled", err)
	}
	var te *engines.TransferError
	if !errors.As(err, &te) || len(te.FailedTags()) == 0 {
		t.Fatalf("no failed tags reported: %v", err)
	}
}

func testDeadline(t *testing.T, h Harness, dir engines.Direction) {
	_, tr, release := stalled(t, h, dir, engines.SubmitOptions{Timeout: 150 * time.Millisecond})
	defer release()
	err := waitDone(t, tr, 2*time.Second)
	if !errors.Is(err, engines.ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past deadline = %v, want ErrDeadline and context.DeadlineExceeded", err)
	}
}

func testDeregisterGraceful(t *testing.T, h Harness, dir engines.Direction) {
	p, tr, release := stalled(t, h, dir, engines.SubmitOptions{})
	result := make(chan error, 1)
	var doneAtReturn bool
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		err := h.Engine.Deregister(ctx, p.Src)
		select {
		case <-tr.Done():
			doneAtReturn = true
		default:
		}
		result <- err
	}()
	select {
	case err := <-result:
		release()
		t.Fatalf("Deregister returned (%v) while a transfer using the region was stalled", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := waitDone(t, tr, 5*time.Second); err != nil {
		t.Fatalf("transfer waited for by Deregister failed: %v", err)
	}
	if err := <-result; err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if !doneAtReturn {
		t.Fatal("Deregister returned before the transfer using the region was done")
	}
}

func testDeregisterForced(t *testing.T, h Harness, dir engines.Direction) {
	p, tr, release := stalled(t, h, dir, engines.SubmitOptions{})
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := h.Engine.Deregister(ctx, p.Dst)
	select {
	case <-tr.Done():
	default:
		t.Fatalf("Deregister returned (%v) while the transfer using the region was still running", err)
	}
	if err != nil {
		t.Fatalf("Deregister after cancelling the in-flight transfer: %v", err)
	}
	if err := waitDone(t, tr, time.Second); !errors.Is(err, engines.ErrDeregistered) {
		t.Fatalf("in-flight transfer ended with %v, want ErrDeregistered", err)
	}
}

func testNotify(t *testing.T, h Harness, dir engines.Direction) {
	if h.SetDstNotify == nil {
		t.Skip("harness cannot observe the destination node's notifications")
	}
	p := h.NewPair(t, dir, 1<<16)
	got := make(chan engines.Notification, 4)
	h.SetDstNotify(dir, func(n engines.Notification) { got <- n })
	defer h.SetDstNotify(dir, nil)
	items := scatter(p, 16, 512, 4)
	ps := plan(t, h.Engine, items)
	if err := submitWait(t, h.Engine, ps, engines.SubmitOptions{Notify: []byte("kv-ready")}); err != nil {
		t.Fatal(err)
	}
	// Success means the handler already ran.
	select {
	case n := <-got:
		if string(n.Payload) != "kv-ready" || !slices.Equal(n.Regions, []engines.MemoryID{p.Dst}) || len(n.Tags) != len(items) {
			t.Fatalf("notification %+v, want payload kv-ready, regions [%s], %d tags", n, p.Dst, len(items))
		}
	default:
		t.Fatal("transfer succeeded but the destination handler was not called")
	}
	// Without a payload, nothing is sent.
	if err := submitWait(t, h.Engine, ps, engines.SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		t.Fatalf("unexpected notification %+v", n)
	case <-time.After(20 * time.Millisecond):
	}
}

func testConcurrent(t *testing.T, h Harness, dir engines.Direction) {
	const workers = 4
	pairs := make([]Pair, workers)
	srcs := make([][]byte, workers)
	itemSets := make([][]engines.Item, workers)
	sets := make([]*engines.PlanSet, workers)
	for i := range pairs {
		pairs[i] = h.NewPair(t, dir, 1<<18)
		srcs[i] = fillRandom(pairs[i], uint64(20+i))
		itemSets[i] = scatter(pairs[i], 64, 2048, uint64(30+i))
		sets[i] = plan(t, h.Engine, itemSets[i])
	}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = submitWait(t, h.Engine, sets[i], engines.SubmitOptions{})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		verify(t, pairs[i], srcs[i], itemSets[i])
	}
}

func planTags(ps *engines.PlanSet) []engines.Tag {
	var tags []engines.Tag
	for _, p := range ps.Plans {
		tags = append(tags, p.Tags...)
	}
	return tags
}

func rejectedTags(ps *engines.PlanSet) []engines.Tag {
	var tags []engines.Tag
	for _, r := range ps.Rejected {
		tags = append(tags, r.Item.Tag)
	}
	return tags
}

func samePlans(a, b *engines.PlanSet) bool {
	return slices.EqualFunc(a.Plans, b.Plans, func(x, y engines.Plan) bool {
		return x.Engine == y.Engine && x.Direction == y.Direction && x.Src == y.Src && x.Dst == y.Dst &&
			x.Bytes == y.Bytes && slices.Equal(x.Segments, y.Segments) && slices.Equal(x.Tags, y.Tags)
	})
}
