package peers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// APIVersion is the agent-to-agent API version.
const APIVersion = "v1"

// Local is what this node answers peers with: the agent socket server.
type Local interface {
	LookupSegment(segment string) ([]byte, error)
	DeliverPeerNotification(n engines.Notification) error
}

// Options configure the channel.
type Options struct {
	Node          string
	PoolNamespace string
	PoolName      string
	AgentVersion  string
	// Listener accepts peers (TCP); its address, as peers reach it, is what TransferNode .status.endpoint says.
	Listener  net.Listener
	TLS       *TLSFiles
	Directory Directory
	// Refresh is how often the directory is read to connect new peers ahead of use (default 10 s).
	Refresh time.Duration
	// CallTimeout bounds one call to a peer when the caller's context has no deadline (default 5 s).
	CallTimeout time.Duration
	Logger      *slog.Logger
}

// Peers is the agent-to-agent channel of one agent.
type Peers struct {
	opts  Options
	log   *slog.Logger
	local Local

	mu    sync.Mutex
	conns map[string]*peerConn
}

type peerConn struct {
	endpoint string
	conn     *grpc.ClientConn
	api      agentv1.PeerClient
	hello    *agentv1.HelloResponse
}

// New checks the options.
func New(opts Options) (*Peers, error) {
	switch {
	case opts.Node == "" || opts.PoolNamespace == "" || opts.PoolName == "":
		return nil, errors.New("peer channel: node and pool required")
	case opts.TLS == nil:
		return nil, errors.New("peer channel: TLS certificates required (agent-to-agent traffic carries capabilities)")
	case opts.Directory == nil:
		return nil, errors.New("peer channel: directory required")
	}
	if opts.Refresh <= 0 {
		opts.Refresh = 10 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Peers{opts: opts, log: opts.Logger, conns: map[string]*peerConn{}}, nil
}

// Serve answers peers on the listener and keeps connections to the directory's nodes until ctx ends.
func (p *Peers) Serve(ctx context.Context, local Local) error {
	if p.opts.Listener == nil {
		return errors.New("peer channel: no listener")
	}
	p.local = local
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(p.opts.TLS.Config())))
	agentv1.RegisterPeerServer(srv, &peerService{p: p})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(p.opts.Listener) }()
	go p.preconnect(ctx)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	done := make(chan struct{})
	go func() { srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		srv.Stop()
	}
	p.mu.Lock()
	for n, c := range p.conns {
		c.conn.Close()
		delete(p.conns, n)
	}
	p.mu.Unlock()
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving peers on %s: %w", p.opts.Listener.Addr(), err)
	}
	return nil
}

