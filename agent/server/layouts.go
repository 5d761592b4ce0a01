// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"cmp"
	"context"
	"errors"
	"math"
	"runtime/trace"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

const (
	// maxLayoutRegions bounds the regions of one layout (a 128-layer model's K and V tensors fit twice over).
	maxLayoutRegions = 4096
	// maxLayoutsPerCaller bounds the layouts one caller holds.
	maxLayoutsPerCaller = 1024
)

// layout is a caller's numbered-block view of regions of equal length: block i of the layout is
// [i*blockBytes, (i+1)*blockBytes) of every region. It names regions by id; a region deregistered since makes
// transfers over the layout fail with NotFound.
type layout struct {
	id         uint64
	owner      string
	session    uint64
	blockBytes uint64
	blocks     uint64
	regions    []uint64
	segment    string
	pub        publication
}

func (l *layout) proto() *agentv1.Layout {
	return &agentv1.Layout{Id: l.id, BlockBytes: l.blockBytes, Blocks: l.blocks, RegionIds: l.regions, SegmentName: l.segment}
}

// RegisterLayout implements agentv1.AgentServer.
func (s *Server) RegisterLayout(ctx context.Context, req *agentv1.RegisterLayoutRequest) (*agentv1.RegisterLayoutResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	switch n := len(req.RegionIds); {
	case n == 0:
		return nil, status.Error(codes.InvalidArgument, "a layout needs at least one region")
	case n > maxLayoutRegions:
		return nil, status.Errorf(codes.InvalidArgument, "a layout has at most %d regions, got %d", maxLayoutRegions, n)
	case req.BlockBytes == 0:
		return nil, status.Error(codes.InvalidArgument, "block_bytes must be positive")
	}
	if err := checkSegmentName(req.SegmentName); err != nil {
		return nil, err
	}
	if err := checkGrants(req.SegmentGrants); err != nil {
		return nil, err
	}
	pub := publication{namespace: sess.caller.Namespace, grants: slices.Clone(req.SegmentGrants)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess.ended {
		return nil, status.Error(codes.Unavailable, "the connection is closing")
	}
	var length uint64
	seen := make(map[uint64]bool, len(req.RegionIds))
	for k, id := range req.RegionIds {
		r, err := s.ownRegionLocked(sess, id)
		if err != nil {
			return nil, status.Errorf(codes.NotFound, "region %d of the layout: %s", k, status.Convert(err).Message())
		}
		if seen[id] {
			return nil, status.Errorf(codes.InvalidArgument, "region %d appears twice in the layout (entries must be distinct memory)", id)
		}
		seen[id] = true
		if k == 0 {
			length = r.length
		}
		if r.length != length {
			return nil, status.Errorf(codes.InvalidArgument, "region %d of the layout is %d bytes, region 0 is %d: a layout's regions have one length", k, r.length, length)
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
	for _, l := range s.layouts {
		if l.owner == sess.caller.Key {
			held++
		}
	}
	if held >= maxLayoutsPerCaller {
		s.metrics.LimitHit(refusals.LimitLayouts)
		return nil, status.Errorf(codes.ResourceExhausted, "caller holds %d layouts, the limit is %d", held, maxLayoutsPerCaller)
	}
	if req.SegmentName != "" {
		if _, taken := s.layoutSegments[scopedName(pub.namespace, req.SegmentName)]; taken {
			return nil, status.Errorf(codes.AlreadyExists, "layout segment %q is already registered in namespace %q on node %s", req.SegmentName, pub.namespace, s.opts.NodeName)
		}
	}
	s.nextLayout++
	l := &layout{id: s.regionEpoch | s.nextLayout, owner: sess.caller.Key, session: sess.id, blockBytes: req.BlockBytes,
		blocks: blocks, regions: append([]uint64(nil), req.RegionIds...), segment: req.SegmentName, pub: pub}
	s.layouts[l.id] = l
	if l.segment != "" {
		s.layoutSegments[scopedName(pub.namespace, l.segment)] = l
	}
	return &agentv1.RegisterLayoutResponse{Layout: l.proto()}, nil
}

// DeregisterLayout implements agentv1.AgentServer.
func (s *Server) DeregisterLayout(ctx context.Context, req *agentv1.DeregisterLayoutRequest) (*agentv1.DeregisterLayoutResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	l, err := s.ownLayoutLocked(sess, req.LayoutId)
	if err != nil {
		return nil, err
	}
	s.dropLayoutLocked(l)
	return &agentv1.DeregisterLayoutResponse{}, nil
}

func (s *Server) dropLayoutLocked(l *layout) {
	delete(s.layouts, l.id)
	if k := scopedName(l.pub.namespace, l.segment); l.segment != "" && s.layoutSegments[k] == l {
		delete(s.layoutSegments, k)
	}
}

func (s *Server) ownLayoutLocked(sess *session, id uint64) (*layout, error) {
	l, ok := s.layouts[id]
	if !ok || l.owner != sess.caller.Key {
		// Another caller's layout must look exactly like a missing one.
		return nil, status.Errorf(codes.NotFound, "layout %d is not registered by this caller", id)
	}
	return l, nil
}

// TransferBlocks implements agentv1.AgentServer.
func (s *Server) TransferBlocks(ctx context.Context, req *agentv1.TransferBlocksRequest) (*agentv1.TransferResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.transferBlocks(ctx, sess, req, nil)
}

// blockTag is the tag failures of a block transfer are reported under.
const blockTag = "blocks"

// transferBlocks serves TransferBlocks for the gRPC call and the fast socket alike. The ids are decoded and
// range-checked here, once; the engines check bounds and duplicate destinations as they plan. arena is the
// fast connection's id arena (nil elsewhere), read when the request says its ids are there.
func (s *Server) transferBlocks(ctx context.Context, sess *session, req *agentv1.TransferBlocksRequest, arena []byte) (*agentv1.TransferResponse, error) {
	timeout, err := checkSubmission(req.Op, req.Notify, req.Timeout)
	if err != nil {
		return nil, err
	}
	width := int(req.IdBytes)
	if width == 0 {
		width = 4
	}
	if width != 4 && width != 8 {
		return nil, status.Errorf(codes.InvalidArgument, "id_bytes must be 4 (int32) or 8 (int64), got %d", req.IdBytes)
	}
	if req.ArenaIds > 0 {
		if err := fastwire.IDsFromArena(req, arena, width); err != nil {
			return nil, err
		}
	}
	if len(req.LocalIds)%width != 0 || len(req.RemoteIds)%width != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "block ids are %d-byte integers: %d and %d bytes are not whole ids", width, len(req.LocalIds), len(req.RemoteIds))
	}
	n := len(req.LocalIds) / width
	if n != len(req.RemoteIds)/width {
		return nil, status.Errorf(codes.InvalidArgument, "%d local block ids and %d remote block ids: they pair one to one", n, len(req.RemoteIds)/width)
	}
	if n == 0 {
		return nil, status.Error(codes.InvalidArgument, "transfer names no blocks")
	}
	if max := s.opts.Limits.MaxItemsPerTransfer; n > max {
		s.metrics.LimitHit(refusals.LimitItems)
		return nil, status.Errorf(codes.InvalidArgument, "transfer names %d blocks, at most %d", n, max)
	}

	// A layout another node published is resolved (and its regions imported) before the lock: it may ask the peer.
	var peer *peerLayout
	if ref := req.Remote; ref != nil && ref.Node != "" && ref.Node != s.opts.NodeName {
		seg, ok := ref.Target.(*agentv1.LayoutRef_Segment)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "a layout id names a layout on this node; name node %q's layout by its segment", ref.Node)
		}
		// The transfer's timeout bounds the question to the peer too: a stalled peer fails it within its timeout.
		rctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, engines.DefaultTimeout))
		peer, err = s.resolvePeerLayout(rctx, sess, ref.Node, seg.Segment)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	local, err := s.ownLayoutLocked(sess, req.LayoutId)
	var remote side
	if err == nil {
		if peer != nil {
			remote = side{blockBytes: peer.blockBytes, blocks: peer.blocks, mems: peer.mems}
		} else {
			remote, err = s.remoteLayoutLocked(sess, req.Remote)
		}
	}
	var pairs []engines.BlockPair
	if err == nil {
		pairs, err = s.layoutPairsLocked(local, remote, req.Op == agentv1.Op_OP_WRITE)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}

	localIDs, remoteIDs, release := s.idBuffers(n)
	if err := fastwire.DecodeBlockIDs(localIDs, req.LocalIds, width, local.blocks, "local"); err != nil {
		release()
		return nil, err
	}
	if err := fastwire.DecodeBlockIDs(remoteIDs, req.RemoteIds, width, remote.blocks, "remote"); err != nil {
		release()
		return nil, err
	}
	b := engines.Blocks{Pairs: pairs, BlockBytes: local.blockBytes, SrcIDs: localIDs, DstIDs: remoteIDs}
	if req.Op == agentv1.Op_OP_READ {
		b.SrcIDs, b.DstIDs = remoteIDs, localIDs
	}
	trace.Log(ctx, "blocks", "decoded")
	plan := s.opts.Engine.NewPlan()
	adder, ok := plan.(engines.BlockAdder)
	if !ok {
		release()
		return nil, status.Error(codes.Unimplemented, "this agent's engine plans no block batches")
	}
	if err := adder.AddBlocks(b); err != nil {
		plan.Build()
		release()
		return nil, blockPlanError(n, len(pairs), err)
	}
	ps := plan.Build()
	if len(ps.Rejected) > 0 {
		release()
		return nil, blockPlanError(n, len(pairs), ps.Rejected[0].Err)
	}
	trace.Log(ctx, "blocks", "planned")
	resp, err := s.submit(ctx, sess, ps, []string{blockTag}, ps.Bytes(), n*len(pairs), timeout, req.Notify, req.Wait, release)
	if peer != nil && (err != nil || resp.Status != nil && resp.Status.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED) {
		// A transfer that failed over a cached peer layout asks the peer again next time.
		s.forgetPeerLayout(sess, req.Remote.Node, req.Remote.GetSegment())
	}
	return resp, err
}

