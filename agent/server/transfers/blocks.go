// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"cmp"
	"context"
	"errors"
	"runtime/trace"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// blockTag is the tag failures of a block transfer are reported under.
const blockTag = "blocks"

// TransferBlocks serves TransferBlocks for the gRPC call and the fast socket alike. The ids are decoded here,
// once (int64 ids range-checked as they are narrowed); the engines check bounds and duplicate destinations as
// they plan, and a refusal of ids out of range names them as the caller sent them. arena is the
// fast connection's id arena (nil elsewhere), read when the request says its ids are there; early (nil on gRPC)
// answers a waited transfer as soon as its bytes landed.
func (s *Service) TransferBlocks(ctx context.Context, sess *regiontable.Session, req *agentv1.TransferBlocksRequest, arena []byte, early Replier) (*agentv1.TransferResponse, error) {
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
	if max := s.limits.MaxItemsPerTransfer; n > max {
		s.refusals.LimitHit(refusals.LimitItems)
		return nil, status.Errorf(codes.InvalidArgument, "transfer names %d blocks, at most %d", n, max)
	}

	// A layout another node published is resolved (and its regions imported) before the lock: it may ask the peer.
	start := time.Now()
	var peer *peerLayout
	cached := false
	ref := req.Remote
	if ref != nil && ref.Node != "" && ref.Node != s.node {
		seg, ok := ref.Target.(*agentv1.LayoutRef_Segment)
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "a layout id names a layout on this node; name node %q's layout by its segment", ref.Node)
		}
		// The transfer's timeout bounds the question to the peer too: a stalled peer fails it within its timeout.
		rctx, cancel := context.WithTimeout(ctx, cmp.Or(timeout, engines.DefaultTimeout))
		peer, cached, err = s.resolvePeerLayout(rctx, sess, ref.Node, seg.Segment)
		cancel()
		if err != nil {
			return nil, err
		}
		// The transfer's timeout counts from the call, the question included (as Transfer's does): counted from
		// after it, a slow answer let the transfer outlive its caller's deadline, which then ended the call first
		// ("still pending") instead of the transfer's own failure.
		if timeout = cmp.Or(timeout, engines.DefaultTimeout) - time.Since(start); timeout <= 0 {
			return nil, status.Errorf(codes.DeadlineExceeded, "the transfer's timeout ran out while node %s's layout %q was resolved", ref.Node, seg.Segment)
		}
	}
	resp, err := s.submitBlocks(ctx, sess, req, n, width, peer, timeout, early)
	if peer == nil || !blocksFailed(resp, err) {
		return resp, err
	}
	// A transfer that failed over a cached peer layout asks the peer again next time.
	s.forgetPeerLayout(sess, ref.Node, ref.GetSegment())
	if !cached || !req.Wait || !peerForgot(resp) {
		return resp, err
	}
	// The peer no longer holds the regions this node had cached for the name: the layout was published again
	// (its pod restarted, say). Nothing went to memory the peer does not hold, so the transfer is asked again
	// of the layout published now, once, within what is left of its timeout.
	left := cmp.Or(timeout, engines.DefaultTimeout) - time.Since(start)
	if left <= 0 {
		return resp, err
	}
	rctx, cancel := context.WithTimeout(ctx, left)
	peer, _, rerr := s.resolvePeerLayout(rctx, sess, ref.Node, ref.GetSegment())
	cancel()
	if rerr != nil {
		return resp, err
	}
	resp, err = s.submitBlocks(ctx, sess, req, n, width, peer, left, early)
	if blocksFailed(resp, err) {
		s.forgetPeerLayout(sess, ref.Node, ref.GetSegment())
	}
	return resp, err
}

// blocksFailed says whether a block transfer was refused or, waited for, did not succeed.
func blocksFailed(resp *agentv1.TransferResponse, err error) bool {
	return err != nil || resp.Status != nil && resp.Status.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED
}

// peerForgot says whether a waited transfer failed only because memory it named was unknown where it was
// served: what a peer answers for regions it deregistered.
func peerForgot(resp *agentv1.TransferResponse) bool {
	if resp == nil || resp.Status == nil || len(resp.Status.Failures) == 0 {
		return false
	}
	for _, f := range resp.Status.Failures {
		if f.Code != codes.NotFound.String() {
			return false
		}
	}
	return true
}

