// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// TestWideVectoredRequestsNegotiated: two agents that both offer fxt-sealed/2 carry scattered blocks in vectored
// requests of more than 1,024 parts; where either side is an agent of fxt-sealed/1 (which refuses more) or the
// data stays in TLS records, requests carry at most 1,024. Every block lands in each case.
func TestWideVectoredRequestsNegotiated(t *testing.T) {
	ca := newCA(t)
	const blocks, bs = 15360, 720
	for _, tc := range []struct {
		name             string
		narrowClient     bool
		narrowServer     bool
		tlsRecordsServer bool
		wantParts        int
		wantWideRequests bool
	}{
		{name: "both offer wide requests", wantParts: maxVecPartsWide, wantWideRequests: true},
		{name: "server of fxt-sealed/1", narrowServer: true, wantParts: maxVecParts},
		{name: "client of fxt-sealed/1", narrowClient: true, wantParts: maxVecParts},
		{name: "server without sealed records", tlsRecordsServer: true, wantParts: maxVecParts},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := stagedEngine(t, "node-b", true, nil, func(o *Options) {
				o.TLS, o.narrowSealed, o.tlsRecordsOnly = ca.config(t, "node-b"), tc.narrowServer, tc.tlsRecordsServer
			})
			// The writer's blocks are GPU memory (a fake stager): staged transfers cut their requests by the
			// peer's part count; host memory keeps 1,024 parts whatever the peer reads.
			sa := newFakeStager(t)
			a := stagedEngine(t, "node-a", false, sa, func(o *Options) { o.TLS, o.narrowSealed = ca.config(t, "node-a"), tc.narrowClient })
			dstBuf := make([]byte, blocks*bs)
			dst := register(t, b, "node-b/dst", dstBuf)
			src := pattern(blocks*bs, 9)
			local := registerGPU(t, a, sa, "node-a/src", src)
			imp(t, a, dst)
			r := rand.New(rand.NewPCG(3, 4))
			to := r.Perm(blocks)
			add := func(pb engines.PlanBuilder) error {
				for i, j := range to {
					if err := pb.Add(engines.Item{Src: local.ID, Dst: dst.ID, SrcOffset: uint64(i) * bs, DstOffset: uint64(j) * bs,
						Size: bs, Tag: engines.Tag(i + 1)}); err != nil {
						return err
					}
				}
				return nil
			}
			if err := moveWithin(a, 20*time.Second, add); err != nil {
				t.Fatalf("writing %d scattered blocks: %v", blocks, err)
			}
			view, unpin, err := b.Pin(dst.ID)
			if err != nil {
				t.Fatal(err)
			}
			for i, j := range to {
				if !bytes.Equal(view[j*bs:(j+1)*bs], src[i*bs:(i+1)*bs]) {
					unpin()
					t.Fatalf("block %d did not land at %d", i, j)
				}
			}
			unpin()

			var p *peer
			a.mu.Lock()
			for _, q := range a.peers {
				if q.node == "node-b" {
					p = q
				}
			}
			a.mu.Unlock()
			if p == nil || p.maxParts != tc.wantParts {
				t.Fatalf("the peer's vectored requests may carry up to %v parts, want %d", p, tc.wantParts)
			}
			pb := a.NewPlan()
			if err := add(pb); err != nil {
				t.Fatal(err)
			}
			ps := pb.Build()
			most := 0
			for _, c := range a.chunks(&ps.Plans[0], false, stagedChunkBytes(ps.Plans[0].Bytes, len(p.conns), ps.Plans[0].Blocks != nil), p.maxParts) {
				most = max(most, len(c.parts))
			}
			if most > tc.wantParts || (most > maxVecParts) != tc.wantWideRequests {
				t.Fatalf("the largest request carries %d parts; want at most %d, more than %d: %v", most, tc.wantParts, maxVecParts, tc.wantWideRequests)
			}
		})
	}
}

// TestVectoredRequestPartsBounded: a peer's part count beyond what this node offered is refused before anything
// is read or allocated for the parts.
func TestVectoredRequestPartsBounded(t *testing.T) {
	for _, tc := range []struct {
		n, bound uint32
		ok       bool
	}{{maxVecParts, maxVecParts, true}, {maxVecParts + 1, maxVecParts, false}, {maxVecPartsWide, maxVecPartsWide, true},
		{maxVecPartsWide + 1, maxVecPartsWide, false}, {0, maxVecPartsWide, false}, {1 << 31, maxVecPartsWide, false}} {
		var req bytes.Buffer
		req.Write([]byte{byte(tc.n >> 24), byte(tc.n >> 16), byte(tc.n >> 8), byte(tc.n)})
		for range min(tc.n, maxVecPartsWide+1) {
			req.Write([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}) // offset 0, one byte
		}
		_, err := readVec(&req, uint64(tc.n), tc.bound)
		if (err == nil) != tc.ok {
			t.Errorf("%d parts against a bound of %d: err %v, want accepted=%v", tc.n, tc.bound, err, tc.ok)
		}
	}
}
