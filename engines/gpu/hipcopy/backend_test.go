// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package hipcopy

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/gpu/internal/scatter"
	"github.com/fabricxfer/fabricxfer/native/kernels"
)

func gpuDesc(id string, v engines.Vendor, dev int) *engines.MemoryDesc {
	return &engines.MemoryDesc{ID: engines.MemoryID(id), Node: "n", Size: 4096,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: v, Device: dev}}
}

// TestClaimsByVendorAndReach runs without a GPU: the refusals that need no
// runtime (vendor, reachability) and the acceptance of mapped regions.
func TestClaimsByVendorAndReach(t *testing.T) {
	b := newBackend(nil, Options{})
	host := &engines.MemoryDesc{ID: "host", Node: "n", Size: 4096, Location: engines.Location{Kind: engines.LocationHost}}
	amd0, amd0b, nv := gpuDesc("amd0", engines.VendorAMD, 0), gpuDesc("amd0b", engines.VendorAMD, 0), gpuDesc("nv", engines.VendorNVIDIA, 0)
	unmapped := gpuDesc("amd-unmapped", engines.VendorAMD, 1)
	b.reg.Put("amd0", &mapped{Ordinal: 0, Addr: 0x1000})
	b.reg.Put("amd0b", &mapped{Ordinal: 0, Addr: 0x9000})
	b.reg.Put("host", &mapped{Ordinal: -1, Addr: 0x5000})
	for _, c := range []struct {
		name     string
		src, dst *engines.MemoryDesc
		ok       bool
		why      string
	}{
		{"nvidia pair", nv, nv, false, "neither side is AMD GPU memory"},
		{"host pair", host, host, false, "neither side is AMD GPU memory"},
		{"amd to nvidia", amd0, nv, false, "nv is nvidia GPU memory"},
		{"unmapped amd", unmapped, amd0, false, "amd-unmapped is not reachable from this process"},
		{"same GPU", amd0, amd0b, true, ""},
		{"GPU to host", amd0, host, true, ""},
		{"host to GPU", host, amd0, true, ""},
	} {
		ok, why := b.Claims(c.src, c.dst)
		if ok != c.ok || !strings.Contains(why, c.why) || (c.ok && why != "") {
			t.Errorf("%s: Claims = %t, %q; want %t, %q", c.name, ok, why, c.ok, c.why)
		}
	}
	if b.Name() != "hip" || b.Limits().MaxPlanSegments != 1<<24 {
		t.Errorf("name %q limits %+v", b.Name(), b.Limits())
	}
}

// TestPeerRefusalIsRemembered: a pair of GPUs whose peer access failed is
// refused with the reason, without asking the runtime again.
func TestPeerRefusalIsRemembered(t *testing.T) {
	b := newBackend(nil, Options{})
	b.reg.Put("a", &mapped{Ordinal: 0})
	b.reg.Put("b", &mapped{Ordinal: 1})
	b.reg.SetPeer(0, 1, errors.New("no peer access between them (no XGMI link or PCIe P2P)"))
	ok, why := b.Claims(gpuDesc("a", engines.VendorAMD, 0), gpuDesc("b", engines.VendorAMD, 1))
	if ok || why != "GPU 0 cannot reach GPU 1 directly: no peer access between them (no XGMI link or PCIe P2P)" {
		t.Fatalf("Claims = %t, %q", ok, why)
	}
}

func TestCopyRefusesRegionsItDidNotMap(t *testing.T) {
	b := newBackend(nil, Options{})
	err := b.Copy(context.Background(), engines.Work{Plan: &engines.Plan{}, Src: gpuDesc("a", engines.VendorAMD, 0), Dst: gpuDesc("b", engines.VendorAMD, 0)})
	if !errors.Is(err, engines.ErrUnknownMemory) || !strings.Contains(err.Error(), "hip backend") {
		t.Fatalf("Copy of unmapped regions = %v", err)
	}
	if _, err := b.ordinal(engines.Location{BusID: "0000:c1:00.0"}); err == nil || !strings.Contains(err.Error(), "no HIP device at PCI address 0000:c1:00.0") {
		t.Fatalf("ordinal of an unknown PCI address: %v", err)
	}
}

