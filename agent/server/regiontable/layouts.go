// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontable

import (
	"context"
	"math"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

const (
	// MaxLayoutRegions bounds the regions of one layout (a 128-layer model's K and V tensors fit twice over).
	MaxLayoutRegions = 4096
	// maxLayoutsPerCaller bounds the layouts one caller holds.
	maxLayoutsPerCaller = 1024
)

// Layout is a caller's numbered-block view of regions of equal length: block i of the layout is
// [i*blockBytes, (i+1)*blockBytes) of every region. It names regions by id; a region deregistered since makes
// transfers over the layout fail with NotFound.
type Layout struct {
	id         uint64
	owner      string
	session    uint64
	blockBytes uint64
	blocks     uint64
	regions    []uint64
	mems       []engines.MemoryID // the regions' memory (a region's never changes), read only
	segment    string
	pub        publication
	// askers are the other nodes' agents that resolved the published layout, told when it goes (peers);
	// askersOf counts them by node.
	askers   map[LayoutAsker]struct{}
	askersOf map[string]int
}

// LayoutAsker is another node's agent that resolved a published layout: its node and the segment reference and
// namespace it asked with (what it keeps the answer under).
type LayoutAsker struct {
	Node, Segment, Namespace string
}

// maxLayoutAskers bounds the askers a published layout remembers (every node of a pool, a few namespaces and
// spellings of the name each), and maxLayoutAskersPerNode those of one node, so that a node asking under many
// namespaces and spellings cannot crowd the others out; past either the later ones are not told, and see the
// layout gone when they next ask (peerLayoutTTL).
const (
	maxLayoutAskers        = 4096
	maxLayoutAskersPerNode = 64
)

// Blocks is how many blocks each region of the layout holds.
func (l *Layout) Blocks() uint64 { return l.blocks }

// BlockBytes is the layout's block size.
func (l *Layout) BlockBytes() uint64 { return l.blockBytes }

func (l *Layout) proto() *agentv1.Layout {
	return &agentv1.Layout{Id: l.id, BlockBytes: l.blockBytes, Blocks: l.blocks, RegionIds: l.regions, SegmentName: l.segment}
}

// RegisterLayout serves the Agent API call of that name for the caller of sess.
func (tab *Table) RegisterLayout(ctx context.Context, sess *Session, req *agentv1.RegisterLayoutRequest) (*agentv1.RegisterLayoutResponse, error) {
	switch n := len(req.RegionIds); {
	case n == 0:
		return nil, status.Error(codes.InvalidArgument, "a layout needs at least one region")
	case n > MaxLayoutRegions:
		return nil, status.Errorf(codes.InvalidArgument, "a layout has at most %d regions, got %d", MaxLayoutRegions, n)
	case req.BlockBytes == 0:
		return nil, status.Error(codes.InvalidArgument, "block_bytes must be positive")
	}
	if err := CheckSegmentName(req.SegmentName); err != nil {
		return nil, err
	}
	if err := CheckGrants(req.SegmentGrants); err != nil {
		return nil, err
	}
	pub := publication{namespace: sess.Caller.Namespace, grants: slices.Clone(req.SegmentGrants)}
	tab.Lock()
	defer tab.Unlock()
	if sess.Ended {
		return nil, status.Error(codes.Unavailable, "the connection is closing")
	}
	var length uint64
	seen := make(map[uint64]bool, len(req.RegionIds))
	mems := make([]engines.MemoryID, len(req.RegionIds))
	for k, id := range req.RegionIds {
		r, err := tab.OwnRegionLocked(sess, id)
		if err != nil {
			return nil, status.Errorf(codes.NotFound, "region %d of the layout: %s", k, status.Convert(err).Message())
		}
		mems[k] = r.mem
		if seen[id] {
			return nil, status.Errorf(codes.InvalidArgument, "region %d appears twice in the layout (entries must be distinct memory)", id)
		}
		seen[id] = true
		if k == 0 {
			length = r.length
		}
		if r.length != length {
			return nil, status.Errorf(codes.InvalidArgument, "region %d of the layout is %d bytes, Region 0 is %d: a layout's regions have one length", k, r.length, length)
		}
	}
	if length%req.BlockBytes != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "regions of %d bytes are not a whole number of %d-byte blocks", length, req.BlockBytes)
	}
	blocks := length / req.BlockBytes
	if blocks > math.MaxUint32 {
		return nil, status.Errorf(codes.InvalidArgument, "%d blocks per region; block ids are 32-bit, use larger blocks", blocks)
	}
	held := 0
	for _, l := range tab.layouts {
		if l.owner == sess.Caller.Key {
			held++
		}
	}
	if held >= maxLayoutsPerCaller {
		tab.refusals.LimitHit(refusals.LimitLayouts)
		return nil, status.Errorf(codes.ResourceExhausted, "caller holds %d layouts, the limit is %d", held, maxLayoutsPerCaller)
	}
	if req.SegmentName != "" {
		if _, taken := tab.layoutSegments[scopedName(pub.namespace, req.SegmentName)]; taken {
			return nil, status.Errorf(codes.AlreadyExists, "layout segment %q is already registered in namespace %q on node %s", req.SegmentName, pub.namespace, tab.node)
		}
	}
	tab.nextLayout++
	l := &Layout{id: tab.epoch | tab.nextLayout, owner: sess.Caller.Key, session: sess.ID, blockBytes: req.BlockBytes,
		blocks: blocks, regions: append([]uint64(nil), req.RegionIds...), mems: mems, segment: req.SegmentName, pub: pub}
	tab.layouts[l.id] = l
	if l.segment != "" {
		tab.layoutSegments[scopedName(pub.namespace, l.segment)] = l
	}
	return &agentv1.RegisterLayoutResponse{Layout: l.proto()}, nil
}

