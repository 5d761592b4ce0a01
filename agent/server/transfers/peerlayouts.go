// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"context"
	"math/bits"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/engines"
)

// peerLayoutTTL is how long a peer's published layout, once resolved, is used without asking again: a block
// transfer of a few megabytes takes about as long as the question. A layout republished meanwhile with other
// regions fails the transfers that still name the old ones (the owner refuses memory it no longer holds); such
// a failure forgets the entry, and a waited transfer is then asked again of the layout published now.
const peerLayoutTTL = 2 * time.Second

// maxPeerLayouts bounds the cache of resolved peer layouts (one per node, namespace and name).
const maxPeerLayouts = 1024

// peerLayout is a published layout of another node, its regions imported into the engines.
type peerLayout struct {
	blockBytes, blocks uint64
	mems               []engines.MemoryID
	resolved           time.Time
}

// peerLayouts caches resolved peer layouts.
type peerLayouts struct {
	mu      sync.Mutex
	entries map[peerLayoutKey]*peerLayout
}

type peerLayoutKey struct{ node, asker, segment string }

// resolvePeerLayout returns the published layout segment of node for the caller, from the cache (cached) or
// asked of node and imported; it must not be called with the table's lock held (it talks to the peer).
func (s *Service) resolvePeerLayout(ctx context.Context, sess *regiontable.Session, node, segment string) (pl *peerLayout, cached bool, err error) {
	if err := regiontable.CheckSegmentRef(segment); err != nil {
		return nil, false, err
	}
	key := peerLayoutKey{node: node, asker: sess.Caller.Namespace, segment: segment}
	s.peerLayouts.mu.Lock()
	if pl, ok := s.peerLayouts.entries[key]; ok && time.Since(pl.resolved) < peerLayoutTTL {
		s.peerLayouts.mu.Unlock()
		return pl, true, nil
	}
	s.peerLayouts.mu.Unlock()
	if s.peers == nil {
		return nil, false, status.Errorf(codes.Unavailable, "layout segment %q is on node %s and this agent has no peer channel", segment, node)
	}
	ld, err := s.peers.ResolveLayout(ctx, node, segment, sess.Caller.Namespace)
	if err != nil {
		return nil, false, status.Errorf(peerCode(err), "resolving layout segment %q on node %s: %v", segment, node, err)
	}
	hi, length := bits.Mul64(ld.Blocks, ld.BlockBytes)
	if n := len(ld.Regions); n == 0 || n > regiontable.MaxLayoutRegions || ld.BlockBytes == 0 || ld.Blocks == 0 || ld.Blocks > 1<<32 || hi != 0 {
		return nil, false, status.Errorf(codes.FailedPrecondition, "node %s described layout segment %q as %d regions of %d blocks of %d bytes: not a layout", node, segment, n, ld.Blocks, ld.BlockBytes)
	}
	pl = &peerLayout{blockBytes: ld.BlockBytes, blocks: ld.Blocks, mems: make([]engines.MemoryID, len(ld.Regions)), resolved: time.Now()}
	for k, desc := range ld.Regions {
		sd, _, err := s.table.ParseDescriptor(desc)
		if err != nil {
			return nil, false, status.Errorf(codes.FailedPrecondition, "region %d of layout segment %q on node %s: %v", k, segment, node, err)
		}
		// A peer describes its own memory only, of the geometry it announced.
		if sd.Node != node || sd.Length != length {
			return nil, false, status.Errorf(codes.FailedPrecondition, "region %d of layout segment %q on node %s is %d bytes of node %q, not %d bytes of that node", k, segment, node, sd.Length, sd.Node, length)
		}
		if pl.mems[k], err = s.importDescriptor(ctx, desc); err != nil {
			return nil, false, err
		}
	}
	s.peerLayouts.mu.Lock()
	if s.peerLayouts.entries == nil || len(s.peerLayouts.entries) >= maxPeerLayouts {
		s.peerLayouts.entries = map[peerLayoutKey]*peerLayout{}
	}
	s.peerLayouts.entries[key] = pl
	s.peerLayouts.mu.Unlock()
	return pl, false, nil
}

// forgetPeerLayout drops a cached peer layout after a transfer over it failed, so the next one asks again.
func (s *Service) forgetPeerLayout(sess *regiontable.Session, node, segment string) {
	s.ForgetPeerLayout(node, segment, sess.Caller.Namespace)
}

// ForgetPeerLayout drops the kept answer of node's layout segment, asked for namespace asker: node said the
// layout is gone (peers' ForgetLayout), and the next transfer asks again.
func (s *Service) ForgetPeerLayout(node, segment, asker string) {
	s.peerLayouts.mu.Lock()
	delete(s.peerLayouts.entries, peerLayoutKey{node: node, asker: asker, segment: segment})
	s.peerLayouts.mu.Unlock()
}

// layoutGoneBound bounds how long telling the agents that resolved a layout that it is gone may hold the
// deregistration (their answers come in parallel); one that did not answer by then learns it when its kept
// answer expires (peerLayoutTTL).
const layoutGoneBound = time.Second

// TellLayoutGone tells every agent of askers that the published layout they resolved is gone, in parallel,
// within ctx and layoutGoneBound, and returns when they answered: their later transfers ask again instead of
// reaching memory the owner no longer publishes. Failures are logged, not returned: the layout is gone either
// way.
func (s *Service) TellLayoutGone(ctx context.Context, askers []regiontable.LayoutAsker) {
	if len(askers) == 0 || s.peers == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, layoutGoneBound)
	defer cancel()
	var wg sync.WaitGroup
	for _, a := range askers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.peers.ForgetLayout(ctx, a.Node, a.Segment, a.Namespace); err != nil {
				s.log.Info("telling a node that a layout it resolved is gone", "node", a.Node, "segment", a.Segment,
					"namespace", a.Namespace, "error", err)
			}
		}()
	}
	wg.Wait()
}
