// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkPlanScattered plans one batch of 15,360 blocks of 720 B at random offsets (a KV-cache gather).
func BenchmarkPlanScattered(b *testing.B) {
	const n, bs = 15360, 720
	reg := testRegistry(b, map[MemoryID]uint64{"a/src": 2 * n * bs, "a/dst": 2 * n * bs})
	rng := rand.New(rand.NewPCG(1, 2))
	srcSlots, dstSlots := rng.Perm(2 * n)[:n], rng.Perm(2 * n)[:n]
	items := make([]Item, n)
	for i := range items {
		items[i] = Item{Src: "a/src", Dst: "a/dst", SrcOffset: uint64(srcSlots[i]) * bs, DstOffset: uint64(dstSlots[i]) * bs, Size: bs, Tag: Tag(i)}
	}
	for b.Loop() {
		p := NewPlanner("bench", reg, Limits{}, always)
		for _, it := range items {
			if err := p.Add(it); err != nil {
				b.Fatal(err)
			}
		}
		if ps := p.Build(); len(ps.Plans) != 1 {
			b.Fatalf("%d plans", len(ps.Plans))
		}
	}
}