// DeregisterLayout serves the Agent API call of that name for the caller of sess; it returns, beside the
// answer, the other nodes' agents that resolved the layout and must be told it is gone.
func (tab *Table) DeregisterLayout(ctx context.Context, sess *Session, req *agentv1.DeregisterLayoutRequest) (*agentv1.DeregisterLayoutResponse, []LayoutAsker, error) {
	tab.Lock()
	defer tab.Unlock()
	l, err := tab.OwnLayoutLocked(sess, req.LayoutId)
	if err != nil {
		return nil, nil, err
	}
	return &agentv1.DeregisterLayoutResponse{}, tab.dropLayoutLocked(l, nil), nil
}

// DropSessionLayoutsLocked drops the layouts sess registered (it ended: they name its regions, which go next)
// and returns the other nodes' agents to tell.
func (tab *Table) DropSessionLayoutsLocked(sess *Session) []LayoutAsker {
	var askers []LayoutAsker
	for _, l := range tab.layouts {
		if l.session == sess.ID {
			askers = tab.dropLayoutLocked(l, askers)
		}
	}
	return askers
}

// dropLayoutLocked forgets l and appends to askers the agents that resolved it while it was published.
func (tab *Table) dropLayoutLocked(l *Layout, askers []LayoutAsker) []LayoutAsker {
	delete(tab.layouts, l.id)
	if k := scopedName(l.pub.namespace, l.segment); l.segment != "" && tab.layoutSegments[k] == l {
		delete(tab.layoutSegments, k)
	}
	for a := range l.askers {
		askers = append(askers, a)
	}
	l.askers, l.askersOf = nil, nil
	return askers
}

// OwnLayoutLocked returns a layout the session's caller registered; another caller's looks like a missing one.
func (tab *Table) OwnLayoutLocked(sess *Session, id uint64) (*Layout, error) {
	l, ok := tab.layouts[id]
	if !ok || l.owner != sess.Caller.Key {
		// Another caller's layout must look exactly like a missing one.
		return nil, status.Errorf(codes.NotFound, "layout %d is not registered by this caller", id)
	}
	return l, nil
}

// Side is the remote side of a block transfer: a layout of this node or one another node published. Mems may
// be the layout's own list: read only.
type Side struct {
	BlockBytes, Blocks uint64
	Mems               []engines.MemoryID
}

// sideLocked is l as the remote side of a transfer; its regions must still be registered by its owner. Region
// ids are never reused, so a region still registered is the one the layout was made of, with the memory kept.
func (tab *Table) sideLocked(l *Layout) (Side, error) {
	for _, id := range l.regions {
		r, ok := tab.regions[id]
		if !ok || r.owner != l.owner {
			return Side{}, status.Errorf(codes.NotFound, "region %d of layout %d is no longer registered: deregister the layout, and register a new one over regions that are", id, l.id)
		}
	}
	return Side{BlockBytes: l.blockBytes, Blocks: l.blocks, Mems: l.mems}, nil
}

