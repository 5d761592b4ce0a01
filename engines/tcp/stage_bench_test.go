// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// BenchmarkStagedBlocks writes 15,360 scattered blocks of 720 B of staged (GPU) memory to another node's staged
// memory, beside one contiguous write of the same bytes (the ceiling of the same run): the gap between the two
// is what gathering into slots, vectored requests and scattering cost per block. Over plain TCP, and over
// sealed records with requests of up to 1,024 parts (fxt-sealed/1) and of up to 8,192 (fxt-sealed/2).
func BenchmarkStagedBlocks(b *testing.B) {
	ca := newCA(b)
	for _, wire := range []struct {
		name   string
		tls    bool
		narrow bool
	}{{"plain", false, false}, {"sealed-1024", true, true}, {"sealed-8192", true, false}} {
		mod := func(node string) func(*Options) {
			return func(o *Options) {
				if wire.tls {
					o.TLS, o.narrowSealed = ca.config(b, node), wire.narrow
				}
			}
		}
		sa, sb := newFakeStager(b), newFakeStager(b)
		a := stagedEngine(b, "node-a", false, sa, mod("node-a"))
		peer := stagedEngine(b, "node-b", true, sb, mod("node-b"))
		const bs, blocks, n = 720, 1 << 18, 15360
		src := registerGPU(b, a, sa, "a/src", seq(bs*blocks, 1))
		dst := registerGPU(b, peer, sb, "b/dst", make([]byte, bs*blocks))
		imp(b, a, dst)
		r := rand.New(rand.NewPCG(5, 6))
		srcIDs, dstIDs := make([]uint32, n), make([]uint32, n)
		sp, dp := r.Perm(blocks), r.Perm(blocks)
		for i := range n {
			srcIDs[i], dstIDs[i] = uint32(sp[i]), uint32(dp[i])
		}
		run := func(b *testing.B, plan func(engines.PlanBuilder) error) {
			b.SetBytes(n * bs)
			for b.Loop() {
				if err := moveWithin(a, 30*time.Second, plan); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(wire.name+"/contiguous", func(b *testing.B) {
			run(b, func(pb engines.PlanBuilder) error {
				return pb.Add(engines.Item{Src: src.ID, Dst: dst.ID, Size: n * bs})
			})
		})
		b.Run(wire.name+"/blocks", func(b *testing.B) {
			run(b, func(pb engines.PlanBuilder) error {
				return pb.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{{Src: src.ID, Dst: dst.ID}},
					BlockBytes: bs, SrcIDs: srcIDs, DstIDs: dstIDs})
			})
		})
	}
}
