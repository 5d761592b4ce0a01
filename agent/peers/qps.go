// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// maxQPsPerExchange bounds the queue pairs of one exchange (the rdma engine refuses more as well).
const maxQPsPerExchange = 64

// QPAcceptor answers peers' queue-pair exchanges: the rdma engine ((*rdma.Engine).AcceptQPs).
type QPAcceptor interface {
	AcceptQPs(ctx context.Context, req rdma.ExchangeRequest) ([]verbs.ConnInfo, error)
}

var _ rdma.Exchanger = (*Peers)(nil)

// SetQPAcceptor names what answers peers' queue-pair exchanges. With a nil acceptor, whyNone is what peers that
// ask are told (Unavailable, "rdma engine not running on node N: whyNone"). Call it before Serve; a later call
// applies to the exchanges that arrive after it.
func (p *Peers) SetQPAcceptor(a QPAcceptor, whyNone string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acceptor, p.noAcceptor = a, whyNone
}

// ExchangeQPs implements rdma.Exchanger over the peer channel: it sends this node's queue pairs to req.To and
// returns the ones its rdma engine connected to them. The call is bounded by CallTimeout even when the caller's
// context allows longer (connecting a set is a few verbs calls on the other side). A refusal because req.To is
// dialing this node at the same moment comes back as rdma.ErrConnectRace; an unreachable peer as
// engines.ErrPeerLost.
func (p *Peers) ExchangeQPs(ctx context.Context, req rdma.ExchangeRequest) ([]verbs.ConnInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
	defer cancel()
	if req.From != p.opts.Node {
		return nil, fmt.Errorf("exchanging queue pairs: %w: request from node %q sent by node %q", engines.ErrInvalid, req.From, p.opts.Node)
	}
	c, err := p.connTo(ctx, req.To, "")
	if err != nil {
		return nil, fmt.Errorf("%w: exchanging queue pairs with node %s: %v", engines.ErrPeerLost, req.To, err)
	}
	msg := &agentv1.ExchangeQPsRequest{FromNode: req.From, ToNode: req.To, FromNic: req.FromNIC, ToNic: req.ToNIC,
		Qps: qpsToWire(req.QPs)}
	resp, err := c.api.ExchangeQPs(ctx, msg)
	if err != nil {
		return nil, exchangeError(req.To, err)
	}
	out, err := qpsFromWire(resp.Qps)
	if err != nil {
		return nil, fmt.Errorf("node %s answered the queue-pair exchange with %w", req.To, err)
	}
	return out, nil
}

// exchangeError turns a refused exchange back into the engine's errors: the connect race into
// rdma.ErrConnectRace (the engine then waits for the peer's own connection), gRPC's own Unavailable (the
// connection failed) into engines.ErrPeerLost; other refusals, "rdma engine not running" among them, keep
// their code and message.
func exchangeError(node string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("exchanging queue pairs with node %s: %w", node, err)
	}
	switch refusal(st) {
	case agentv1.ExchangeQPsRefusal_REASON_CONNECT_RACE:
		return fmt.Errorf("node %s refused our queue pairs: %w", node, rdma.ErrConnectRace)
	case agentv1.ExchangeQPsRefusal_REASON_UNSPECIFIED:
		if st.Code() == codes.Unavailable {
			return fmt.Errorf("%w: exchanging queue pairs with node %s: %w", engines.ErrPeerLost, node, err)
		}
	}
	return fmt.Errorf("exchanging queue pairs with node %s: %w", node, err)
}

// refusal is the reason detail of a refused exchange (unspecified when there is none).
func refusal(st *status.Status) agentv1.ExchangeQPsRefusal_Reason {
	for _, d := range st.Details() {
		if r, ok := d.(*agentv1.ExchangeQPsRefusal); ok {
			return r.Reason
		}
	}
	return agentv1.ExchangeQPsRefusal_REASON_UNSPECIFIED
}

// refused is a status carrying a refusal reason the caller acts on.
func refused(code codes.Code, reason agentv1.ExchangeQPsRefusal_Reason, msg string) error {
	st, err := status.New(code, msg).WithDetails(&agentv1.ExchangeQPsRefusal{Reason: reason})
	if err != nil {
		return status.Errorf(codes.Internal, "attaching refusal reason %s to %q: %v", reason, msg, err)
	}
	return st.Err()
}

