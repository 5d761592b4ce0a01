// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// fakeBlockRegion also copies blocks by index (StagedBlocks), refusing blocks past the region as the CUDA stager
// does; the copies count as ToHost/FromHost calls.
type fakeBlockRegion struct{ *fakeRegion }

func (r fakeBlockRegion) BlocksToHost(buf []byte, bs uint64, ids []uint32) (StageWait, error) {
	segs, err := r.blockSegs(buf, bs, ids, true)
	if err != nil {
		return nil, err
	}
	return r.ToHost(buf, segs)
}

func (r fakeBlockRegion) BlocksFromHost(buf []byte, bs uint64, ids []uint32) (StageWait, error) {
	segs, err := r.blockSegs(buf, bs, ids, false)
	if err != nil {
		return nil, err
	}
	return r.FromHost(buf, segs)
}

func (r fakeBlockRegion) blockSegs(buf []byte, bs uint64, ids []uint32, toHost bool) ([]engines.Segment, error) {
	r.s.blockCalls.Add(1)
	if bs == 0 || len(ids) == 0 || uint64(len(ids))*bs > uint64(len(buf)) {
		return nil, fmt.Errorf("%w: %d blocks of %d bytes for a buffer of %d", engines.ErrInvalid, len(ids), bs, len(buf))
	}
	segs := make([]engines.Segment, len(ids))
	for k, id := range ids {
		if uint64(id) >= uint64(len(r.mem))/bs {
			return nil, fmt.Errorf("%w: block %d of %d bytes past the region (%d bytes)", engines.ErrOutOfBounds, id, bs, len(r.mem))
		}
		segs[k] = engines.Segment{SrcOffset: uint64(id) * bs, DstOffset: uint64(k) * bs, Size: bs}
		if !toHost {
			segs[k].SrcOffset, segs[k].DstOffset = segs[k].DstOffset, segs[k].SrcOffset
		}
	}
	return segs, nil
}

// TestStagedBlockBatch writes a block list between two nodes' GPU memory (two region pairs) and reads it back,
// with stagers that copy blocks by index and with stagers that take segments only: every byte lands, each staged
// chunk is one copy on each side, and the block form is used for every chunk exactly when both stagers offer it.
func TestStagedBlockBatch(t *testing.T) {
	for _, form := range []struct {
		name         string
		segmentsOnly bool
	}{{"by-index", false}, {"segments", true}} {
		t.Run(form.name, func(t *testing.T) {
			sa, sb := newFakeStager(t), newFakeStager(t)
			sa.segmentsOnly, sb.segmentsOnly = form.segmentsOnly, form.segmentsOnly
			a := stagedEngine(t, "node-a", false, sa, nil)
			b := stagedEngine(t, "node-b", true, sb, nil)
			const bs, blocks, n = 720, 8192, 3000
			var pairs, back []engines.BlockPair
			var srcMem, dstMem, want, readMem [][]byte
			for k := range 2 {
				s, d := seq(bs*blocks, uint64(40+k)), seq(bs*blocks, uint64(50+k))
				srcMem, dstMem, want = append(srcMem, s), append(dstMem, d), append(want, bytes.Clone(d))
				sd := registerGPU(t, a, sa, fmt.Sprintf("a/%d", k), s)
				dd := registerGPU(t, b, sb, fmt.Sprintf("b/%d", k), d)
				imp(t, a, dd)
				pairs = append(pairs, engines.BlockPair{Src: sd.ID, Dst: dd.ID})
				readMem = append(readMem, make([]byte, bs*blocks))
				rd := registerGPU(t, a, sa, fmt.Sprintf("a/read-%d", k), readMem[k])
				back = append(back, engines.BlockPair{Src: dd.ID, Dst: rd.ID})
			}
			r := rand.New(rand.NewPCG(3, 4))
			sp, dp := r.Perm(blocks), r.Perm(blocks)
			srcIDs, dstIDs := make([]uint32, n), make([]uint32, n)
			for i := range n {
				srcIDs[i], dstIDs[i] = uint32(sp[i]), uint32(dp[i])
				for k := range 2 {
					copy(want[k][dstIDs[i]*bs:][:bs], srcMem[k][srcIDs[i]*bs:][:bs])
				}
			}
			move := func(pairs []engines.BlockPair, src, dst []uint32) {
				t.Helper()
				add := func(pb engines.PlanBuilder) error {
					return pb.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: pairs, BlockBytes: bs, SrcIDs: src, DstIDs: dst, Tag: 1})
				}
				probe := a.NewPlan()
				if err := add(probe); err != nil {
					t.Fatal(err)
				}
				if ps := probe.Build(); len(ps.Plans) != 2 || ps.Plans[0].Blocks == nil {
					t.Fatalf("%d plans (block form %v), want 2 in block form", len(ps.Plans), len(ps.Plans) > 0 && ps.Plans[0].Blocks != nil)
				}
				if err := moveWithin(a, 20*time.Second, add); err != nil {
					t.Fatal(err)
				}
			}
			move(pairs, srcIDs, dstIDs)
			for k := range 2 {
				_, unpin, err := b.reg.Pin(pairs[k].Dst)
				if err != nil {
					t.Fatal(err)
				}
				same := bytes.Equal(dstMem[k], want[k])
				unpin()
				if !same {
					t.Fatalf("region pair %d: destination differs", k)
				}
			}
			per := wantStagedChunks(n, bs, true)
			if got := sa.toHost.Load(); got != 2*per {
				t.Fatalf("%d gathers for 2 x %d blocks, want %d (one per chunk)", got, n, 2*per)
			}
			if got := sb.fromHost.Load(); got != 2*per {
				t.Fatalf("%d scatters for 2 x %d blocks, want %d", got, n, 2*per)
			}
			// Read the written blocks back into fresh regions of node-a, in the same order.
			move(back, dstIDs, srcIDs)
			for k := range 2 {
				for i := range n {
					got, exp := readMem[k][srcIDs[i]*bs:][:bs], srcMem[k][srcIDs[i]*bs:][:bs]
					if !bytes.Equal(got, exp) {
						t.Fatalf("region pair %d, block %d read back differs", k, srcIDs[i])
					}
				}
			}
			if got := sb.toHost.Load(); got != 2*per {
				t.Fatalf("%d gathers serving 2 x %d blocks read, want %d", got, n, 2*per)
			}
			if got := sa.fromHost.Load(); got != 2*per {
				t.Fatalf("%d scatters of 2 x %d blocks read, want %d", got, n, 2*per)
			}
			wantBlocks := int32(4 * per)
			if form.segmentsOnly {
				wantBlocks = 0
			}
			if ga, gb := sa.blockCalls.Load(), sb.blockCalls.Load(); ga != wantBlocks || gb != wantBlocks {
				t.Fatalf("copies by block index: node-a %d, node-b %d, want %d each", ga, gb, wantBlocks)
			}
		})
	}
}
