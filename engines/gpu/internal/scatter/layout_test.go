// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/native/kernels"
)

// pieces is what the kernel must copy for segs: each segment cut at maxPiece.
func pieces(segs []Segment, maxPiece uint64) []Segment {
	var out []Segment
	for _, s := range segs {
		for off := uint64(0); off < s.Size; off += maxPiece {
			out = append(out, Segment{Dst: s.Dst + off, Src: s.Src + off, Size: min(maxPiece, s.Size-off)})
		}
	}
	return out
}

func roundTrip(t *testing.T, segs []Segment, maxPiece uint64) Layout {
	t.Helper()
	l, err := Plan(segs, maxPiece)
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	buf := make([]byte, l.Bytes())
	Write(buf, segs, l, maxPiece)
	got := Read(buf, l)
	want := pieces(segs, maxPiece)
	if len(got) != len(want) {
		t.Fatalf("%d descriptors, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("descriptor %d = %+v, want %+v (uniform=%v shift=%d)", i, got[i], want[i], l.Uniform, l.Shift)
		}
	}
	return l
}

func TestUniformLayoutForEqualAlignedBlocks(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const block = 720
	var segs []Segment
	for _, i := range r.Perm(15360) {
		segs = append(segs, Segment{Src: 0x7f0000000000 + uint64(i)*block, Dst: 0x7e0000000000 + uint64(r.IntN(1<<20))*block, Size: block})
	}
	l := roundTrip(t, segs, 32<<10)
	if !l.Uniform || !l.Flat16 {
		t.Fatal("equal 720 B blocks should use the flat uniform form")
	}
	if l.Shift != 4 {
		t.Errorf("shift = %d, want 4 (720 = 45 * 16)", l.Shift)
	}
	// Sources index 15,360 blocks (14 bits), destinations 2^20 (20 bits), in units of the block.
	if !l.Packed || l.Unit != block || l.SrcBits != 14 || l.DstBits != 20 {
		t.Fatalf("packed=%v unit=%d bits=%d+%d, want packed in 720 B units, 14+20 bits", l.Packed, l.Unit, l.SrcBits, l.DstBits)
	}
	if want := ((15360*34+31)/32 + 3) * 4; l.Bytes() != want {
		t.Errorf("descriptor bytes = %d, want %d (34 bits a block, padded)", l.Bytes(), want)
	}
}

func TestPackedLayoutRoundTripsEveryWidth(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		name             string
		block, stride    uint64 // source offsets are multiples of stride, destinations of block
		srcPool, dstPool uint64 // in strides and blocks
		n                int
		unit             uint64 // 0: 1 << Shift
	}{
		{"one block each side", 720, 720, 1, 1, 1, 720},
		{"kv 2^18 pools", 720, 720, 1 << 18, 1 << 18, 15360, 720},
		{"wide and narrow, power-of-two block", 4096, 4096, 1 << 22, 3, 3, 0},
		{"offsets not multiples of the block", 48, 16, 1 << 20, 1 << 16, 2000, 16},
		{"odd block of 16-byte multiples", 16 * 63, 16 * 63, 1000, 70000, 999, 16 * 63},
	} {
		t.Run(c.name, func(t *testing.T) {
			seen := map[uint64]bool{}
			var segs []Segment
			for len(segs) < c.n {
				slot := r.Uint64N(c.dstPool)
				if seen[slot] {
					continue
				}
				seen[slot] = true
				segs = append(segs, Segment{Src: 0x7f0000000000 + r.Uint64N(c.srcPool)*c.stride, Dst: 0x7e0000000000 + slot*c.block, Size: c.block})
			}
			l := roundTrip(t, segs, 32<<10)
			want := c.unit
			if want == 0 {
				want = 1 << l.Shift
			}
			if !l.Packed || l.Unit != want {
				t.Fatalf("packed=%v unit=%d, want packed in units of %d", l.Packed, l.Unit, want)
			}
		})
	}
}

