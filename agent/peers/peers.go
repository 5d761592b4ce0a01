// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// APIVersion is the agent-to-agent API version.
const APIVersion = "v1"

// dataEndpointKey is the Hello answer's header naming the agent's data address (its tcp engine listener), so
// peers can open data connections as soon as they meet it.
const dataEndpointKey = "fabricxfer-data-endpoint"

// preconnectParallel bounds how many peers' data connections open at once.
const preconnectParallel = 16

// DataPath is the bulk-byte engine whose connections follow the directory (the tcp engine): connections to a
// peer open when it appears and close when it leaves.
type DataPath interface {
	// Preconnect opens the connections to node at addr (data address); nil once they are open.
	Preconnect(ctx context.Context, node, addr string) error
	// Disconnect closes the connections to node.
	Disconnect(node, reason string)
}

// Local is what this node answers peers with: the agent socket server.
type Local interface {
	LookupSegment(segment, asker string) ([]byte, error)
	// IssuedDescriptor is the descriptor this node issued for region id, when key is its key.
	IssuedDescriptor(id uint64, key []byte) ([]byte, error)
	// LookupLayout answers node's agent (empty: one that will not be told when the layout goes).
	LookupLayout(segment, asker, node string) (*agentv1.LayoutDescriptor, error)
	// ForgetPeerLayout drops what was kept of node's layout segment, asked for namespace asker: node says it is gone.
	ForgetPeerLayout(node, segment, asker string)
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
	// HandshakeTimeout bounds how long an accepted connection may take to finish its TLS handshake and HTTP/2
	// preface (default 10 s): a connection that never authenticates is closed, not held.
	HandshakeTimeout time.Duration
	// ServeCallLimit bounds how long a peer's call may take here, its request's arrival included (default 60 s):
	// gRPC buffers a request as it arrives before any handler runs, and a peer that stalls one must not hold the
	// agent's memory for longer. Peer calls are unary control-plane lookups, done in milliseconds.
	ServeCallLimit time.Duration
	Logger         *slog.Logger
	// DataEndpoint is this node's data address as peers dial it (the tcp engine's); it travels in the Hello
	// answer. Empty: peers learn it only from descriptors.
	DataEndpoint string
	// Data, when set, gets data connections opened to every peer met (at the data address its Hello answer
	// names) and closed when the peer leaves the directory. Failures are logged and retried every Refresh.
	Data DataPath
	// MaxDataPeers bounds how many peers get data connections ahead of use (default 64; negative: none).
	// Beyond it, connections open on first use: four TLS connections to each of a thousand peers would be
	// four thousand idle connections per agent. Each agent picks its own subset (by a hash of both names), so
	// no node is every agent's first choice.
	MaxDataPeers int
}

// defaultMaxDataPeers is Options.MaxDataPeers when zero.
const defaultMaxDataPeers = 64

// Peers is the agent-to-agent channel of one agent.
type Peers struct {
	opts  Options
	log   *slog.Logger
	local Local

	mu    sync.Mutex
	conns map[string]*peerConn
	// acceptor answers peers' queue-pair exchanges (the rdma engine); noAcceptor says why there is none.
	acceptor   QPAcceptor
	noAcceptor string
}

type peerConn struct {
	endpoint string
	// dataEndpoint is the peer's data address from its Hello answer ("" when it names none).
	dataEndpoint string
	conn         *grpc.ClientConn
	api          agentv1.PeerClient
	hello        *agentv1.HelloResponse
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
	if opts.ServeCallLimit <= 0 {
		opts.ServeCallLimit = 60 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Peers{opts: opts, log: opts.Logger, conns: map[string]*peerConn{}}, nil
}

// boundedHandshakes is the peer listener's TLS, closing a connection at once when too many are authenticating
// (sockio.Handshakes): anyone who reaches the port can open them before a pool certificate is proved.
type boundedHandshakes struct {
	credentials.TransportCredentials
	limit *sockio.Handshakes
}

func (b boundedHandshakes) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	leave, err := b.limit.Enter(raw.RemoteAddr())
	if err != nil {
		return nil, nil, fmt.Errorf("refusing a peer connection: %w", err)
	}
	defer leave()
	return b.TransportCredentials.ServerHandshake(raw)
}

