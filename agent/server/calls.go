// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// The Agent API's calls: each finds the caller's session and hands the call to the package of its concern
// (regiontable for memory and layouts, transfers for moving it, poollend for pool memory).

// GetInfo implements agentv1.AgentServer.
func (s *Server) GetInfo(ctx context.Context, req *agentv1.GetInfoRequest) (*agentv1.GetInfoResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.ApiVersions) > 0 && !slices.Contains(req.ApiVersions, APIVersion) {
		return nil, status.Errorf(codes.FailedPrecondition, "this agent speaks API %s; the client offers %v", APIVersion, req.ApiVersions)
	}
	c := sess.Caller
	resp := &agentv1.GetInfoResponse{
		ApiVersion: APIVersion, SupportedApiVersions: []string{APIVersion}, AgentVersion: s.opts.AgentVersion,
		NodeName: s.opts.NodeName, PoolNamespace: s.opts.PoolNamespace, PoolName: s.opts.PoolName,
		Caller: &agentv1.CallerInfo{Namespace: c.Namespace, PodName: c.PodName, PodUid: c.PodUID,
			Pid: c.Cred.PID, Uid: c.Cred.UID, Identity: c.Key},
		Limits: &agentv1.Limits{MaxRegions: uint32(s.opts.Limits.MaxRegions), MaxRegisteredBytes: s.opts.Limits.MaxRegisteredBytes,
			MaxInFlight: uint32(s.opts.Limits.MaxInFlight), MaxItemsPerTransfer: uint32(s.opts.Limits.MaxItemsPerTransfer),
			MaxNotifyBytes: engines.MaxNotifyPayload},
		FdSocket: s.FDSocketPath(), Instance: s.instance, Session: sess.ID,
		Features: []string{FeatureFastCallTimeout},
	}
	for _, e := range s.opts.Engines {
		resp.Engines = append(resp.Engines, &agentv1.EngineInfo{Name: e.Name, Available: e.Available, Reason: e.Reason})
	}
	s.table.Lock()
	if u := s.table.UsageOfLocked(c.Key); u != nil {
		resp.Usage = &agentv1.Usage{Regions: uint32(u.Regions), RegisteredBytes: u.Bytes, InFlight: uint32(u.InFlight)}
	} else {
		resp.Usage = &agentv1.Usage{}
	}
	s.table.Unlock()
	if s.opts.Pool != nil {
		total, free := s.opts.Pool.Usage()
		kind := agentv1.MemoryKind_MEMORY_KIND_HOST
		if s.opts.Pool.Kind() == poolmem.GPU {
			kind = agentv1.MemoryKind_MEMORY_KIND_GPU
		}
		resp.PoolMemory = &agentv1.PoolMemoryInfo{Kind: kind, TotalBytes: total, FreeBytes: free}
		if gp, ok := s.opts.Pool.(interface{ Devices() []poolmem.DeviceUsage }); ok {
			for _, d := range gp.Devices() {
				resp.PoolMemory.Gpus = append(resp.PoolMemory.Gpus, &agentv1.PoolGPU{Index: int32(d.Index), BusId: d.BusID,
					TotalBytes: d.Total, FreeBytes: d.Free, FabricExportable: d.FabricExportable, FabricReason: d.FabricReason})
			}
		}
	}
	return resp, nil
}

// RegisterMemory implements agentv1.AgentServer.
func (s *Server) RegisterMemory(ctx context.Context, req *agentv1.RegisterMemoryRequest) (*agentv1.RegisterMemoryResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.table.RegisterMemory(ctx, &sess.Session, req)
}

// DeregisterMemory implements agentv1.AgentServer.
func (s *Server) DeregisterMemory(ctx context.Context, req *agentv1.DeregisterMemoryRequest) (*agentv1.DeregisterMemoryResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.table.DeregisterMemory(ctx, &sess.Session, req)
}

// RegisterLayout implements agentv1.AgentServer.
func (s *Server) RegisterLayout(ctx context.Context, req *agentv1.RegisterLayoutRequest) (*agentv1.RegisterLayoutResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.table.RegisterLayout(ctx, &sess.Session, req)
}

// DeregisterLayout implements agentv1.AgentServer.
func (s *Server) DeregisterLayout(ctx context.Context, req *agentv1.DeregisterLayoutRequest) (*agentv1.DeregisterLayoutResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	resp, askers, err := s.table.DeregisterLayout(ctx, &sess.Session, req)
	if err == nil {
		// Before answering: once the owner hears the layout is gone, no other node's new transfer reaches it.
		s.xfer.TellLayoutGone(ctx, askers)
	}
	return resp, err
}

