// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi

import (
	"math/rand/v2"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
)

func TestSplitBytesCoversEverySegmentOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		var segs []engines.Segment
		var total, off uint64
		for i := rng.IntN(20) + 1; i > 0; i-- {
			n := uint64(rng.IntN(5000) + 1)
			segs = append(segs, engines.Segment{SrcOffset: off, DstOffset: off + 7, Size: n})
			off += n + uint64(rng.IntN(3))
			total += n
		}
		parts := rng.IntN(8) + 1
		got := splitBytes(segs, total, parts)
		if len(got) > parts {
			t.Fatalf("%d parts, asked for %d", len(got), parts)
		}
		covered := map[uint64]int{}
		for _, p := range got {
			for _, s := range p {
				if s.DstOffset != s.SrcOffset+7 {
					t.Fatalf("split segment %+v lost its pairing", s)
				}
				for b := s.SrcOffset; b < s.SrcOffset+s.Size; b++ {
					covered[b]++
				}
			}
		}
		for _, s := range segs {
			for b := s.SrcOffset; b < s.SrcOffset+s.Size; b++ {
				if covered[b] != 1 {
					t.Fatalf("byte %d copied %d times", b, covered[b])
				}
			}
		}
		if uint64(len(covered)) != total {
			t.Fatalf("%d bytes covered, want %d", len(covered), total)
		}
	}
}
