// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// maxImports bounds how many other nodes' regions stay imported into the engines.
const maxImports = 4096

type imported struct {
	mem      engines.MemoryID
	lastUsed time.Time
	// sum is the hash of the descriptor it was imported from, whole (its node confirmed it, or sent it): the
	// cache is shared by every caller and keyed by the id the descriptor names, so a later descriptor of that id
	// with other bytes (other handles, where a forger would like everyone's transfers to go, or another key) must
	// neither take the import nor use it.
	sum [sha256.Size]byte
}

// importedLocked reports whether md's memory is imported, with its id, and marks it used; a descriptor of it with
// other bytes (sum) than it was imported from is refused.
func (s *Service) importedLocked(md engines.MemoryDesc, sum [sha256.Size]byte) (engines.MemoryID, bool, error) {
	im, ok := s.imports[md.ID]
	if !ok {
		return "", false, nil
	}
	if im.sum != sum {
		return "", true, status.Errorf(codes.FailedPrecondition, "memory %s of node %s is imported here from another descriptor of it: use the descriptor its node issued (Region.desc, or ResolveSegment)", md.ID, md.Node)
	}
	im.lastUsed = time.Now()
	return md.ID, true, nil
}

// importDescriptor makes the memory a descriptor names known to the engines and returns its id. A descriptor
// of this node's memory resolves to the local region (its key must match). fromCaller says b came from the
// caller (RemoteRef.desc) rather than from its node through the peer channel: such a descriptor of memory not
// imported yet is imported only once its node confirms it (confirmIssued).
func (s *Service) importDescriptor(ctx context.Context, b []byte, fromCaller bool) (engines.MemoryID, error) {
	sd, md, err := s.table.ParseDescriptor(b)
	if err != nil {
		return "", err
	}
	s.table.Lock()
	if sd.Node == s.node {
		defer s.table.Unlock()
		r, err := s.table.LocalByDescriptorLocked(sd)
		if err != nil {
			return "", err
		}
		return r.Mem(), nil
	}
	sum := sha256.Sum256(b)
	id, known, err := s.importedLocked(md, sum)
	s.table.Unlock()
	if known {
		return id, err
	}
	if fromCaller {
		if err := s.confirmIssued(ctx, sd, b); err != nil {
			return "", err
		}
	}

	s.importMu.Lock()
	defer s.importMu.Unlock()
	s.table.Lock()
	id, known, err = s.importedLocked(md, sum) // imported by a concurrent call meanwhile
	s.table.Unlock()
	if known {
		return id, err
	}
	if err := s.engine.Import(ctx, md); err != nil {
		return "", status.Errorf(regiontable.StatusCode(err), "importing memory %s of node %s: %v", md.ID, md.Node, err)
	}
	s.table.Lock()
	s.imports[md.ID] = &imported{mem: md.ID, lastUsed: time.Now(), sum: sum}
	var evict engines.MemoryID
	if len(s.imports) > maxImports {
		oldest := time.Now()
		for id, im := range s.imports {
			if im.lastUsed.Before(oldest) {
				oldest, evict = im.lastUsed, id
			}
		}
		delete(s.imports, evict)
	}
	s.table.Unlock()
	if evict != "" {
		// The engines wait for transfers still using it; this one is re-imported if named again.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), s.sessionGrace)
			defer cancel()
			_ = s.engine.Deregister(ctx, evict)
		}()
	}
	return md.ID, nil
}

// confirmIssued asks sd's node whether b is the descriptor it issued for the region b names. Another node's
// memory is imported once for every caller of this node and keyed by the memory id its descriptor names, so a
// caller that imported an id first with handles of its choosing (an RDMA key, a fabric token, a tcp address)
// would have them used for, or refuse, every other caller's transfers to that memory. Only a descriptor byte
// for byte as its node issued it is imported.
func (s *Service) confirmIssued(ctx context.Context, sd *agentv1.SegmentDescriptor, b []byte) error {
	if s.peers == nil {
		return status.Errorf(codes.Unavailable, "a descriptor of node %s is imported once its node confirms it, and this agent has no peer channel", sd.Node)
	}
	issued, err := s.peers.ConfirmDescriptor(ctx, sd.Node, sd.RegionId, sd.Key)
	if err != nil {
		return status.Errorf(peerCode(err), "confirming a descriptor of region %d with node %s: %s", sd.RegionId, sd.Node, peerMessage(err))
	}
	if !bytes.Equal(issued, b) {
		return status.Errorf(codes.FailedPrecondition, "the descriptor of region %d is not what node %s issued for it: use the descriptor its owner shared (Region.desc) or name its segment", sd.RegionId, sd.Node)
	}
	return nil
}