func (b boundedHandshakes) Clone() credentials.TransportCredentials {
	return boundedHandshakes{TransportCredentials: b.TransportCredentials.Clone(), limit: b.limit}
}

// maxPeerStreamsPerConn bounds the calls one peer connection has open at once: a transfer resolves each remote
// once, and the asking agent's own calls are bounded by its transfers.
const maxPeerStreamsPerConn = 128

// Serve answers peers on the listener and keeps connections to the directory's nodes until ctx ends.
func (p *Peers) Serve(ctx context.Context, local Local) error {
	if p.opts.Listener == nil {
		return errors.New("peer channel: no listener")
	}
	p.local = local
	handshake := p.opts.HandshakeTimeout
	if handshake <= 0 {
		handshake = 10 * time.Second
	}
	creds := boundedHandshakes{TransportCredentials: credentials.NewTLS(p.opts.TLS.Config()),
		limit: &sockio.Handshakes{}}
	srv := grpc.NewServer(grpc.Creds(creds), grpc.ConnectionTimeout(handshake),
		// A peer's calls are few and short; one connection's stalled requests (each buffered up to 4 MiB) are
		// bounded in number and, by the tap's deadline, in time.
		grpc.MaxConcurrentStreams(maxPeerStreamsPerConn),
		grpc.MaxHeaderListSize(sockio.MaxHeaderListBytes),
		grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) {
			ctx, cancel := context.WithTimeout(ctx, p.opts.ServeCallLimit)
			context.AfterFunc(ctx, cancel)
			return ctx, nil
		}))
	agentv1.RegisterPeerServer(srv, &peerService{p: p})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(p.opts.Listener) }()
	// The refresh loop is joined before the connections are closed, so it cannot add one afterwards.
	pctx, stopRefresh := context.WithCancel(ctx)
	refreshed := make(chan struct{})
	go func() { defer close(refreshed); p.preconnect(pctx) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	stopRefresh()
	<-refreshed
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

// preconnect dials every node the directory lists, so the first transfer to it finds a connection: the
// agent-to-agent channel, then the data connections. A node that leaves the directory loses both. Failures are
// logged and tried again at the next refresh.
func (p *Peers) preconnect(ctx context.Context) {
	t := time.NewTicker(p.opts.Refresh)
	defer t.Stop()
	listed := map[string]bool{} // nodes the directory listed last time
	for {
		nodes, err := p.opts.Directory.Nodes(ctx)
		if err != nil {
			p.log.Info("listing peers", "error", err)
		}
		data := map[string]string{}
		for node, ep := range nodes {
			if node == p.opts.Node {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
			c, err := p.connTo(cctx, node, ep)
			cancel()
			if err != nil {
				p.log.Info("pre-connecting to a peer", "node", node, "endpoint", ep, "error", err)
				continue
			}
			if c.dataEndpoint != "" {
				data[node] = c.dataEndpoint
			}
		}
		p.preconnectData(ctx, data)
		if nodes != nil {
			var gone []string
			p.mu.Lock()
			for node, c := range p.conns {
				if _, ok := nodes[node]; !ok {
					c.conn.Close()
					delete(p.conns, node)
					gone = append(gone, node)
				}
			}
			p.mu.Unlock()
			for node := range listed {
				if _, ok := nodes[node]; !ok && !slices.Contains(gone, node) {
					gone = append(gone, node)
				}
			}
			if p.opts.Data != nil {
				for _, node := range gone {
					p.opts.Data.Disconnect(node, "node left the pool's peer directory")
				}
			}
			listed = map[string]bool{}
			for node := range nodes {
				listed[node] = true
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// preconnectData opens the data connections to the peers (node -> data address), a few at a time; open ones
// cost nothing.
func (p *Peers) preconnectData(ctx context.Context, peers map[string]string) {
	if p.opts.Data == nil {
		return
	}
	peers = p.dataSubset(peers)
	var g errgroup.Group
	g.SetLimit(preconnectParallel)
	for node, addr := range peers {
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
			defer cancel()
			if err := p.opts.Data.Preconnect(cctx, node, addr); err != nil && ctx.Err() == nil {
				p.log.Info("pre-connecting data connections to a peer", "node", node, "address", addr, "error", err)
			}
			return nil
		})
	}
	g.Wait()
}

// sameHost reports whether two host:port addresses name the same host.
func sameHost(a, b string) bool {
	ha, _, errA := net.SplitHostPort(a)
	hb, _, errB := net.SplitHostPort(b)
	return errA == nil && errB == nil && ha == hb
}

// dataSubset keeps the MaxDataPeers peers whose hash with this node's name is lowest: a stable choice across
// refreshes that differs from agent to agent.
func (p *Peers) dataSubset(peers map[string]string) map[string]string {
	limit := p.opts.MaxDataPeers
	if limit == 0 {
		limit = defaultMaxDataPeers
	}
	if limit < 0 {
		return nil
	}
	if len(peers) <= limit {
		return peers
	}
	rank := func(node string) uint64 {
		h := fnv.New64a()
		h.Write([]byte(p.opts.Node))
		h.Write([]byte{0})
		h.Write([]byte(node))
		// FNV alone orders similar names alike for every agent; a 64-bit finalizer (splitmix64) mixes it.
		x := h.Sum64()
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		return x ^ x>>31
	}
	nodes := slices.Collect(maps.Keys(peers))
	slices.SortFunc(nodes, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	out := make(map[string]string, limit)
	for _, n := range nodes[:limit] {
		out[n] = peers[n]
	}
	return out
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
	var header metadata.MD
	var from peer.Peer
	hello, err := api.Hello(ctx, &agentv1.HelloRequest{NodeName: p.opts.Node, PoolNamespace: p.opts.PoolNamespace,
		PoolName: p.opts.PoolName, AgentVersion: p.opts.AgentVersion, ApiVersions: []string{APIVersion}}, grpc.Header(&header), grpc.Peer(&from))
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("introducing ourselves to node %s at %s: %w", node, endpoint, err)
	}
	if hello.NodeName != node {
		conn.Close()
		return nil, fmt.Errorf("the agent at %s is node %q, not %q (stale endpoint?)", endpoint, hello.NodeName, node)
	}
	if err := p.peerIs(&from, node); err != nil {
		conn.Close()
		return nil, fmt.Errorf("the agent at %s: %w", endpoint, err)
	}
	c = &peerConn{endpoint: endpoint, conn: conn, api: api, hello: hello}
	if v := header.Get(dataEndpointKey); len(v) > 0 {
		// A peer names its own data address; one on another host would have every agent dial (and displace
		// connections at) an address of the peer's choosing.
		if sameHost(v[0], endpoint) {
			c.dataEndpoint = v[0]
		} else {
			p.log.Info("ignoring a data address on another host than the peer's endpoint", "node", node, "endpoint", endpoint, "data", v[0])
		}
	}
	p.mu.Lock()
	if old, ok := p.conns[node]; ok {
		if old.endpoint == endpoint {
			// Another caller (the refresh loop, a concurrent call) connected first; closing its connection would
			// cancel what it has in flight.
			p.mu.Unlock()
			conn.Close()
			return old, nil
		}
		old.conn.Close()
	}
	p.conns[node] = c
	p.mu.Unlock()
	return c, nil
}

// peerIs checks, by the certificate it presented, that the peer of a connection is node.
func (p *Peers) peerIs(from *peer.Peer, node string) error {
	ti, ok := from.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return fmt.Errorf("no mutual TLS on the connection of node %q", node)
	}
	return p.opts.TLS.CheckPeer(ti.State, node)
}

// callerIs refuses a call whose sender speaks as node without holding node's certificate.
func (p *Peers) callerIs(ctx context.Context, node string) error {
	from, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "no peer information on the call")
	}
	if err := p.peerIs(from, node); err != nil {
		return status.Errorf(codes.PermissionDenied, "refusing a peer at %s that speaks as node %q: %v", from.Addr, node, err)
	}
	return nil
}

func (p *Peers) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, p.opts.CallTimeout)
}