// RemoteLayoutLocked resolves the remote side of a block transfer on this node.
func (tab *Table) RemoteLayoutLocked(sess *Session, ref *agentv1.LayoutRef) (Side, error) {
	if ref == nil {
		return Side{}, status.Error(codes.InvalidArgument, "block transfer names no remote layout")
	}
	switch t := ref.Target.(type) {
	case *agentv1.LayoutRef_LayoutId:
		l, err := tab.OwnLayoutLocked(sess, t.LayoutId)
		if err != nil {
			return Side{}, err
		}
		return tab.sideLocked(l)
	case *agentv1.LayoutRef_Segment:
		if err := CheckSegmentRef(t.Segment); err != nil {
			return Side{}, err
		}
		l, ok := tab.layoutSegments[resolveName(sess.Caller.Namespace, t.Segment)]
		if !ok || !l.pub.admits(sess.Caller.Namespace) {
			return Side{}, status.Errorf(codes.NotFound, "no layout segment %q on node %s%s", t.Segment, tab.node,
				tab.notFoundHintLocked(t.Segment, sess.Caller.Namespace, true))
		}
		return tab.sideLocked(l)
	}
	return Side{}, status.Error(codes.InvalidArgument, "remote layout names no layout id or segment")
}

// LayoutPairsLocked pairs region k of local with region k of remote, source first, after checking that the two
// layouts have one geometry (block size and region count; block counts may differ).
func (tab *Table) LayoutPairsLocked(local *Layout, remote Side, write bool) ([]engines.BlockPair, error) {
	if local.blockBytes != remote.BlockBytes || len(local.regions) != len(remote.Mems) {
		return nil, status.Errorf(codes.InvalidArgument, "layouts differ in geometry: %d regions of %d-byte blocks here, %d regions of %d-byte blocks there",
			len(local.regions), local.blockBytes, len(remote.Mems), remote.BlockBytes)
	}
	mine, err := tab.sideLocked(local)
	if err != nil {
		return nil, err
	}
	pairs := make([]engines.BlockPair, len(local.regions))
	for k := range pairs {
		pairs[k] = engines.BlockPair{Src: mine.Mems[k], Dst: remote.Mems[k]}
		if !write {
			pairs[k] = engines.BlockPair{Src: remote.Mems[k], Dst: mine.Mems[k]}
		}
	}
	return pairs, nil
}

// LookupLayout answers a peer asking for a published layout (agent/peers): its geometry and every region's
// descriptor, when a pod of namespace asker may use it; one it may not use is missing. node, when not empty, is
// the asking agent's node, told when the layout goes (DeregisterLayout, DropSessionLayoutsLocked).
func (tab *Table) LookupLayout(segment, asker, node string) (*agentv1.LayoutDescriptor, error) {
	if err := checkLookup(segment, asker); err != nil {
		return nil, err
	}
	tab.Lock()
	defer tab.Unlock()
	l, ok := tab.layoutSegments[resolveName(asker, segment)]
	if !ok || !l.pub.admits(asker) {
		return nil, status.Errorf(codes.NotFound, "no layout segment %q on node %s%s", segment, tab.node, tab.notFoundHintLocked(segment, asker, true))
	}
	out := &agentv1.LayoutDescriptor{BlockBytes: l.blockBytes, Blocks: l.blocks, Regions: make([][]byte, len(l.regions))}
	for k, id := range l.regions {
		r, ok := tab.regions[id]
		if !ok || r.owner != l.owner || r.desc == nil {
			return nil, status.Errorf(codes.NotFound, "layout segment %q on node %s: its region %d is no longer registered", segment, tab.node, k)
		}
		out.Regions[k] = r.desc
	}
	l.rememberAsker(LayoutAsker{Node: node, Segment: segment, Namespace: asker})
	return out, nil
}

// rememberAsker keeps a, an agent of another node that resolved l, within maxLayoutAskers and
// maxLayoutAskersPerNode.
func (l *Layout) rememberAsker(a LayoutAsker) {
	if a.Node == "" || len(l.askers) >= maxLayoutAskers || l.askersOf[a.Node] >= maxLayoutAskersPerNode {
		return
	}
	if _, ok := l.askers[a]; ok {
		return
	}
	if l.askers == nil {
		l.askers, l.askersOf = map[LayoutAsker]struct{}{}, map[string]int{}
	}
	l.askers[a] = struct{}{}
	l.askersOf[a.Node]++
}