// blockPlanError reports a refused block batch; ids out of range are the caller's argument, not a range of
// memory it named, so they are InvalidArgument like every other bad id.
func blockPlanError(n, pairs int, err error) error {
	code := statusCode(err)
	if errors.Is(err, engines.ErrOutOfBounds) {
		code = codes.InvalidArgument
	}
	return status.Errorf(code, "planning %d blocks of %d region pairs: %v", n, pairs, err)
}

// pinnedIDs is an engine that hands out block-id buffers its GPU kernels read in place (the composite, when a
// GPU backend is set up): ids decoded there are not copied again before the kernels check them.
type pinnedIDs interface {
	PinnedIDs(n int) ([]uint32, func())
}

// idBuffers returns the two id arrays of a block transfer of n ids and what gives them back once the transfer
// settled: the engine's pinned buffers when it has them, else arrays from the server's pool (reused: fresh
// pages for them cost more than the copy).
func (s *Server) idBuffers(n int) (local, remote []uint32, release func()) {
	if p, ok := s.opts.Engine.(pinnedIDs); ok {
		if l, freeL := p.PinnedIDs(n); l != nil {
			if r, freeR := p.PinnedIDs(n); r != nil {
				return l, r, func() { freeL(); freeR() }
			}
			freeL()
		}
	}
	local, remote = s.idBuffer(n), s.idBuffer(n)
	return local, remote, func() { s.ids.Put(&local); s.ids.Put(&remote) }
}