// ExchangeQPs implements agentv1.PeerServer: the request must come from another node of the pool and be meant
// for this one; the registered acceptor (the rdma engine) connects the set.
func (s *peerService) ExchangeQPs(ctx context.Context, req *agentv1.ExchangeQPsRequest) (*agentv1.ExchangeQPsResponse, error) {
	p := s.p
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.opts.CallTimeout)
		defer cancel()
	}
	if req.ToNode != p.opts.Node {
		return nil, status.Errorf(codes.InvalidArgument, "queue pairs for node %q reached node %q", req.ToNode, p.opts.Node)
	}
	// The certificate first: a node name it does not prove costs no directory lookup (an API server read).
	if err := p.callerIs(ctx, req.FromNode); err != nil {
		return nil, err
	}
	if err := p.checkPoolNode(ctx, req.FromNode); err != nil {
		return nil, err
	}
	if n := len(req.Qps); n == 0 || n > maxQPsPerExchange {
		return nil, status.Errorf(codes.InvalidArgument, "%d queue pairs offered, want 1 to %d", n, maxQPsPerExchange)
	}
	for _, nic := range []string{req.FromNic, req.ToNic} {
		if !isDeviceName(nic) {
			return nil, status.Errorf(codes.InvalidArgument, "node %s named an RDMA device of %d bytes that no device is called", req.FromNode, len(nic))
		}
	}
	qps, err := qpsFromWire(req.Qps)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "node %s offered %v", req.FromNode, err)
	}
	p.mu.Lock()
	a, why := p.acceptor, p.noAcceptor
	p.mu.Unlock()
	if a == nil {
		msg := "rdma engine not running on node " + p.opts.Node
		if why != "" {
			msg += ": " + why
		}
		return nil, refused(codes.Unavailable, agentv1.ExchangeQPsRefusal_REASON_RDMA_NOT_RUNNING, msg)
	}
	infos, err := a.AcceptQPs(ctx, rdma.ExchangeRequest{From: req.FromNode, To: req.ToNode, FromNIC: req.FromNic, ToNIC: req.ToNic, QPs: qps})
	if err != nil {
		return nil, acceptError(err)
	}
	return &agentv1.ExchangeQPsResponse{Qps: qpsToWire(infos)}, nil
}

// isDeviceName reports whether s could name an RDMA device (/sys/class/infiniband: at most 64 bytes, printable,
// no '/' or space). The receiving engine keeps the sender's device name with the queue-pair set it builds.
func isDeviceName(s string) bool {
	return s != "" && len(s) <= 64 && !strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' || r == '/' })
}

// acceptError maps the acceptor's error to a status the caller maps back (exchangeError).
func acceptError(err error) error {
	switch {
	case errors.Is(err, rdma.ErrConnectRace):
		return refused(codes.Aborted, agentv1.ExchangeQPsRefusal_REASON_CONNECT_RACE, err.Error())
	case errors.Is(err, engines.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// checkPoolNode admits a queue-pair request only from another node the pool's directory lists (or one this
// agent already met): a name outside the pool, or this node's own, is refused. Which node is calling is its
// certificate's to prove (callerIs); a pool-wide certificate of an earlier version proves membership only.
func (p *Peers) checkPoolNode(ctx context.Context, node string) error {
	if node == "" {
		return status.Error(codes.InvalidArgument, "queue pairs offered without the sender's node name")
	}
	if node == p.opts.Node {
		return status.Errorf(codes.PermissionDenied, "queue pairs offered in the name of node %s, which is this node", node)
	}
	p.mu.Lock()
	_, met := p.conns[node]
	p.mu.Unlock()
	if met {
		return nil
	}
	if _, err := p.opts.Directory.Endpoint(ctx, node); err != nil {
		return status.Errorf(codes.PermissionDenied, "queue pairs offered in the name of node %q, which is not a node of pool %s/%s: %v",
			node, p.opts.PoolNamespace, p.opts.PoolName, err)
	}
	return nil
}

func qpsToWire(in []verbs.ConnInfo) []*agentv1.QPConnInfo {
	out := make([]*agentv1.QPConnInfo, len(in))
	for i, c := range in {
		w := &agentv1.QPConnInfo{Qpn: c.QPN, Psn: c.PSN, Lid: uint32(c.LID), Mtu: uint32(c.MTU)}
		if c.GID != ([16]byte{}) {
			w.Gid = append([]byte(nil), c.GID[:]...)
		}
		out[i] = w
	}
	return out
}

func qpsFromWire(in []*agentv1.QPConnInfo) ([]verbs.ConnInfo, error) {
	out := make([]verbs.ConnInfo, len(in))
	for i, w := range in {
		if w.Lid > 0xffff {
			return nil, fmt.Errorf("queue pair %d: LID %d exceeds 16 bits", i, w.Lid)
		}
		if len(w.Gid) != 0 && len(w.Gid) != 16 {
			return nil, fmt.Errorf("queue pair %d: GID of %d bytes, want 16", i, len(w.Gid))
		}
		if w.Mtu > 1<<20 {
			return nil, fmt.Errorf("queue pair %d: path MTU of %d bytes", i, w.Mtu)
		}
		c := verbs.ConnInfo{QPN: w.Qpn, PSN: w.Psn, LID: uint16(w.Lid), MTU: int(w.Mtu)}
		copy(c.GID[:], w.Gid)
		out[i] = c
	}
	return out, nil
}