// preconnect dials every node the directory lists, so the first transfer to it finds a connection.
func (p *Peers) preconnect(ctx context.Context) {
	t := time.NewTicker(p.opts.Refresh)
	defer t.Stop()
	for {
		nodes, err := p.opts.Directory.Nodes(ctx)
		if err != nil {
			p.log.Info("listing peers", "error", err)
		}
		for node, ep := range nodes {
			if node == p.opts.Node {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
			if _, err := p.connTo(cctx, node, ep); err != nil {
				p.log.Info("pre-connecting to a peer", "node", node, "endpoint", ep, "error", err)
			}
			cancel()
		}
		p.mu.Lock()
		for node, c := range p.conns {
			if _, ok := nodes[node]; !ok && nodes != nil {
				c.conn.Close()
				delete(p.conns, node)
			}
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Connected lists the nodes with an introduced connection.
func (p *Peers) Connected() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for n := range p.conns {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// connTo returns the connection to node, dialing and introducing ourselves when there is none (or the
// endpoint moved).
func (p *Peers) connTo(ctx context.Context, node, endpoint string) (*peerConn, error) {
	p.mu.Lock()
	c, ok := p.conns[node]
	p.mu.Unlock()
	if ok && (endpoint == "" || c.endpoint == endpoint) {
		return c, nil
	}
	if endpoint == "" {
		ep, err := p.opts.Directory.Endpoint(ctx, node)
		if err != nil {
			return nil, err
		}
		endpoint = ep
	}
	conn, err := grpc.NewClient("passthrough:///"+endpoint, grpc.WithTransportCredentials(credentials.NewTLS(p.opts.TLS.Config())))
	if err != nil {
		return nil, fmt.Errorf("connecting to node %s at %s: %w", node, endpoint, err)
	}
	api := agentv1.NewPeerClient(conn)
	hello, err := api.Hello(ctx, &agentv1.HelloRequest{NodeName: p.opts.Node, PoolNamespace: p.opts.PoolNamespace,
		PoolName: p.opts.PoolName, AgentVersion: p.opts.AgentVersion, ApiVersions: []string{APIVersion}})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("introducing ourselves to node %s at %s: %w", node, endpoint, err)
	}
	if hello.NodeName != node {
		conn.Close()
		return nil, fmt.Errorf("the agent at %s is node %q, not %q (stale endpoint?)", endpoint, hello.NodeName, node)
	}
	c = &peerConn{endpoint: endpoint, conn: conn, api: api, hello: hello}
	p.mu.Lock()
	if old, ok := p.conns[node]; ok {
		old.conn.Close()
	}
	p.conns[node] = c
	p.mu.Unlock()
	return c, nil
}

func (p *Peers) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.opts.CallTimeout)
}

// ResolveSegment asks node for a segment's descriptor (server.SegmentResolver).
func (p *Peers) ResolveSegment(ctx context.Context, node, segment string) ([]byte, error) {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v", err)
	}
	resp, err := c.api.ResolveSegment(ctx, &agentv1.PeerResolveSegmentRequest{Segment: segment})
	if err != nil {
		return nil, err
	}
	return resp.Desc, nil
}

// SendNotification carries a notification to node (engines.NotifySender).
func (p *Peers) SendNotification(ctx context.Context, node string, n engines.Notification) error {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return fmt.Errorf("%w: %v", engines.ErrPeerLost, err)
	}
	req := &agentv1.PeerNotifyRequest{FromNode: n.From, Payload: n.Payload}
	for _, id := range n.Regions {
		req.MemoryIds = append(req.MemoryIds, string(id))
	}
	for _, t := range n.Tags {
		req.Tags = append(req.Tags, uint64(t))
	}
	if _, err := c.api.Notify(ctx, req); err != nil {
		return fmt.Errorf("notifying node %s: %w", node, err)
	}
	return nil
}

// peerService answers other agents.
type peerService struct {
	agentv1.UnimplementedPeerServer
	p *Peers
}

// Hello implements agentv1.PeerServer.
func (s *peerService) Hello(_ context.Context, req *agentv1.HelloRequest) (*agentv1.HelloResponse, error) {
	if req.PoolNamespace != s.p.opts.PoolNamespace || req.PoolName != s.p.opts.PoolName {
		return nil, status.Errorf(codes.PermissionDenied, "this agent serves pool %s/%s, not %s/%s",
			s.p.opts.PoolNamespace, s.p.opts.PoolName, req.PoolNamespace, req.PoolName)
	}
	if len(req.ApiVersions) > 0 && !slices.Contains(req.ApiVersions, APIVersion) {
		return nil, status.Errorf(codes.FailedPrecondition, "this agent speaks %s; the peer offers %v", APIVersion, req.ApiVersions)
	}
	return &agentv1.HelloResponse{NodeName: s.p.opts.Node, PoolNamespace: s.p.opts.PoolNamespace, PoolName: s.p.opts.PoolName,
		AgentVersion: s.p.opts.AgentVersion, ApiVersion: APIVersion}, nil
}

// Notify implements agentv1.PeerServer.
func (s *peerService) Notify(_ context.Context, req *agentv1.PeerNotifyRequest) (*agentv1.PeerNotifyResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	if len(req.Payload) > engines.MaxNotifyPayload {
		return nil, status.Errorf(codes.InvalidArgument, "payload of %d bytes, at most %d", len(req.Payload), engines.MaxNotifyPayload)
	}
	n := engines.Notification{From: req.FromNode, Payload: req.Payload}
	for _, id := range req.MemoryIds {
		n.Regions = append(n.Regions, engines.MemoryID(id))
	}
	for _, t := range req.Tags {
		n.Tags = append(n.Tags, engines.Tag(t))
	}
	if err := s.p.local.DeliverPeerNotification(n); err != nil {
		return nil, err
	}
	return &agentv1.PeerNotifyResponse{}, nil
}

// ResolveSegment implements agentv1.PeerServer.
func (s *peerService) ResolveSegment(_ context.Context, req *agentv1.PeerResolveSegmentRequest) (*agentv1.PeerResolveSegmentResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	desc, err := s.p.local.LookupSegment(req.Segment)
	if err != nil {
		return nil, err
	}
	return &agentv1.PeerResolveSegmentResponse{Desc: desc}, nil
}