// submitBlocks plans and submits a block transfer whose ids were checked for shape: the local layout paired with
// the remote one (peer, when another node published it), the ids decoded against both.
func (s *Service) submitBlocks(ctx context.Context, sess *regiontable.Session, req *agentv1.TransferBlocksRequest, n, width int,
	peer *peerLayout, timeout time.Duration, early Replier) (*agentv1.TransferResponse, error) {
	s.table.Lock()
	local, err := s.table.OwnLayoutLocked(sess, req.LayoutId)
	var remote regiontable.Side
	if err == nil {
		if peer != nil {
			remote = regiontable.Side{BlockBytes: peer.blockBytes, Blocks: peer.blocks, Mems: peer.mems}
		} else {
			remote, err = s.table.RemoteLayoutLocked(sess, req.Remote)
		}
	}
	var pairs []engines.BlockPair
	if err == nil {
		pairs, err = s.table.LayoutPairsLocked(local, remote, req.Op == agentv1.Op_OP_WRITE)
	}
	s.table.Unlock()
	if err != nil {
		return nil, err
	}

	localIDs, remoteIDs, lease := s.idBuffers(n)
	if err := fastwire.DecodeBlockIDs(localIDs, req.LocalIds, width, local.Blocks(), "local"); err != nil {
		lease.release()
		return nil, err
	}
	if err := fastwire.DecodeBlockIDs(remoteIDs, req.RemoteIds, width, remote.Blocks, "remote"); err != nil {
		lease.release()
		return nil, err
	}
	b := engines.Blocks{Pairs: pairs, BlockBytes: local.BlockBytes(), SrcIDs: localIDs, DstIDs: remoteIDs}
	if req.Op == agentv1.Op_OP_READ {
		b.SrcIDs, b.DstIDs = remoteIDs, localIDs
	}
	trace.Log(ctx, "blocks", "decoded")
	plan := s.engine.NewPlan()
	adder, ok := plan.(engines.BlockAdder)
	if !ok {
		lease.release()
		return nil, status.Error(codes.Unimplemented, "this agent's engine plans no block batches")
	}
	if err := adder.AddBlocks(b); err != nil {
		plan.Build()
		err = blockPlanError(n, len(pairs), err, localIDs, remoteIDs, local.Blocks(), remote.Blocks, width)
		lease.release()
		return nil, err
	}
	ps := plan.Build()
	if len(ps.Rejected) > 0 {
		err := blockPlanError(n, len(pairs), ps.Rejected[0].Err, localIDs, remoteIDs, local.Blocks(), remote.Blocks, width)
		lease.release()
		return nil, err
	}
	trace.Log(ctx, "blocks", "planned")
	return s.submit(ctx, sess, ps, s.blockTags, ps.Bytes(), n*len(pairs), timeout, req.Notify, req.Wait, lease, early)
}

// blockPlanError reports a refused block batch. Ids out of range are the caller's argument, not a range of
// memory it named, so they are InvalidArgument like every other bad id, and named as the caller sent them (the
// side, the id, its entry, the layout's block count) when the decoded ids show one: int32 ids are not
// range-checked as they are decoded.
func blockPlanError(n, pairs int, err error, localIDs, remoteIDs []uint32, localBlocks, remoteBlocks uint64, width int) error {
	code := regiontable.StatusCode(err)
	if errors.Is(err, engines.ErrOutOfBounds) {
		if out := fastwire.OutsideIDs(localIDs, localBlocks, width, "local"); out != nil {
			return out
		}
		if out := fastwire.OutsideIDs(remoteIDs, remoteBlocks, width, "remote"); out != nil {
			return out
		}
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
func (s *Service) idBuffers(n int) (local, remote []uint32, lease idLease) {
	if p, ok := s.engine.(pinnedIDs); ok {
		if l, freeL := p.PinnedIDs(n); l != nil {
			if r, freeR := p.PinnedIDs(n); r != nil {
				return l, r, idLease{freeLocal: freeL, freeRemote: freeR}
			}
			freeL()
		}
	}
	lease = idLease{pool: &s.ids, local: s.idBuffer(n), remote: s.idBuffer(n)}
	return (*lease.local)[:n], (*lease.remote)[:n], lease
}

// idBuffer returns an array of at least n block ids from the server's pool.
func (s *Service) idBuffer(n int) *[]uint32 {
	if p, ok := s.ids.Get().(*[]uint32); ok && cap(*p) >= n {
		return p
	}
	p := make([]uint32, n, max(n, 1<<14))
	return &p
}

// idLease is the block-id arrays of one transfer, given back once it settled (or was refused): a value kept in
// the transfer, so a call allocates nothing to give them back.
type idLease struct {
	pool                  *sync.Pool // the server's arrays
	local, remote         *[]uint32
	freeLocal, freeRemote func() // or the engine's pinned buffers
}

// release gives the arrays back; the zero lease holds none.
func (l *idLease) release() {
	if l.pool != nil {
		l.pool.Put(l.local)
		l.pool.Put(l.remote)
	}
	if l.freeLocal != nil {
		l.freeLocal()
		l.freeRemote()
	}
	*l = idLease{}
}
