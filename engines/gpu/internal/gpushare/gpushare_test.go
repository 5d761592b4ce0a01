// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

func TestOrdinalsByBusThenIndex(t *testing.T) {
	var o Ordinals
	o.Runtime = "CUDA"
	o.Add("0000:1B:00.0", 1)
	o.Add("0000:0a:00.0", 0)
	if n, err := o.Of(engines.Location{BusID: "0000:1b:00.0", Device: 0}); err != nil || n != 1 {
		t.Errorf("by bus: %d, %v; want 1 (the PCI address wins over the index)", n, err)
	}
	if n, err := o.Of(engines.Location{Device: 1}); err != nil || n != 1 {
		t.Errorf("by index: %d, %v", n, err)
	}
	if _, err := o.Of(engines.Location{BusID: "0000:99:00.0"}); err == nil || !strings.Contains(err.Error(), "no CUDA device at PCI address 0000:99:00.0") {
		t.Errorf("unknown bus: %v", err)
	}
	if _, err := o.Of(engines.Location{Device: 2}); err == nil || !strings.Contains(err.Error(), "no CUDA device 2 (2 visible)") {
		t.Errorf("index out of range: %v", err)
	}
}

func TestClaimSaysWhyNot(t *testing.T) {
	gpu := func(id string, v engines.Vendor) *engines.MemoryDesc {
		return &engines.MemoryDesc{ID: engines.MemoryID(id), Location: engines.Location{Kind: engines.LocationGPU, Vendor: v}}
	}
	host := &engines.MemoryDesc{ID: "h", Location: engines.Location{Kind: engines.LocationHost}}
	noPeer := func(from, to int) error { return errors.New("no NVLink") }
	for _, c := range []struct {
		name     string
		src, dst *engines.MemoryDesc
		s, d     Side
		want     string
	}{
		{"host pair", host, host, Side{true, -1}, Side{true, -1}, "neither side is NVIDIA GPU memory"},
		{"other vendor", gpu("a", engines.VendorAMD), gpu("n", engines.VendorNVIDIA), Side{false, -1}, Side{true, 0}, "a is amd GPU memory"},
		{"unmapped", gpu("n", engines.VendorNVIDIA), host, Side{false, -1}, Side{true, -1}, "n is not reachable from this process"},
		{"no peer", gpu("x", engines.VendorNVIDIA), gpu("y", engines.VendorNVIDIA), Side{true, 0}, Side{true, 1}, "GPU 0 cannot reach GPU 1 directly: no NVLink"},
		{"same GPU", gpu("x", engines.VendorNVIDIA), gpu("y", engines.VendorNVIDIA), Side{true, 0}, Side{true, 0}, ""},
		{"GPU and host", gpu("x", engines.VendorNVIDIA), host, Side{true, 0}, Side{true, -1}, ""},
	} {
		ok, why := Claim(engines.VendorNVIDIA, c.src, c.dst, c.s, c.d, noPeer)
		if ok != (c.want == "") || !strings.Contains(why, c.want) {
			t.Errorf("%s: claim %v %q, want %q", c.name, ok, why, c.want)
		}
	}
}

func TestSpinUntil(t *testing.T) {
	n := 0
	finished, err := SpinUntil(context.Background(), time.Now().Add(time.Second), 0, func() (bool, error) { n++; return n == 3, nil })
	if !finished || err != nil || n != 3 {
		t.Errorf("finished %v err %v after %d polls, want done at the third", finished, err, n)
	}
	boom := errors.New("illegal address")
	if finished, err := SpinUntil(context.Background(), time.Now().Add(time.Second), 0, func() (bool, error) { return false, boom }); !finished || err != boom {
		t.Errorf("a failed query ends the wait with its error: %v %v", finished, err)
	}
	if finished, _ := SpinUntil(context.Background(), time.Now().Add(time.Millisecond), 0, func() (bool, error) { return false, nil }); finished {
		t.Error("past the deadline the wait must hand over, not report done")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if finished, _ := SpinUntil(ctx, time.Now().Add(time.Hour), 0, func() (bool, error) { return false, nil }); finished {
		t.Error("an ended context must stop the spin")
	}
	// With a gap, queries are spaced: 20 ms of polling every 5 ms is at most 5 queries, not thousands.
	n = 0
	SpinUntil(context.Background(), time.Now().Add(20*time.Millisecond), 5*time.Millisecond, func() (bool, error) { n++; return false, nil })
	if n < 2 || n > 5 {
		t.Errorf("%d queries in 20 ms with a 5 ms gap, want 2 to 5", n)
	}
}

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cache", "k.bin")
	if err := WriteFileAtomic(path, []byte("image")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "image" {
		t.Fatalf("read back %q, %v", b, err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".fxcopy-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestStagingReusesAndFreesBuffers(t *testing.T) {
	type buf struct{ size uint64 }
	allocs, frees := 0, 0
	p := &Staging[*buf]{
		Alloc: func(size uint64) (*buf, error) { allocs++; return &buf{size}, nil },
		Free:  func(*buf) error { frees++; return nil },
		Size:  func(b *buf) uint64 { return b.size },
	}
	a, _ := p.Get(100)
	if a.size != 64<<10 {
		t.Errorf("first buffer %d bytes, want the 64 KiB minimum", a.size)
	}
	big, _ := p.Get(123_000)
	if big.size != 128<<10 {
		t.Errorf("buffer for 123,000 bytes is %d, want the next power of two (128 KiB)", big.size)
	}
	p.Put(a)
	p.Put(big)
	if again, _ := p.Get(100_000); again != big || allocs != 2 {
		t.Errorf("a request an idle buffer fits must reuse it (got %d bytes, %d allocations)", again.size, allocs)
	}
	if err := p.Close(); err != nil || frees != 1 {
		t.Errorf("Close freed %d idle buffers (%v), want 1 (the other is still out)", frees, err)
	}
}

func TestCachedImageCompilesOnceAndSaysWhereItLies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.bin")
	compiles := 0
	compile := func() ([]byte, error) { compiles++; return []byte("image"), nil }
	img, origin, at, err := CachedImage(path, "nvrtc", compile)
	if err != nil || string(img) != "image" || origin != "nvrtc" || at != path {
		t.Fatalf("first start: %q %q %q %v", img, origin, at, err)
	}
	img, origin, at, err = CachedImage(path, "nvrtc", compile)
	if err != nil || string(img) != "image" || origin != "cache" || at != path || compiles != 1 {
		t.Fatalf("second start: %q %q %q %v after %d compiles, want the cached image", img, origin, at, err, compiles)
	}
	if _, _, at, _ := CachedImage("", "nvrtc", compile); at != "" || compiles != 2 {
		t.Errorf("without a cache: at %q after %d compiles", at, compiles)
	}
	boom := errors.New("no compiler")
	if _, _, _, err := CachedImage(filepath.Join(t.TempDir(), "x"), "nvrtc", func() ([]byte, error) { return nil, boom }); err != boom {
		t.Errorf("a failed compile must be reported as is: %v", err)
	}
}