// idBuffer returns a block-id array of n entries from the server's pool.
func (s *Server) idBuffer(n int) []uint32 {
	if p, ok := s.ids.Get().(*[]uint32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]uint32, n, max(n, 1<<14))
}

// remoteLayoutLocked resolves the other side of a block transfer. Layouts of other nodes are not served yet.
// side is the remote side of a block transfer: a layout of this node or one another node published.
type side struct {
	blockBytes, blocks uint64
	mems               []engines.MemoryID
}

// sideLocked is l as the remote side of a transfer; its regions must still be registered by its owner.
func (s *Server) sideLocked(l *layout) (side, error) {
	out := side{blockBytes: l.blockBytes, blocks: l.blocks, mems: make([]engines.MemoryID, len(l.regions))}
	for k, id := range l.regions {
		r, ok := s.regions[id]
		if !ok || r.owner != l.owner {
			return side{}, status.Errorf(codes.NotFound, "region %d of layout %d is no longer registered", id, l.id)
		}
		out.mems[k] = r.mem
	}
	return out, nil
}

// remoteLayoutLocked resolves the remote side of a block transfer on this node.
func (s *Server) remoteLayoutLocked(sess *session, ref *agentv1.LayoutRef) (side, error) {
	if ref == nil {
		return side{}, status.Error(codes.InvalidArgument, "block transfer names no remote layout")
	}
	switch t := ref.Target.(type) {
	case *agentv1.LayoutRef_LayoutId:
		l, err := s.ownLayoutLocked(sess, t.LayoutId)
		if err != nil {
			return side{}, err
		}
		return s.sideLocked(l)
	case *agentv1.LayoutRef_Segment:
		if err := checkSegmentRef(t.Segment); err != nil {
			return side{}, err
		}
		l, ok := s.layoutSegments[resolveName(sess.caller.Namespace, t.Segment)]
		if !ok || !l.pub.admits(sess.caller.Namespace) {
			return side{}, status.Errorf(codes.NotFound, "no layout segment %q on node %s", t.Segment, s.opts.NodeName)
		}
		return s.sideLocked(l)
	}
	return side{}, status.Error(codes.InvalidArgument, "remote layout names no layout id or segment")
}

// layoutPairsLocked pairs region k of local with region k of remote, source first, after checking that the two
// layouts have one geometry (block size and region count; block counts may differ).
func (s *Server) layoutPairsLocked(local *layout, remote side, write bool) ([]engines.BlockPair, error) {
	if local.blockBytes != remote.blockBytes || len(local.regions) != len(remote.mems) {
		return nil, status.Errorf(codes.InvalidArgument, "layouts differ in geometry: %d regions of %d-byte blocks here, %d regions of %d-byte blocks there",
			len(local.regions), local.blockBytes, len(remote.mems), remote.blockBytes)
	}
	mine, err := s.sideLocked(local)
	if err != nil {
		return nil, err
	}
	pairs := make([]engines.BlockPair, len(local.regions))
	for k := range pairs {
		pairs[k] = engines.BlockPair{Src: mine.mems[k], Dst: remote.mems[k]}
		if !write {
			pairs[k] = engines.BlockPair{Src: remote.mems[k], Dst: mine.mems[k]}
		}
	}
	return pairs, nil
}
