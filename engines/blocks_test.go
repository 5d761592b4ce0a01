// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// blockBuffers fills n buffers of blocks*bs bytes with distinct random bytes.
func blockBuffers(rng *rand.Rand, n, blocks int, bs uint64) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = make([]byte, uint64(blocks)*bs)
		for j := range out[i] {
			out[i][j] = byte(rng.Uint32())
		}
	}
	return out
}

func runPlanSet(t *testing.T, c *engines.Composite, ps *engines.PlanSet) error {
	t.Helper()
	tr, err := c.Submit(context.Background(), ps, engines.SubmitOptions{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return tr.Wait(context.Background())
}

// TestBlockBatches moves a block list between two layouts of two regions each, on this node (host block form)
// and towards another node (tcp block form too), and checks every byte of every block, moved or not.
func TestBlockBatches(t *testing.T) {
	const bs, blocks = 720, 64
	for _, remote := range []bool{false, true} {
		name := map[bool]string{false: "same node", true: "to another node"}[remote]
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			rng := rand.New(rand.NewPCG(7, 8))
			src, dst := blockBuffers(rng, 2, blocks, bs), blockBuffers(rng, 2, blocks, bs)
			before := [][]byte{bytes.Clone(dst[0]), bytes.Clone(dst[1])}
			var pairs []engines.BlockPair
			for k := range 2 {
				s := c.localRegion(t, src[k])
				var d engines.MemoryDesc
				if remote {
					d = c.remoteRegion(t, dst[k])
				} else {
					d = c.localRegion(t, dst[k])
				}
				pairs = append(pairs, engines.BlockPair{Src: s.ID, Dst: d.ID})
			}
			srcIDs, dstIDs := []uint32{5, 0, 63, 7, 8}, []uint32{1, 62, 2, 9, 10}
			plan := c.a.NewPlan()
			if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: pairs, BlockBytes: bs, SrcIDs: srcIDs, DstIDs: dstIDs, Tag: 3}); err != nil {
				t.Fatalf("AddBlocks: %v", err)
			}
			ps := plan.Build()
			if len(ps.Rejected) > 0 || len(ps.Plans) == 0 {
				t.Fatalf("planned %d plans, rejected %v", len(ps.Plans), ps.Rejected)
			}
			if !remote && (len(ps.Plans) != 2 || ps.Plans[0].Blocks == nil || ps.Plans[0].Engine != engines.EngineXGMI) {
				t.Fatalf("same-node pairs should be two xgmi plans in block form, got %d plans (blocks %v)", len(ps.Plans), ps.Plans[0].Blocks != nil)
			}
			if remote && (len(ps.Plans) != 2 || ps.Plans[0].Blocks == nil || ps.Plans[0].Engine != engines.EngineTCP) {
				t.Fatalf("pairs towards another node should be two tcp plans in block form, got %d plans (blocks %v)", len(ps.Plans), ps.Plans[0].Blocks != nil)
			}
			if got := ps.Bytes(); got != uint64(2*len(srcIDs)*bs) {
				t.Fatalf("planned %d bytes, want %d", got, 2*len(srcIDs)*bs)
			}
			if err := runPlanSet(t, c.a, ps); err != nil {
				t.Fatalf("transfer: %v", err)
			}
			for k := range 2 {
				want := bytes.Clone(before[k])
				for i := range srcIDs {
					copy(want[uint64(dstIDs[i])*bs:][:bs], src[k][uint64(srcIDs[i])*bs:][:bs])
				}
				if remote {
					// node-b's memory is written by its serving goroutines; pin to order with them.
					_, unpin, err := c.b.Pin(pairs[k].Dst)
					if err != nil {
						t.Fatal(err)
					}
					unpin()
				}
				if !bytes.Equal(dst[k], want) {
					t.Fatalf("region %d: destination differs from the blocks named (moved or untouched)", k)
				}
			}
		})
	}
}