func TestOptionsDefaults(t *testing.T) {
	o, err := Options{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.CopyEngineMin != 16<<20 || o.MaxPiece != 32<<10 || o.SpinWait != 200*time.Microsecond || o.SleepRate != 6e12 || o.Force != "" {
		t.Fatalf("defaults %+v", o)
	}
	set := Options{CopyEngineMin: 1 << 20, MaxPiece: 4096, SpinWait: time.Millisecond, SleepRate: 1e9, Force: ModePerItem}
	if o, err := set.withDefaults(); err != nil || o.CopyEngineMin != 1<<20 || o.MaxPiece != 4096 || o.SpinWait != time.Millisecond || o.SleepRate != 1e9 {
		t.Fatalf("explicit options changed: %+v, %v", o, err)
	}
	if _, err := (Options{MaxPiece: 3000}).withDefaults(); err == nil {
		t.Error("a piece size that is not a power of two was accepted")
	}
	if _, err := (Options{Force: "driver-batch"}).withDefaults(); err == nil {
		t.Error("a mode HIP does not have was accepted")
	}
}

// TestLaunchShapeFollowsTheSharedLayout holds the HIP launch geometry to the
// layout cudacopy uses and to copy.hip's constants: 64-lane wavefronts, and
// flat16 runs of scatter.FlatChunk pieces per block.
func TestLaunchShapeFollowsTheSharedLayout(t *testing.T) {
	if !strings.Contains(kernels.HIP, "#define FX_LANES 64\n") {
		t.Fatal("copy.hip's wavefront width is no longer 64: update lanes")
	}
	r := rand.New(rand.NewPCG(1, 2))
	kv := make([]scatter.Segment, 15360)
	for i, p := range r.Perm(1 << 18)[:15360] {
		kv[i] = scatter.Segment{Src: 0x7f0000000000 + uint64(p)*720, Dst: 0x7e0000000000 + uint64(r.IntN(1<<18))*720, Size: 720}
	}
	l, err := scatter.Plan(kv, defaultMaxPiece)
	if err != nil || !l.Flat16 {
		t.Fatalf("layout %+v, %v", l, err)
	}
	// 720 B = 45 vectors; FlatChunk(45, 256) = 22 pieces per block round. Block indices pack into 36 bits.
	if k, grid := launchShape(l, 304); k != kernelPacked || grid != (15360+21)/22 {
		t.Errorf("MI300X KV launch = %d, %d blocks; want packed, %d", k, grid, (15360+21)/22)
	}
	cut := []scatter.Segment{{Src: 0x1000000, Dst: 0x9000000, Size: 64 << 10}, {Src: 0x5000000, Dst: 0x2000000, Size: 64 << 10}}
	if lc, err := scatter.Plan(cut, defaultMaxPiece); err != nil || !lc.Flat16 || lc.Packed {
		t.Fatalf("cut items: layout %+v, %v", lc, err)
	} else if k, _ := launchShape(lc, 304); k != kernelFlat16 {
		t.Errorf("cut items launch kernel %d, want flat16", k)
	}
	if _, grid := launchShape(l, 10); grid != 10*blocksPerCU {
		t.Errorf("a 10-CU GPU gets %d blocks, want one wave of %d", grid, 10*blocksPerCU)
	}
	mixed := []scatter.Segment{{Src: 1, Dst: 1 << 20, Size: 100}, {Src: 4096, Dst: 2 << 20, Size: 70 << 10}}
	l, _ = scatter.Plan(mixed, defaultMaxPiece)
	if k, grid := launchShape(l, 304); k != kernelGeneral || l.Pieces != 4 || grid != 1 {
		t.Errorf("mixed sizes: kernel %d, %d blocks for %d pieces; want general, 1 block (4 wavefronts)", k, grid, l.Pieces)
	}
	odd := []scatter.Segment{{Src: 8, Dst: 1 << 20, Size: 24}, {Src: 1000, Dst: 2 << 20, Size: 24}}
	l, _ = scatter.Plan(odd, defaultMaxPiece)
	if k, _ := launchShape(l, 304); k != kernelUniform {
		t.Errorf("equal 8-byte-aligned items launch kernel %d, want uniform", k)
	}
}

// TestCompileImageWithoutRTC: without hipRTC the loader says so, but a cached
// code object for the target still serves.
func TestCompileImageWithoutRTC(t *testing.T) {
	dir := t.TempDir()
	if _, err := CompileImage(nil, "gfx942", 60200000, dir); err == nil || !strings.Contains(err.Error(), "hipRTC is not available and no cached code object for gfx942") {
		t.Fatalf("CompileImage without hipRTC: %v", err)
	}
	path := filepath.Join(dir, cacheKey("gfx942", 60200000))
	if err := os.WriteFile(path, []byte("\x7fELF cached"), 0o644); err != nil {
		t.Fatal(err)
	}
	img, err := CompileImage(nil, "gfx942", 60200000, dir)
	if err != nil || img.Origin != "cache" || string(img.Code) != "\x7fELF cached" || img.CachePath != path {
		t.Fatalf("cached image: %+v, %v", img, err)
	}
	// Another runtime version or target must not reuse it.
	if _, err := CompileImage(nil, "gfx942", 60300000, dir); err == nil {
		t.Error("a code object cached for another HIP version was used")
	}
	if _, err := CompileImage(nil, "", 60200000, dir); err == nil || !strings.Contains(err.Error(), "the current device") {
		t.Errorf("an unknown target must not be served from the cache: %v", err)
	}
	if !strings.HasPrefix(cacheKey("gfx90a", 1), "fxcopy-"+kernels.Hash(kernels.HIP)[:16]+"-gfx90a-hip1") {
		t.Errorf("cache key %q does not name the source hash, target and runtime", cacheKey("gfx90a", 1))
	}
}