// EndSession implements agentv1.AgentServer: the caller's session ends as when its connection closes, and the
// answer waits for that within the caller's deadline (the teardown goes on past it).
func (s *Server) EndSession(ctx context.Context, _ *agentv1.EndSessionRequest) (*agentv1.EndSessionResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	sess.endedByCaller.Store(true)
	s.endInBackground(sess)
	select {
	case <-sess.ended:
		return &agentv1.EndSessionResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// Transfer implements agentv1.AgentServer.
func (s *Server) Transfer(ctx context.Context, req *agentv1.TransferRequest) (*agentv1.TransferResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.Transfer(ctx, &sess.Session, req, nil)
}

// TransferBlocks implements agentv1.AgentServer.
func (s *Server) TransferBlocks(ctx context.Context, req *agentv1.TransferBlocksRequest) (*agentv1.TransferResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.TransferBlocks(ctx, &sess.Session, req, nil, nil)
}

// Wait implements agentv1.AgentServer.
func (s *Server) Wait(ctx context.Context, req *agentv1.WaitRequest) (*agentv1.TransferStatus, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.Wait(ctx, &sess.Session, req)
}

// Cancel implements agentv1.AgentServer.
func (s *Server) Cancel(ctx context.Context, req *agentv1.CancelRequest) (*agentv1.TransferStatus, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.Cancel(ctx, &sess.Session, req)
}

// Settle implements agentv1.AgentServer.
func (s *Server) Settle(ctx context.Context, _ *agentv1.SettleRequest) (*agentv1.SettleResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.Settle(ctx, &sess.Session)
}

// ResolveSegment implements agentv1.AgentServer.
func (s *Server) ResolveSegment(ctx context.Context, req *agentv1.ResolveSegmentRequest) (*agentv1.ResolveSegmentResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.ResolveSegment(ctx, &sess.Session, req)
}

// Explain implements agentv1.AgentServer.
func (s *Server) Explain(ctx context.Context, req *agentv1.ExplainRequest) (*agentv1.ExplainResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.xfer.Explain(ctx, &sess.Session, req)
}

// Watch implements agentv1.AgentServer.
func (s *Server) Watch(req *agentv1.WatchRequest, stream agentv1.Agent_WatchServer) error {
	sess, err := s.sessionOf(stream.Context())
	if err != nil {
		return err
	}
	return s.xfer.Watch(&sess.Session, req, stream)
}

// Notifications implements agentv1.AgentServer.
func (s *Server) Notifications(req *agentv1.NotificationsRequest, stream agentv1.Agent_NotificationsServer) error {
	sess, err := s.sessionOf(stream.Context())
	if err != nil {
		return err
	}
	return s.xfer.Notifications(&sess.Session, req, stream)
}

// LookupSegment returns the descriptor of a segment registered on this node, for a caller of namespace asker
// (the peer channel answers other agents with it, naming the pod that asks).
func (s *Server) LookupSegment(segment, asker string) ([]byte, error) {
	return s.table.LookupSegment(segment, asker)
}

// IssuedDescriptor answers a peer confirming a descriptor of this node's region id with key (agent/peers).
func (s *Server) IssuedDescriptor(id uint64, key []byte) ([]byte, error) {
	return s.table.IssuedDescriptor(id, key)
}

// FeatureFastCallTimeout (GetInfoResponse.features) says the agent bounds a fast call by its
// FastRequest.call_timeout.
const FeatureFastCallTimeout = "fast-call-timeout"

// LookupLayout answers a peer asking for a published layout (agent/peers): its geometry and every region's
// descriptor, when a pod of namespace asker may use it; one it may not use is missing. node (when not empty) is
// told when the layout goes.
func (s *Server) LookupLayout(segment, asker, node string) (*agentv1.LayoutDescriptor, error) {
	return s.table.LookupLayout(segment, asker, node)
}

// ForgetPeerLayout drops what this agent kept of node's published layout, which node says is gone (agent/peers).
func (s *Server) ForgetPeerLayout(node, segment, asker string) {
	s.xfer.ForgetPeerLayout(node, segment, asker)
}

// DeliverPeerNotification hands over a notification another agent of the pool sent for regions of this node
// (engines without a wire of their own notify through the peer channel). Unknown memory ids are ignored; if
// none is known the sender is told, so it can fail the transfer instead of reporting a notified success.
func (s *Server) DeliverPeerNotification(n engines.Notification) error {
	return s.xfer.DeliverPeerNotification(n)
}

// AllocateFromPool implements agentv1.AgentServer.
func (s *Server) AllocateFromPool(ctx context.Context, req *agentv1.AllocateFromPoolRequest) (*agentv1.AllocateFromPoolResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.pool.AllocateFromPool(ctx, &sess.Session, sess.allocs, req)
}

// Release implements agentv1.AgentServer.
func (s *Server) Release(ctx context.Context, req *agentv1.ReleaseRequest) (*agentv1.ReleaseResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	return s.pool.Release(ctx, sess.allocs, req)
}