func TestPackedLayoutOnlyWhenSmaller(t *testing.T) {
	// 16-byte blocks 16 and 2^35 bytes apart: offsets of 32 bits each side in 16-byte units, no saving over 8 bytes.
	segs := []Segment{{Src: 0x10000, Dst: 0x20000, Size: 16}, {Src: 0x10010, Dst: 0x20010, Size: 16},
		{Src: 0x10000 + 1<<35, Dst: 0x20000 + 1<<35, Size: 16}}
	if l := roundTrip(t, segs, 32<<10); !l.Flat16 || l.Packed {
		t.Errorf("flat16=%v packed=%v, want the 8-byte flat form", l.Flat16, l.Packed)
	}
	// Items cut into pieces keep the 8-byte form.
	segs = []Segment{{Src: 0x1000000, Dst: 0x9000000, Size: 64 << 10}, {Src: 0x5000000, Dst: 0x2000000, Size: 64 << 10}}
	if l := roundTrip(t, segs, 32<<10); !l.Flat16 || l.Packed {
		t.Errorf("cut items: flat16=%v packed=%v, want the 8-byte flat form", l.Flat16, l.Packed)
	}
}

// Offsets that are not multiples of the block size must not be counted in blocks: a difference of 16 or 64
// bytes is not a multiple of 48, whatever its sign.
func TestPackedLayoutCountsBlocksOnlyForMultiples(t *testing.T) {
	segs := []Segment{
		{Src: 0x100000, Dst: 0x200000, Size: 48},
		{Src: 0x100000 + 64, Dst: 0x200000 + 48, Size: 48},
		{Src: 0x100000 + 96, Dst: 0x200000 + 96, Size: 48},
	}
	if l := roundTrip(t, segs, 32<<10); l.Packed && l.Unit == 48 {
		t.Fatalf("offsets 64 and 96 counted in 48-byte blocks: %+v", l)
	}
	r := rand.New(rand.NewPCG(9, 10))
	for n := 0; n < 3000; n++ {
		size := 16 * (1 + 2*r.Uint64N(32)) // odd multiples of 16
		var segs []Segment
		for i := 0; i < 2+r.IntN(6); i++ {
			// Destinations in disjoint slots; any 16-byte offsets on both sides.
			segs = append(segs, Segment{Src: 0x7f0000000000 + 16*r.Uint64N(1<<16), Dst: 0x7e0000000000 + uint64(i)*size*4 + 16*r.Uint64N(size/16*3), Size: size})
		}
		roundTrip(t, segs, 32<<10)
	}
}

func TestOddInverse(t *testing.T) {
	for _, odd := range []uint64{1, 3, 45, 63, 0xffffffffffffffff, 1<<63 + 1} {
		if got := odd * oddInverse(odd); got != 1 {
			t.Errorf("%d * inverse = %d, want 1", odd, got)
		}
	}
}

func TestUniformLayoutSplitsLargeBlocks(t *testing.T) {
	segs := []Segment{{Src: 0x1000000, Dst: 0x9000000, Size: 256 << 10}, {Src: 0x5000000, Dst: 0x2000000, Size: 256 << 10}}
	l := roundTrip(t, segs, 32<<10)
	if !l.Uniform || l.Pieces != 16 || l.PieceSize != 32<<10 {
		t.Fatalf("layout %+v, want 16 uniform pieces of 32 KiB", l)
	}
}

func TestGeneralLayoutForMixedSizesAndOddOffsets(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var segs []Segment
	for i := 0; i < 5000; i++ {
		segs = append(segs, Segment{Src: 0x10000 + r.Uint64N(1<<34), Dst: 0x20000 + r.Uint64N(1<<34), Size: 1 + r.Uint64N(100<<10)})
	}
	l := roundTrip(t, segs, 32<<10)
	if l.Uniform {
		t.Fatal("mixed sizes cannot use the uniform form")
	}
}

