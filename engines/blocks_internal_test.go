// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"fmt"
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
