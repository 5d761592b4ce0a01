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

// peerLayoutRefresh is the age past which a kept answer, still used, is asked again in the background (one
// question at a time per layout, bounded by what is left of peerLayoutTTL): a steady stream of transfers to a
// peer's layout then never waits for the question, which it otherwise paid every peerLayoutTTL.
const peerLayoutRefresh = peerLayoutTTL / 2

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
	mu         sync.Mutex
	entries    map[peerLayoutKey]*peerLayout
	refreshing map[peerLayoutKey]bool
}

type peerLayoutKey struct{ node, asker, segment string }

// lookup returns key's kept answer while it is usable at now, and whether the caller is to ask again in the
// background (refresh, then refreshed): it is past peerLayoutRefresh and no question for it is under way.
func (c *peerLayouts) lookup(key peerLayoutKey, now time.Time) (pl *peerLayout, refresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pl, ok := c.entries[key]
	if !ok || now.Sub(pl.resolved) >= peerLayoutTTL {
		return nil, false
	}
	if now.Sub(pl.resolved) < peerLayoutRefresh || c.refreshing[key] {
		return pl, false
	}
	if c.refreshing == nil {
		c.refreshing = map[peerLayoutKey]bool{}
	}
	c.refreshing[key] = true
	return pl, true
}

// store keeps pl as key's answer (the cache starts over when full).
func (c *peerLayouts) store(key peerLayoutKey, pl *peerLayout) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) >= maxPeerLayouts {
		c.entries = map[peerLayoutKey]*peerLayout{}
	}
	c.entries[key] = pl
}

// refreshed ends the background question about key, asked while old was its answer: the new answer replaces old;
// a refusal by the owner (the layout is gone, or not the caller's to use) drops old; an owner that could not be
// asked leaves old until it expires. An answer forgotten meanwhile (the owner said the layout went, or a
// transfer over it failed) is not brought back: the question may have left before that.
func (c *peerLayouts) refreshed(key peerLayoutKey, old, pl *peerLayout, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.refreshing, key)
	if c.entries[key] != old {
		return
	}
	switch {
	case err == nil:
		c.entries[key] = pl
	case ownerRefused(err):
		delete(c.entries, key)
	}
}

// ownerRefused says whether a failed question was answered by the layout's owner (not a peer channel that failed).
func ownerRefused(err error) bool {
	switch status.Code(err) {
	case codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition, codes.InvalidArgument:
		return true
	}
	return false
}

// resolvePeerLayout returns the published layout segment of node for the caller, from the cache (cached) or
// asked of node and imported; it must not be called with the table's lock held (it talks to the peer).
func (s *Service) resolvePeerLayout(ctx context.Context, sess *regiontable.Session, node, segment string) (pl *peerLayout, cached bool, err error) {
	if err := regiontable.CheckSegmentRef(segment); err != nil {
		return nil, false, err
	}
	key := peerLayoutKey{node: node, asker: sess.Caller.Namespace, segment: segment}
	if pl, refresh := s.peerLayouts.lookup(key, time.Now()); pl != nil {
		if refresh {
			go s.refreshPeerLayout(key, pl)
		}
		return pl, true, nil
	}
	if pl, err = s.askPeerLayout(ctx, key); err != nil {
		return nil, false, err
	}
	s.peerLayouts.store(key, pl)
	return pl, false, nil
}

// refreshPeerLayout asks key's layout again while old, its kept answer, is still used, within what is left of
// old's time to live and no longer than the agent runs.
func (s *Service) refreshPeerLayout(key peerLayoutKey, old *peerLayout) {
	ctx, cancel := context.WithDeadline(context.Background(), old.resolved.Add(peerLayoutTTL))
	defer cancel()
	if s.stopping != nil {
		go func() {
			select {
			case <-s.stopping:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	pl, err := s.askPeerLayout(ctx, key)
	s.peerLayouts.refreshed(key, old, pl, err)
}

// askPeerLayout asks key's node for its published layout for key's namespace, checks what it describes and
// imports its regions.
func (s *Service) askPeerLayout(ctx context.Context, key peerLayoutKey) (*peerLayout, error) {
	node, segment := key.node, key.segment
	if s.peers == nil {
		return nil, status.Errorf(codes.Unavailable, "layout segment %q is on node %s and this agent has no peer channel", segment, node)
	}
	ld, err := s.peers.ResolveLayout(ctx, node, segment, key.asker)
	if err != nil {
		return nil, status.Errorf(peerCode(err), "resolving layout segment %q on node %s: %s", segment, node, peerMessage(err))
	}
	hi, length := bits.Mul64(ld.Blocks, ld.BlockBytes)
	if n := len(ld.Regions); n == 0 || n > regiontable.MaxLayoutRegions || ld.BlockBytes == 0 || ld.Blocks == 0 || ld.Blocks > 1<<32 || hi != 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s described layout segment %q as %d regions of %d blocks of %d bytes: not a layout", node, segment, n, ld.Blocks, ld.BlockBytes)
	}
	pl := &peerLayout{blockBytes: ld.BlockBytes, blocks: ld.Blocks, mems: make([]engines.MemoryID, len(ld.Regions)), resolved: time.Now()}
	for k, desc := range ld.Regions {
		sd, _, err := s.table.ParseDescriptor(desc)
		if err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "region %d of layout segment %q on node %s: %v", k, segment, node, err)
		}
		// A peer describes its own memory only, of the geometry it announced.
		if sd.Node != node || sd.Length != length {
			return nil, status.Errorf(codes.FailedPrecondition, "region %d of layout segment %q on node %s is %d bytes of node %q, not %d bytes of that node", k, segment, node, sd.Length, sd.Node, length)
		}
		if pl.mems[k], err = s.importDescriptor(ctx, desc, false); err != nil {
			return nil, err
		}
	}
	return pl, nil
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