func TestUniformFallsBackWhenOffsetsOverflow32Bits(t *testing.T) {
	// Byte-granular offsets spanning more than 4 GiB do not fit 32-bit units.
	segs := []Segment{{Src: 1, Dst: 0, Size: 3}, {Src: 1 + 5<<30, Dst: 7, Size: 3}}
	if l := roundTrip(t, segs, 32<<10); l.Uniform {
		t.Fatalf("layout %+v should be general", l)
	}
}

func TestPlanLayoutRejectsEmptySegments(t *testing.T) {
	if _, err := Plan([]Segment{{Src: 1, Dst: 2, Size: 0}}, 1024); err == nil {
		t.Fatal("an empty segment was accepted")
	}
	if _, err := Plan([]Segment{{Src: 1, Dst: 2, Size: 8}}, 0); err == nil {
		t.Fatal("a zero piece size was accepted")
	}
}

func TestSplitBySize(t *testing.T) {
	small, big := SplitBySize([]Segment{{Size: 1}, {Size: 16 << 20}, {Size: 5}, {Size: 1 << 30}}, 16<<20)
	if len(small) != 2 || len(big) != 2 || big[0].Size != 16<<20 {
		t.Fatalf("small %v big %v", small, big)
	}
}

func BenchmarkDescriptors15360x720(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	segs := make([]Segment, 15360)
	for i, p := range r.Perm(1 << 18)[:15360] {
		segs[i] = Segment{Src: 0x7f0000000000 + uint64(p)*720, Dst: 0x7e0000000000 + uint64(r.IntN(1<<18))*720, Size: 720}
	}
	buf := make([]byte, 15360*24)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		small, _ := SplitBySize(segs, 16<<20)
		l, err := Plan(small, 32<<10)
		if err != nil {
			b.Fatal(err)
		}
		Write(buf, small, l, 32<<10)
	}
}

// BenchmarkStageKVDescriptors is the host work of one kernel submission of 15,360 equal 720 B blocks at random
// offsets: choosing the layout and writing the descriptors.
func BenchmarkStageKVDescriptors(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	const block = 720
	segs := make([]Segment, 0, 15360)
	for _, i := range r.Perm(262144)[:15360] {
		segs = append(segs, Segment{Src: 0x7f0000000000 + uint64(i)*block, Dst: 0x7e0000000000 + uint64(r.IntN(262144))*block, Size: block})
	}
	buf := make([]byte, len(segs)*8)
	for b.Loop() {
		l, err := Plan(segs, 32<<10)
		if err != nil || !l.Flat16 {
			b.Fatalf("layout %+v, %v", l, err)
		}
		Write(buf, segs, l, 32<<10)
	}
}

// The host sizes fx_scatter_flat16's grid with FlatChunk; the kernel walks the pieces with fx_flat_chunk. If
// they disagree, blocks skip or repeat pieces, so the constants must match the source that gets compiled.
func TestFlatChunkMatchesKernelSource(t *testing.T) {
	for name, src := range map[string]string{"copy.cu": kernels.CUDA, "copy.hip": kernels.HIP} {
		if !strings.Contains(src, "#define FX_FLAT_MAX_CHUNK 256\n") {
			t.Fatalf("%s no longer defines FX_FLAT_MAX_CHUNK 256: update FlatChunk", name)
		}
		if !strings.Contains(src, "fx_u32 c = (4 * threads) / per_piece;") {
			t.Fatalf("%s's fx_flat_chunk changed its rule: update FlatChunk", name)
		}
	}
	for _, c := range []struct{ per, want uint32 }{{45, 22}, {2048, 1}, {1024, 1}, {1, 256}, {4, 256}, {16, 64}} {
		if got := FlatChunk(c.per, 256); got != c.want {
			t.Errorf("FlatChunk(%d, 256) = %d, want %d", c.per, got, c.want)
		}
	}
}
