// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

type fakeCopier struct {
	ord    int
	closed *int
}

func (c *fakeCopier) Close() error { *c.closed++; return nil }

// fakeRuntime: GPUs 0 and 1 reach each other, GPU 2 reaches nobody.
type fakeRuntime struct {
	made, closed, peerCalls, current int
}

func (f *fakeRuntime) DeviceCount() (int, error)          { return 3, nil }
func (f *fakeRuntime) DeviceGet(ordinal int) (int, error) { return ordinal, nil }
func (f *fakeRuntime) DevicePCIBusID(dev int) (string, error) {
	return fmt.Sprintf("0000:%02X:00.0", 0x0a+dev), nil
}
func (f *fakeRuntime) CanAccessPeer(dev, peer int) (bool, error) {
	f.peerCalls++
	return dev != 2 && peer != 2, nil
}
func (f *fakeRuntime) NewCopier(ordinal int) (*fakeCopier, error) {
	f.made++
	return &fakeCopier{ord: ordinal, closed: &f.closed}, nil
}
func (f *fakeRuntime) InOrdinal(ordinal int, fn func() error) error {
	prev := f.current
	f.current = ordinal
	defer func() { f.current = prev }()
	return fn()
}
func (f *fakeRuntime) EnablePeer(from, to int, _, _ int) error { return nil }

func newFake() (*Registry[*fakeCopier, int], *fakeRuntime) {
	rt := &fakeRuntime{current: -1}
	r := NewRegistry[*fakeCopier, int](rt, "cuda", "CUDA", engines.VendorNVIDIA, "NVLink")
	if err := r.Enumerate(); err != nil {
		panic(err)
	}
	return r, rt
}

func TestRegistryCopierOncePerGPU(t *testing.T) {
	r, rt := newFake()
	if n, err := r.Of(engines.Location{BusID: "0000:0b:00.0"}); err != nil || n != 1 || r.Count() != 3 {
		t.Fatalf("enumerated %d devices; 0000:0b:00.0 is %d (%v), want 1", r.Count(), n, err)
	}
	if !r.Owns(&engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}) ||
		r.Owns(&engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorAMD}}) {
		t.Error("Owns must take the backend's vendor's GPU memory only")
	}
	a, _ := r.Copier(1)
	b, _ := r.Copier(1)
	if a != b || rt.made != 1 {
		t.Fatalf("two copiers (%d made) for one GPU", rt.made)
	}
	if c, ok := r.AnyCopier(); !ok || c != a {
		t.Errorf("AnyCopier = %v %v", c, ok)
	}
	if err := r.Close(); err != nil || rt.closed != 1 {
		t.Errorf("Close closed %d copiers (%v), want 1", rt.closed, err)
	}
}

func TestRegistryPeerRuleIsAskedOnceAndNamesTheLink(t *testing.T) {
	r, rt := newFake()
	r.Put("a", &Region{Ordinal: 0})
	r.Put("c", &Region{Ordinal: 2})
	gpu := func(id string) *engines.MemoryDesc {
		return &engines.MemoryDesc{ID: engines.MemoryID(id), Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}
	}
	src, dst := gpu("a"), gpu("c")
	for range 2 {
		ok, why := r.Claims(src, dst)
		if ok || why != "GPU 0 cannot reach GPU 2 directly: no peer access between them (no NVLink or PCIe P2P)" {
			t.Fatalf("Claims = %v %q", ok, why)
		}
	}
	if rt.peerCalls != 1 {
		t.Errorf("the runtime was asked %d times for one pair, want once", rt.peerCalls)
	}
	if ms, md, ok := r.Pair("a", "missing"); ok || ms == nil || md != nil {
		t.Errorf("Pair with an unmapped side = %v %v %v", ms, md, ok)
	}
	if err := r.NotMapped(); !errors.Is(err, engines.ErrUnknownMemory) || !strings.Contains(err.Error(), "cuda backend") {
		t.Errorf("NotMapped = %v", err)
	}
	if got := r.Accessors(0); len(got) != 2 || got[0] != 0 || got[1] != 1 {
		t.Errorf("Accessors(0) = %v, want the owner then its peer [0 1]", got)
	}
}

