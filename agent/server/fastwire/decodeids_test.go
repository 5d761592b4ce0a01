// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestDecodeBlockIDsMatchesItsDefinition compares the branch-free int64 pass with the plain rule (every id below
// the layout's blocks, the first one that is not named) on random lists with a bad id planted anywhere, on
// aligned and unaligned buffers.
func TestDecodeBlockIDsMatchesItsDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	bad := []uint64{1 << 20, math.MaxUint32, math.MaxUint32 + 1, 1 << 62, 1<<63 - 1, 1 << 63, math.MaxUint64}
	for round := range 400 {
		blocks := uint64(1 + rng.IntN(1<<20))
		if round%7 == 0 {
			blocks = math.MaxUint32 + 5 // a layout wider than a uint32 id can name
		}
		n := 1 + rng.IntN(300)
		vals := make([]uint64, n)
		for i := range vals {
			vals[i] = rng.Uint64N(min(blocks, math.MaxUint32))
		}
		want := -1
		if round%2 == 1 {
			want = rng.IntN(n)
			vals[want] = bad[rng.IntN(len(bad))]
			if vals[want] < blocks && vals[want] <= math.MaxUint32 {
				want = -1 // not bad for this layout
			}
		}
		raw := make([]byte, 8*n+1)
		b := raw[round%2 : round%2+8*n] // odd rounds read an unaligned buffer
		for i, v := range vals {
			binary.LittleEndian.PutUint64(b[8*i:], v)
		}
		ids := make([]uint32, n)
		err := DecodeBlockIDs(ids, b, 8, blocks, "local")
		if want < 0 {
			if err != nil {
				t.Fatalf("round %d: good ids refused: %v", round, err)
			}
			for i, v := range vals {
				if ids[i] != uint32(v) {
					t.Fatalf("round %d: entry %d decoded as %d, sent %d", round, i, ids[i], v)
				}
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "(entry ") {
			t.Fatalf("round %d: id %d at entry %d of a layout of %d blocks: got %v", round, vals[want], want, blocks, err)
		}
		first := -1
		for i, v := range vals {
			if v >= blocks || v > math.MaxUint32 {
				first = i
				break
			}
		}
		if !strings.Contains(err.Error(), "(entry "+itoa(first)+")") {
			t.Fatalf("round %d: refusal names the wrong entry (first bad is %d): %v", round, first, err)
		}
	}
	if err := DecodeBlockIDs(make([]uint32, 1), make([]byte, 8), 8, 0, "remote"); err == nil {
		t.Fatal("an id of a layout of no blocks was taken")
	}
}

// TestInt32IDsDecodeAsSentAndOutsideIDsNamesTheFirstBadOne: int32 ids are copied as sent, whatever their range
// (the engines check it as they plan); OutsideIDs, what a refusal of the engines says, names one past the
// layout, the largest uint32 (an int32 -1) or 2^31 (the most negative int32) anywhere in a list of any length by
// its entry and the id as sent, and finds nothing in a list within the layout, the last block included.
func TestInt32IDsDecodeAsSentAndOutsideIDsNamesTheFirstBadOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 400 {
		blocks := uint64(1 + rng.IntN(1<<20))
		if round%9 == 0 {
			blocks = math.MaxUint32 // the widest layout: every id but the largest uint32 is in range
		}
		n := 1 + rng.IntN(300)
		vals := make([]uint32, n)
		for i := range vals {
			vals[i] = uint32(rng.Uint64N(blocks))
		}
		vals[rng.IntN(n)] = uint32(blocks - 1)
		want, shown := -1, ""
		if round%2 == 1 {
			want = rng.IntN(n)
			switch round % 3 {
			case 0:
				vals[want] = uint32(min(blocks, math.MaxUint32)) // one past the layout
			case 1:
				vals[want] = math.MaxUint32 // an int32 -1
			default:
				vals[want] = 1 << 31 // the most negative int32
			}
			shown = itoa(int(vals[want]))
			if int32(vals[want]) < 0 {
				shown += " (" + itoa(int(int32(vals[want]))) + " as int32)"
			}
			if uint64(vals[want]) < blocks {
				want = -1
			}
		}
		b := make([]byte, 4*n)
		for i, v := range vals {
			binary.LittleEndian.PutUint32(b[4*i:], v)
		}
		ids := make([]uint32, n)
		if err := DecodeBlockIDs(ids, b, 4, blocks, "remote"); err != nil {
			t.Fatalf("round %d: int32 ids refused as they are decoded: %v", round, err)
		}
		for i, v := range vals {
			if ids[i] != v {
				t.Fatalf("round %d: entry %d decoded as %d, sent %d", round, i, ids[i], v)
			}
		}
		err := OutsideIDs(ids, blocks, 4, "remote")
		if want < 0 {
			if err != nil {
				t.Fatalf("round %d: good ids of a layout of %d blocks named outside: %v", round, blocks, err)
			}
			continue
		}
		msg := "remote block id " + shown + " (entry " + itoa(want) + ") is outside the layout's " + itoa(int(blocks)) + " blocks"
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Fatalf("round %d: id %d at entry %d of a layout of %d blocks: got %v, want %q", round, vals[want], want, blocks, err, msg)
		}
	}
	if err := OutsideIDs(make([]uint32, 1), 0, 4, "local"); err == nil {
		t.Fatal("an int32 id of a layout of no blocks is not named outside it")
	}
}

func itoa(i int) string { return fmtID(uint64(i), 8) }

func BenchmarkDecodeBlockIDs(b *testing.B) {
	const n = 15360
	for _, shift := range []int{0, 3} {
		b.Run(map[int]string{0: "aligned", 3: "unaligned"}[shift], func(b *testing.B) {
			raw := make([]byte, 8*n+shift)[shift:]
			for i := range n {
				binary.LittleEndian.PutUint64(raw[8*i:], uint64(i*17%262144))
			}
			ids := make([]uint32, n)
			for b.Loop() {
				if err := DecodeBlockIDs(ids, raw, 8, 262144, "local"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("int32", func(b *testing.B) {
		raw := make([]byte, 4*n)
		for i := range n {
			binary.LittleEndian.PutUint32(raw[4*i:], uint32(i*17%262144))
		}
		ids := make([]uint32, n)
		for b.Loop() {
			if err := DecodeBlockIDs(ids, raw, 4, 262144, "local"); err != nil {
				b.Fatal(err)
			}
		}
	})
}