// ResolveSegment asks node for a segment's descriptor (server.SegmentResolver).
func (p *Peers) ResolveSegment(ctx context.Context, node, segment, asker string) ([]byte, error) {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return nil, unreachable(err)
	}
	resp, err := c.api.ResolveSegment(ctx, &agentv1.PeerResolveSegmentRequest{Segment: segment, RequesterNamespace: asker})
	if err != nil {
		return nil, err
	}
	return resp.Desc, nil
}

// ConfirmDescriptor asks node for the descriptor it issued for its region id with key (server.SegmentResolver).
func (p *Peers) ConfirmDescriptor(ctx context.Context, node string, id uint64, key []byte) ([]byte, error) {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return nil, unreachable(err)
	}
	resp, err := c.api.ConfirmDescriptor(ctx, &agentv1.ConfirmDescriptorRequest{RegionId: id, Key: key})
	if err != nil {
		return nil, err
	}
	return resp.Desc, nil
}

// unreachable is the status of failing to reach a peer: Unavailable, unless the directory said better (NotFound:
// no such node in the pool).
func unreachable(err error) error {
	if st, ok := status.FromError(err); ok && st.Code() != codes.Unknown {
		return err
	}
	return status.Errorf(codes.Unavailable, "%v", err)
}

// ResolveLayout asks node for a published layout (server.SegmentResolver).
func (p *Peers) ResolveLayout(ctx context.Context, node, segment, asker string) (*agentv1.LayoutDescriptor, error) {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return nil, unreachable(err)
	}
	resp, err := c.api.ResolveSegment(ctx, &agentv1.PeerResolveSegmentRequest{Segment: segment, RequesterNamespace: asker, Layout: true,
		RequesterNode: p.opts.Node})
	if err != nil {
		return nil, err
	}
	if resp.Layout == nil {
		return nil, status.Errorf(codes.Unimplemented, "node %s answered no layout (an agent that serves only regions)", node)
	}
	return resp.Layout, nil
}

