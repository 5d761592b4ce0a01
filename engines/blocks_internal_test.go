// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestRepeatedDestinationFindsARepeatAtAnyBatchSize: a destination region named twice is found wherever the two
// pairs are, below and above the size where the check moves from pair-by-pair to a map, and distinct ones are not.
func TestRepeatedDestinationFindsARepeatAtAnyBatchSize(t *testing.T) {
	for _, n := range []int{1, 2, 3, 16, 17, 64} {
		pairs := make([]BlockPair, n)
		for i := range pairs {
			pairs[i] = BlockPair{Src: MemoryID(fmt.Sprintf("n/s%d", i)), Dst: MemoryID(fmt.Sprintf("n/d%d", i))}
		}
		if dst, dup := repeatedDestination(pairs); dup {
			t.Fatalf("%d distinct pairs: %s reported twice", n, dst)
		}
		for i := 1; i < n; i++ {
			for _, j := range []int{0, i - 1} {
				saved := pairs[i].Dst
				pairs[i].Dst = pairs[j].Dst
				if dst, dup := repeatedDestination(pairs); !dup || dst != pairs[j].Dst {
					t.Fatalf("%d pairs, pair %d names pair %d's destination: got %q, %v", n, i, j, dst, dup)
				}
				pairs[i].Dst = saved
			}
		}
	}
}

// TestFirstDuplicateAgreesWithTheDefinition: every way of checking (pair by pair, the bitmap unset id by id or
// cleared, the sort) finds a repeat exactly when there is one, the first repeat where it says so, and leaves the
// shared bitmap empty, so the next list is not told it repeats ids it never held.
func TestFirstDuplicateAgreesWithTheDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var scratch dupScratch
	for round := range 4000 {
		n := 1 + rng.IntN(40)
		if round%10 == 0 {
			n = 1 + rng.IntN(3000)
		}
		space := []uint32{8, 1 << 10, 1 << 20, maxBitmapIDs + 1<<20}[rng.IntN(4)]
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = rng.Uint32N(space)
		}
		if n > 1 && rng.IntN(2) == 0 {
			ids[rng.IntN(n)] = ids[rng.IntN(n)] // often a repeat, sometimes an id over itself
		}
		want := -1
		for i := 1; i < n && want < 0; i++ {
			if slices.Contains(ids[:i], ids[i]) {
				want = i
			}
		}
		got, dup := firstDuplicate(ids, slices.Max(ids), &scratch)
		if dup != (want >= 0) {
			t.Fatalf("round %d, %d ids below %d: repeat reported %v, want %v", round, n, space, dup, want >= 0)
		}
		if dup && countOf(ids, ids[got]) < 2 {
			t.Fatalf("round %d: index %d (id %d) is not repeated", round, got, ids[got])
		}
		if dup && (n <= shortIDList || slices.Max(ids) < maxBitmapIDs) && got != want {
			t.Fatalf("round %d, %d ids: first repeat at %d, want %d", round, n, got, want)
		}
		if i := slices.IndexFunc(scratch.words, func(w uint64) bool { return w != 0 }); i >= 0 {
			t.Fatalf("round %d, %d ids below %d: bitmap word %d left %#x", round, n, space, i, scratch.words[i])
		}
	}
}

func countOf(ids []uint32, id uint32) int {
	n := 0
	for _, v := range ids {
		if v == id {
			n++
		}
	}
	return n
}