// TestBlockBatchRefusals: every malformed batch is refused whole at planning and moves nothing.
func TestBlockBatchRefusals(t *testing.T) {
	const bs, blocks = 64, 16
	c := newCluster(t)
	rng := rand.New(rand.NewPCG(9, 10))
	bufs := blockBuffers(rng, 4, blocks, bs)
	short := c.localRegion(t, make([]byte, 8*bs))
	r := make([]engines.MemoryDesc, 4)
	for i := range r {
		r[i] = c.localRegion(t, bufs[i])
	}
	p0 := engines.BlockPair{Src: r[0].ID, Dst: r[1].ID}
	p1 := engines.BlockPair{Src: r[2].ID, Dst: r[3].ID}
	for name, tc := range map[string]struct {
		b    engines.Blocks
		want error
	}{
		"unequal counts":         {engines.Blocks{Pairs: []engines.BlockPair{p0}, BlockBytes: bs, SrcIDs: []uint32{1, 2}, DstIDs: []uint32{1}}, engines.ErrInvalid},
		"block size zero":        {engines.Blocks{Pairs: []engines.BlockPair{p0}, SrcIDs: []uint32{1}, DstIDs: []uint32{1}}, engines.ErrInvalid},
		"source id out of range": {engines.Blocks{Pairs: []engines.BlockPair{p0}, BlockBytes: bs, SrcIDs: []uint32{16}, DstIDs: []uint32{1}}, engines.ErrOutOfBounds},
		"destination too short":  {engines.Blocks{Pairs: []engines.BlockPair{p0, {Src: r[2].ID, Dst: short.ID}}, BlockBytes: bs, SrcIDs: []uint32{9}, DstIDs: []uint32{9}}, engines.ErrOutOfBounds},
		"duplicate destination":  {engines.Blocks{Pairs: []engines.BlockPair{p0, p1}, BlockBytes: bs, SrcIDs: []uint32{1, 2}, DstIDs: []uint32{4, 4}}, engines.ErrOverlap},
		"one region twice":       {engines.Blocks{Pairs: []engines.BlockPair{p0, {Src: r[2].ID, Dst: r[1].ID}}, BlockBytes: bs, SrcIDs: []uint32{1}, DstIDs: []uint32{2}}, engines.ErrOverlap},
		"huge id overflows":      {engines.Blocks{Pairs: []engines.BlockPair{p0}, BlockBytes: 1 << 40, SrcIDs: []uint32{1 << 31}, DstIDs: []uint32{0}}, engines.ErrOutOfBounds},
		"unknown region":         {engines.Blocks{Pairs: []engines.BlockPair{{Src: "node-a/nope", Dst: r[1].ID}}, BlockBytes: bs, SrcIDs: []uint32{1}, DstIDs: []uint32{1}}, engines.ErrUnknownMemory},
	} {
		t.Run(name, func(t *testing.T) {
			plan := c.a.NewPlan()
			_ = plan.(engines.BlockAdder).AddBlocks(tc.b)
			ps := plan.Build()
			if len(ps.Rejected) == 0 || !errors.Is(ps.Rejected[0].Err, tc.want) {
				t.Fatalf("want a rejection with %v, got %v", tc.want, ps.Rejected)
			}
			if len(ps.Plans) != 0 {
				t.Fatalf("a refused batch still planned %d plans", len(ps.Plans))
			}
		})
	}
	for i := range bufs {
		if !bytes.Equal(bufs[i], blockBuffers(rand.New(rand.NewPCG(9, 10)), 4, blocks, bs)[i]) {
			t.Fatalf("region %d changed although every batch was refused", i)
		}
	}
	t.Run("items and blocks do not mix", func(t *testing.T) {
		plan := c.a.NewPlan()
		if err := plan.Add(engines.Item{Src: r[0].ID, Dst: r[1].ID, Size: 8}); err != nil {
			t.Fatal(err)
		}
		if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{p1}, BlockBytes: bs, SrcIDs: []uint32{1}, DstIDs: []uint32{1}}); !errors.Is(err, engines.ErrInvalid) {
			t.Fatalf("blocks after an item: want ErrInvalid, got %v", err)
		}
	})
}

// BenchmarkPlanBlocks plans one batch between two regions of 2^18 blocks of 720 B: 15,360 ids (a long prefill's
// blocks), and 16 and 1 ids (a decode step's, or one contiguous block), whose planning should not grow with the pool.
func BenchmarkPlanBlocks(b *testing.B) {
	c := newCluster(&testing.T{})
	rng := rand.New(rand.NewPCG(1, 1))
	const bs, pool = 720, 1 << 18
	s := c.localRegion(b, make([]byte, bs*pool))
	d := c.localRegion(b, make([]byte, bs*pool))
	for _, n := range []int{15360, 16, 1} {
		ids := func() []uint32 {
			out := make([]uint32, n)
			for i, v := range rng.Perm(pool)[:n] {
				out[i] = uint32(v)
			}
			return out
		}
		srcIDs, dstIDs := ids(), ids()
		dstIDs[0] = pool - 1 // the bitmap of the duplicate check spans the pool
		b.Run(fmt.Sprintf("%d ids", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				plan := c.a.NewPlan()
				if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{{Src: s.ID, Dst: d.ID}}, BlockBytes: bs, SrcIDs: srcIDs, DstIDs: dstIDs}); err != nil {
					b.Fatal(err)
				}
				if ps := plan.Build(); len(ps.Plans) != 1 {
					b.Fatal(ps.Rejected)
				}
			}
		})
	}
}