func TestRegistryHeldRegionIsReleasedByItsLastHandle(t *testing.T) {
	r, rt := newFake()
	released := 0
	if _, _, err := r.Hold("x"); err == nil || err.Error() != "x is not NVIDIA GPU memory the CUDA backend mapped" {
		t.Fatalf("Hold of an unknown region: %v", err)
	}
	r.Put("h", &Region{Ordinal: -1})
	if _, _, err := r.Hold("h"); err == nil || !strings.Contains(err.Error(), "host memory") {
		t.Fatalf("Hold of host memory: %v", err)
	}
	m := &Region{Ordinal: 1}
	r.ReleaseIn(m, func() error {
		if rt.current != 1 {
			t.Errorf("released with GPU %d current, want 1", rt.current)
		}
		released++
		return nil
	})
	r.Put("g", m)
	if _, _, err := r.Hold("g"); err == nil || !strings.Contains(err.Error(), "no copier on GPU 1") {
		t.Fatalf("Hold before the GPU's copier exists: %v", err)
	}
	r.Copier(1)
	h1, _, err1 := r.Hold("g")
	h2, _, err2 := r.Hold("g")
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if err := r.Release("g"); err != nil || released != 0 {
		t.Fatalf("Release while held: %v, released %d times", err, released)
	}
	if _, _, ok := r.Pair("g", "g"); ok {
		t.Error("a released region is still mapped for copies")
	}
	r.Unhold(h1)
	if released != 0 {
		t.Fatal("released while a handle remains")
	}
	r.Unhold(h2)
	if released != 1 {
		t.Fatalf("released %d times after the last handle, want once", released)
	}
}

func TestRegistrySegmentsAreAddressed(t *testing.T) {
	r, _ := newFake()
	buf := r.Segments([]engines.Segment{{SrcOffset: 16, DstOffset: 32, Size: 8}}, 0x1000, 0x2000)
	if got := *buf; len(got) != 1 || got[0].Src != 0x1010 || got[0].Dst != 0x2020 || got[0].Size != 8 {
		t.Fatalf("segments %+v", got)
	}
	r.PutSegments(buf)
}

type slowCopy struct{ waits int }

func (s *slowCopy) Wait(ctx context.Context) error {
	s.waits++
	if s.waits == 1 {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func TestWaitStoppedWaitsForTheGPUAfterCancel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	p := &slowCopy{}
	if err := WaitStopped(ctx, p); !errors.Is(err, context.DeadlineExceeded) || p.waits != 2 {
		t.Fatalf("WaitStopped = %v after %d waits; want the context's error after waiting again", err, p.waits)
	}
}

func TestEventsReuseByKind(t *testing.T) {
	var p Events[uintptr]
	if _, ok := p.Get(true); ok {
		t.Fatal("an empty pool handed out an event")
	}
	p.Put(0, false) // none taken: ignored
	p.Put(7, true)
	if _, ok := p.Get(false); ok {
		t.Error("a timing event was handed out as a plain one")
	}
	if ev, ok := p.Get(true); !ok || ev != 7 {
		t.Errorf("Get(timing) = %d %v", ev, ok)
	}
	p.Put(8, false)
	var destroyed []uintptr
	p.Destroy(func(ev uintptr) error { destroyed = append(destroyed, ev); return nil })
	if len(destroyed) != 1 || destroyed[0] != 8 {
		t.Errorf("destroyed %v, want [8]", destroyed)
	}
}

// A region's release moves the mapping epoch before its memory is unmapped, whether it is unmapped now, by
// its last holder, or never by this process (its release function is nil); an unknown id moves nothing.
func TestRegistryReleaseMovesTheMappingEpochFirst(t *testing.T) {
	r, _ := newFake()
	var epochAtUnmap []uint64
	unmap := func() error { epochAtUnmap = append(epochAtUnmap, r.MappingEpoch()); return nil }
	r.Put("now", &Region{Ordinal: 0, Release: unmap})
	r.Put("held", &Region{Ordinal: 1, Release: unmap})
	r.Put("foreign", &Region{Ordinal: 0})
	if _, err := r.Copier(1); err != nil {
		t.Fatal(err)
	}
	held, _, err := r.Hold("held")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Release("now"); err != nil || r.MappingEpoch() != 1 || len(epochAtUnmap) != 1 || epochAtUnmap[0] != 1 {
		t.Fatalf("after releasing a region: epoch %d, epochs seen at unmapping %v (%v); want 1 and [1]", r.MappingEpoch(), epochAtUnmap, err)
	}
	if err := r.Release("held"); err != nil || r.MappingEpoch() != 2 || len(epochAtUnmap) != 1 {
		t.Fatalf("after releasing a held region: epoch %d, unmapped %d times (%v); want 2 and not yet", r.MappingEpoch(), len(epochAtUnmap), err)
	}
	if err := r.Unhold(held); err != nil || len(epochAtUnmap) != 2 || epochAtUnmap[1] != 2 {
		t.Fatalf("the last holder's unmapping saw epochs %v (%v), want [1 2]", epochAtUnmap, err)
	}
	if err := r.Release("foreign"); err != nil || r.MappingEpoch() != 3 {
		t.Fatalf("a region this process does not unmap: epoch %d (%v), want 3", r.MappingEpoch(), err)
	}
	if err := r.Release("unknown"); err != nil || r.MappingEpoch() != 3 {
		t.Fatalf("an unknown id moved the epoch to %d (%v)", r.MappingEpoch(), err)
	}
}