// ForgetLayout tells node, which resolved this node's published layout as segment for namespace asker, that the
// layout is gone (server.SegmentResolver).
func (p *Peers) ForgetLayout(ctx context.Context, node, segment, asker string) error {
	ctx, cancel := p.bounded(ctx)
	defer cancel()
	c, err := p.connTo(ctx, node, "")
	if err != nil {
		return unreachable(err)
	}
	_, err = c.api.ForgetLayout(ctx, &agentv1.PeerForgetLayoutRequest{FromNode: p.opts.Node, Segment: segment, RequesterNamespace: asker})
	return err
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
func (s *peerService) Hello(ctx context.Context, req *agentv1.HelloRequest) (*agentv1.HelloResponse, error) {
	if req.PoolNamespace != s.p.opts.PoolNamespace || req.PoolName != s.p.opts.PoolName {
		return nil, status.Errorf(codes.PermissionDenied, "this agent serves pool %s/%s, not %s/%s",
			s.p.opts.PoolNamespace, s.p.opts.PoolName, req.PoolNamespace, req.PoolName)
	}
	if err := s.p.callerIs(ctx, req.NodeName); err != nil {
		return nil, err
	}
	if len(req.ApiVersions) > 0 && !slices.Contains(req.ApiVersions, APIVersion) {
		return nil, status.Errorf(codes.FailedPrecondition, "this agent speaks %s; the peer offers %v", APIVersion, req.ApiVersions)
	}
	if s.p.opts.DataEndpoint != "" {
		if err := grpc.SetHeader(ctx, metadata.Pairs(dataEndpointKey, s.p.opts.DataEndpoint)); err != nil {
			return nil, status.Errorf(codes.Internal, "announcing the data address: %v", err)
		}
	}
	return &agentv1.HelloResponse{NodeName: s.p.opts.Node, PoolNamespace: s.p.opts.PoolNamespace, PoolName: s.p.opts.PoolName,
		AgentVersion: s.p.opts.AgentVersion, ApiVersion: APIVersion}, nil
}

// Notify implements agentv1.PeerServer.
func (s *peerService) Notify(ctx context.Context, req *agentv1.PeerNotifyRequest) (*agentv1.PeerNotifyResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	if err := s.p.callerIs(ctx, req.FromNode); err != nil {
		return nil, err
	}
	// Tags are not copied: no receiver reads them (a listener hears of regions), and a block transfer has one a
	// block and region pair.
	n := engines.Notification{From: req.FromNode, Payload: req.Payload, Regions: make([]engines.MemoryID, len(req.MemoryIds))}
	for i, id := range req.MemoryIds {
		n.Regions[i] = engines.MemoryID(id)
	}
	if err := engines.CheckReceived(&n); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.p.local.DeliverPeerNotification(n); err != nil {
		return nil, err
	}
	return &agentv1.PeerNotifyResponse{}, nil
}

// ForgetLayout implements agentv1.PeerServer: only the layout's own node may say it is gone.
func (s *peerService) ForgetLayout(ctx context.Context, req *agentv1.PeerForgetLayoutRequest) (*agentv1.PeerForgetLayoutResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	if err := s.p.callerIs(ctx, req.FromNode); err != nil {
		return nil, err
	}
	s.p.local.ForgetPeerLayout(req.FromNode, req.Segment, req.RequesterNamespace)
	return &agentv1.PeerForgetLayoutResponse{}, nil
}

// ConfirmDescriptor implements agentv1.PeerServer. Any agent of the pool may ask: one that holds a region's id and
// key holds its descriptor's capability already, and learns only what it would have been given with it.
func (s *peerService) ConfirmDescriptor(ctx context.Context, req *agentv1.ConfirmDescriptorRequest) (*agentv1.ConfirmDescriptorResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	desc, err := s.p.local.IssuedDescriptor(req.RegionId, req.Key)
	if err != nil {
		return nil, err
	}
	return &agentv1.ConfirmDescriptorResponse{Desc: desc}, nil
}

// ResolveSegment implements agentv1.PeerServer.
func (s *peerService) ResolveSegment(ctx context.Context, req *agentv1.PeerResolveSegmentRequest) (*agentv1.PeerResolveSegmentResponse, error) {
	if s.p.local == nil {
		return nil, status.Error(codes.Unavailable, "agent not ready")
	}
	if req.Layout {
		// The node to tell when the layout goes must be the one asking: another could be told in its place.
		if req.RequesterNode != "" {
			if err := s.p.callerIs(ctx, req.RequesterNode); err != nil {
				return nil, err
			}
		}
		l, err := s.p.local.LookupLayout(req.Segment, req.RequesterNamespace, req.RequesterNode)
		if err != nil {
			return nil, err
		}
		return &agentv1.PeerResolveSegmentResponse{Layout: l}, nil
	}
	desc, err := s.p.local.LookupSegment(req.Segment, req.RequesterNamespace)
	if err != nil {
		return nil, err
	}
	return &agentv1.PeerResolveSegmentResponse{Desc: desc}, nil
}