// ResolveSegment serves the Agent API call of that name for the caller of sess.
func (s *Service) ResolveSegment(ctx context.Context, sess *regiontable.Session, req *agentv1.ResolveSegmentRequest) (*agentv1.ResolveSegmentResponse, error) {
	var err error
	if err := regiontable.CheckSegmentRef(req.Segment); err != nil {
		return nil, err
	}
	if req.Layout {
		return s.resolveLayoutSegment(ctx, sess, req.Node, req.Segment)
	}
	var desc []byte
	if req.Node == "" || req.Node == s.node {
		desc, err = s.table.LookupSegment(req.Segment, sess.Caller.Namespace)
	} else if s.peers == nil {
		err = status.Errorf(codes.Unavailable, "segment %q is on node %s and this agent has no peer channel", req.Segment, req.Node)
	} else {
		desc, err = s.peers.ResolveSegment(ctx, req.Node, req.Segment, sess.Caller.Namespace)
		if err != nil {
			err = status.Errorf(peerCode(err), "resolving segment %q on node %s: %s", req.Segment, req.Node, peerMessage(err))
		}
	}
	if err != nil {
		return nil, err
	}
	sd, _, err := s.table.ParseDescriptor(desc)
	if err != nil {
		return nil, err
	}
	return &agentv1.ResolveSegmentResponse{Desc: desc, Node: sd.Node, Kind: sd.Kind, Length: sd.Length}, nil
}

// resolveLayoutSegment answers ResolveSegment for a published layout: its geometry as a block transfer of the
// caller's would find it (another node's through the same kept answer, so the transfer that follows does not ask
// the peer again), and refusals worded as that transfer's.
func (s *Service) resolveLayoutSegment(ctx context.Context, sess *regiontable.Session, node, segment string) (*agentv1.ResolveSegmentResponse, error) {
	var blockBytes, blocks uint64
	var regions int
	if node == "" || node == s.node {
		s.table.Lock()
		side, err := s.table.RemoteLayoutLocked(sess, &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: segment}})
		s.table.Unlock()
		if err != nil {
			return nil, err
		}
		node, blockBytes, blocks, regions = s.node, side.BlockBytes, side.Blocks, len(side.Mems)
	} else {
		// Bounded as a block transfer without a timeout is: a peer that does not answer fails the call.
		rctx, cancel := context.WithTimeout(ctx, engines.DefaultTimeout)
		pl, _, err := s.resolvePeerLayout(rctx, sess, node, segment)
		cancel()
		if err != nil {
			return nil, err
		}
		blockBytes, blocks, regions = pl.blockBytes, pl.blocks, len(pl.mems)
	}
	return &agentv1.ResolveSegmentResponse{Node: node, Length: blockBytes * blocks,
		Layout: &agentv1.LayoutGeometry{BlockBytes: blockBytes, Blocks: blocks, Regions: uint32(regions)}}, nil
}

// Explain serves the Agent API call of that name for the caller of sess.
func (s *Service) Explain(ctx context.Context, sess *regiontable.Session, req *agentv1.ExplainRequest) (*agentv1.ExplainResponse, error) {
	if req.Source == nil || req.Destination == nil {
		return nil, status.Error(codes.InvalidArgument, "explain needs a source and a destination")
	}
	src, err := s.resolveRemote(ctx, sess, endpointRef(req.Source))
	if err != nil {
		return nil, status.Errorf(status.Code(err), "source: %s", status.Convert(err).Message())
	}
	dst, err := s.resolveRemote(ctx, sess, endpointRef(req.Destination))
	if err != nil {
		return nil, status.Errorf(status.Code(err), "destination: %s", status.Convert(err).Message())
	}
	ex, err := s.engine.Explain(src, dst)
	if err != nil {
		return nil, status.Errorf(regiontable.StatusCode(err), "explaining: %v", err)
	}
	resp := &agentv1.ExplainResponse{Engine: ex.Engine}
	for _, r := range ex.Refusals {
		resp.Verdicts = append(resp.Verdicts, &agentv1.EngineVerdict{Engine: r.Engine, Reason: r.Reason})
	}
	if ex.Engine != "" {
		reason := "first engine in the order xgmi, fabric, rdma, tcp that claims the pair (" + ex.Direction.String() + ")"
		if ex.Engine == engines.EngineTCP {
			// What tcp does with GPU memory on this node (staged through pinned host memory, or why not).
			for _, e := range s.engines {
				if e.Name == ex.Engine && e.Reason != "" {
					reason += "; " + e.Reason
				}
			}
		}
		resp.Verdicts = append(resp.Verdicts, &agentv1.EngineVerdict{Engine: ex.Engine, CanHandle: true, Reason: reason})
	} else {
		resp.Reason = "no configured engine moves this pair"
	}
	return resp, nil
}

func endpointRef(e *agentv1.Endpoint) *agentv1.RemoteRef {
	r := &agentv1.RemoteRef{Node: e.Node}
	switch t := e.Target.(type) {
	case *agentv1.Endpoint_RegionId:
		r.Target = &agentv1.RemoteRef_RegionId{RegionId: t.RegionId}
	case *agentv1.Endpoint_Segment:
		r.Target = &agentv1.RemoteRef_Segment{Segment: t.Segment}
	case *agentv1.Endpoint_Desc:
		r.Target = &agentv1.RemoteRef_Desc{Desc: t.Desc}
	}
	return r
}
