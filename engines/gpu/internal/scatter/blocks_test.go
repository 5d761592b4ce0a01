// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package scatter

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestPlanBlocksMatchesSegments holds the block-list encoder to the reference decoder: every form it picks
// must describe exactly the segments the ids name, pair after pair.
func TestPlanBlocksMatchesSegments(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name      string
		bs        uint64
		pairs     int
		ids       int
		pool      uint32
		congruent bool
	}{
		{"one pair of 720 B blocks", 720, 1, 15360, 1 << 18, true},
		{"64 tensors of 16 KiB blocks", 16 << 10, 64, 1024, 1024, true},
		{"tensors 512 B apart, 720 B blocks", 720, 4, 500, 4096, false},
		{"single block", 4096, 1, 1, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pairs := make([]BlockBases, tc.pairs)
			region := uint64(tc.pool) * tc.bs
			for p := range pairs {
				gap := uint64(0)
				if !tc.congruent {
					gap = 512 * uint64(p+1)
				}
				pairs[p] = BlockBases{Src: 1<<40 + uint64(p)*region + gap, Dst: 1<<41 + uint64(tc.pairs-1-p)*region}
			}
			src := rng.Perm(int(tc.pool))[:tc.ids]
			dst := rng.Perm(int(tc.pool))[:tc.ids]
			srcIDs, dstIDs := make([]uint32, tc.ids), make([]uint32, tc.ids)
			for i := range src {
				srcIDs[i], dstIDs[i] = uint32(src[i]), uint32(dst[i])
			}
			l, ok := PlanBlocks(pairs, tc.bs, len(srcIDs), rangeOf(srcIDs), rangeOf(dstIDs), 32<<10)
			if !ok {
				t.Fatal("PlanBlocks found no form")
			}
			buf := make([]byte, l.Bytes())
			for i := range buf {
				buf[i] = 0xff // padding must be written, not left over
			}
			WriteBlocks(buf, l, pairs, tc.bs, srcIDs, dstIDs)
			var want []Segment
			for _, p := range pairs {
				for i := range srcIDs {
					want = append(want, Segment{Src: p.Src + uint64(srcIDs[i])*tc.bs, Dst: p.Dst + uint64(dstIDs[i])*tc.bs, Size: tc.bs})
				}
			}
			if got := Read(buf, l); !slices.Equal(got, want) {
				t.Fatalf("decoded %d segments differ from the %d the ids name (first: %+v vs %+v)", len(got), len(want), got[0], want[0])
			}
		})
	}
}

// TestPlanBlocksRefuses checks the shapes the flat kernels cannot take fall back to segments.
func TestPlanBlocksRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		pairs []BlockBases
		bs    uint64
	}{
		"unaligned block":     {[]BlockBases{{Src: 0, Dst: 0}}, 100},
		"block above a piece": {[]BlockBases{{Src: 0, Dst: 0}}, 64 << 10},
		"unaligned base":      {[]BlockBases{{Src: 8, Dst: 0}}, 720},
		"no pairs":            {nil, 720},
		"offsets beyond 2^36": {[]BlockBases{{Src: 0, Dst: 0}, {Src: 1 << 40, Dst: 720}}, 720},
	} {
		if _, ok := PlanBlocks(tc.pairs, tc.bs, 1, IDRange{}, IDRange{}, 32<<10); ok {
			t.Errorf("%s: PlanBlocks accepted it", name)
		}
	}
}

func BenchmarkWriteBlocks(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	ids := func() []uint32 {
		out := make([]uint32, 15360)
		for i, v := range rng.Perm(1 << 18)[:15360] {
			out[i] = uint32(v)
		}
		return out
	}
	src, dst := ids(), ids()
	pairs := []BlockBases{{Src: 1 << 40, Dst: 1 << 41}}
	l, _ := PlanBlocks(pairs, 720, len(src), rangeOf(src), rangeOf(dst), 32<<10)
	buf := make([]byte, l.Bytes())
	b.ReportAllocs()
	for b.Loop() {
		l, _ = PlanBlocks(pairs, 720, len(src), rangeOf(src), rangeOf(dst), 32<<10)
		WriteBlocks(buf, l, pairs, 720, src, dst)
	}
}

func rangeOf(ids []uint32) IDRange {
	r := IDRange{Min: ^uint32(0)}
	for _, v := range ids {
		r.Min, r.Max = min(r.Min, v), max(r.Max, v)
	}
	return r
}
