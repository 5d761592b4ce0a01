// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// checkingHost is the host backend posing as one that checks block lists as it runs them (as the CUDA backend
// does on the GPU): it checks them on the host, through BlockList.Check, before it copies.
type checkingHost struct {
	*xgmi.HostBackend
	checked atomic.Int32
}

func (h *checkingHost) ChecksBlocksAtRun(_, _ *engines.MemoryDesc, _ uint64, _ int) bool { return true }

func (h *checkingHost) Copy(ctx context.Context, w engines.Work) error {
	if l := w.Plan.Blocks; l != nil && l.Unchecked {
		h.checked.Add(1)
		if err := l.Check(); err != nil {
			return err
		}
	}
	return h.HostBackend.Copy(ctx, w)
}

// TestBlockIDsCheckedAtRun: when every pair of a batch routes to an engine that checks ids as it runs them,
// planning leaves the ids unchecked (no pass over them) and bounds them by the smallest region of each side;
// the run then refuses out-of-range and repeated destination ids whole, moving nothing, and moves good lists.
// Without such an engine (the disjointness check on) the same ids are refused at planning.
func TestBlockIDsCheckedAtRun(t *testing.T) {
	const bs, blocks = 64, 32
	for _, defer_ := range []bool{true, false} {
		name := map[bool]string{true: "left to the engine", false: "checked at planning"}[defer_]
		t.Run(name, func(t *testing.T) {
			host := &checkingHost{HostBackend: xgmi.NewHostBackend()}
			x, err := xgmi.New(xgmi.Options{Node: "node-a", CheckDisjoint: !defer_}, host)
			if err != nil {
				t.Fatal(err)
			}
			c, err := engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			src, dst := blockBuffers(rng, 2, blocks, bs), blockBuffers(rng, 2, blocks, bs)
			dst[1] = dst[1][:(blocks-4)*bs] // the smaller destination bounds the ids
			var pairs []engines.BlockPair
			for k := range 2 {
				s, err := c.Register(context.Background(), hostDesc("node-a/s"+string(rune('0'+k)), "node-a", src[k]))
				if err != nil {
					t.Fatal(err)
				}
				d, err := c.Register(context.Background(), hostDesc("node-a/d"+string(rune('0'+k)), "node-a", dst[k]))
				if err != nil {
					t.Fatal(err)
				}
				pairs = append(pairs, engines.BlockPair{Src: s.ID, Dst: d.ID})
			}
			run := func(srcIDs, dstIDs []uint32) (*engines.PlanSet, error) {
				plan := c.NewPlan()
				if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: pairs, BlockBytes: bs, SrcIDs: srcIDs, DstIDs: dstIDs}); err != nil {
					return nil, err
				}
				ps := plan.Build()
				if len(ps.Rejected) > 0 {
					return ps, ps.Rejected[0].Err
				}
				return ps, runPlanSet(t, c, ps)
			}
			before := [][]byte{bytes.Clone(dst[0]), bytes.Clone(dst[1])}
			for _, bad := range []struct {
				name           string
				srcIDs, dstIDs []uint32
				want           error
			}{
				{"source id past the region", []uint32{1, blocks}, []uint32{2, 3}, engines.ErrOutOfBounds},
				{"destination id past the smaller region", []uint32{1, 2}, []uint32{2, blocks - 4}, engines.ErrOutOfBounds},
				{"negative id", []uint32{1, 0xffffffff}, []uint32{2, 3}, engines.ErrOutOfBounds},
				{"repeated destination", []uint32{1, 2, 3}, []uint32{5, 6, 5}, engines.ErrOverlap},
			} {
				ps, err := run(bad.srcIDs, bad.dstIDs)
				if !errors.Is(err, bad.want) {
					t.Errorf("%s: %v, want %v", bad.name, err, bad.want)
				}
				if defer_ && (ps == nil || len(ps.Rejected) > 0) {
					t.Errorf("%s: refused at planning, want at run", bad.name)
				}
				for k := range 2 {
					if !bytes.Equal(dst[k], before[k]) {
						t.Fatalf("%s: region %d changed although the list was refused", bad.name, k)
					}
				}
			}
			srcIDs, dstIDs := []uint32{0, 31, 7}, []uint32{27, 0, 9}
			ps, err := run(srcIDs, dstIDs)
			if err != nil {
				t.Fatalf("good list: %v", err)
			}
			l := ps.Plans[0].Blocks
			if l.Unchecked != defer_ {
				t.Fatalf("plan's list Unchecked = %v, want %v", l.Unchecked, defer_)
			}
			if defer_ && (l.SrcBlocks != blocks || l.DstBlocks != blocks-4) {
				t.Fatalf("list bounds %d/%d, want %d/%d (the smallest region of each side)", l.SrcBlocks, l.DstBlocks, blocks, blocks-4)
			}
			if got := host.checked.Load() > 0; got != defer_ {
				t.Fatalf("backend checked lists: %v, want %v", got, defer_)
			}
			for k := range 2 {
				want := bytes.Clone(before[k])
				for i := range srcIDs {
					copy(want[uint64(dstIDs[i])*bs:][:bs], src[k][uint64(srcIDs[i])*bs:][:bs])
				}
				if !bytes.Equal(dst[k], want) {
					t.Fatalf("region %d: destination differs from the blocks named", k)
				}
			}
		})
	}
}
