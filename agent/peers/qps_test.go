// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/rdmanics"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/rdma/fakeverbs"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
	"github.com/fabricxfer/fabricxfer/topology"
)

// nicReport is a node with one active InfiniBand port.
func nicReport() *topology.Report {
	return &topology.Report{NICs: []topology.NIC{{Name: "mlx5_0", Port: 1, State: "ACTIVE", LinkLayer: "InfiniBand"}}}
}

// notes is the Local of an agent whose socket server only collects the notifications peers deliver.
type notes struct{ ch chan engines.Notification }

func (n notes) LookupLayout(segment, _, _ string) (*agentv1.LayoutDescriptor, error) {
	return nil, status.Errorf(codes.NotFound, "no layout segment %q", segment)
}

func (n notes) ForgetPeerLayout(_, _, _ string) {}

func (n notes) LookupSegment(segment, _ string) ([]byte, error) {
	return nil, status.Errorf(codes.NotFound, "no segment %q", segment)
}

func (n notes) IssuedDescriptor(id uint64, _ []byte) ([]byte, error) {
	return nil, status.Errorf(codes.NotFound, "no region %d", id)
}

func (n notes) DeliverPeerNotification(x engines.Notification) error {
	n.ch <- x
	return nil
}

// acceptor records what the engine answered to peers' exchanges.
type acceptor struct {
	e     *rdma.Engine
	mu    sync.Mutex
	errs  []error
	calls int
	// raced is closed the first time the engine refuses an exchange with ErrConnectRace.
	raced     chan struct{}
	raceOnce  sync.Once
	lastFrom  string
	lastCount int
}

func (a *acceptor) AcceptQPs(ctx context.Context, req rdma.ExchangeRequest) ([]verbs.ConnInfo, error) {
	infos, err := a.e.AcceptQPs(ctx, req)
	a.mu.Lock()
	a.calls++
	a.errs = append(a.errs, err)
	a.lastFrom, a.lastCount = req.From, len(req.QPs)
	a.mu.Unlock()
	if errors.Is(err, rdma.ErrConnectRace) {
		a.raceOnce.Do(func() { close(a.raced) })
	}
	return infos, err
}

// seen returns how many exchanges reached the engine, the last sender and its queue pairs, and the results.
func (a *acceptor) seen() (int, string, int, []error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, a.lastFrom, a.lastCount, append([]error(nil), a.errs...)
}

// exchanger is the engine's view of the peer channel; before, when set, runs ahead of every exchange, and
// every result is recorded.
type exchanger struct {
	p      *peers.Peers
	before func(context.Context) error
	mu     sync.Mutex
	errs   []error
}

func (x *exchanger) ExchangeQPs(ctx context.Context, req rdma.ExchangeRequest) ([]verbs.ConnInfo, error) {
	if x.before != nil {
		if err := x.before(ctx); err != nil {
			return nil, err
		}
	}
	infos, err := x.p.ExchangeQPs(ctx, req)
	x.mu.Lock()
	x.errs = append(x.errs, err)
	x.mu.Unlock()
	return infos, err
}

func (x *exchanger) results() []error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]error(nil), x.errs...)
}

// rdmaAgent is one agent's peer channel with an rdma engine on the shared fake RDMA network.
type rdmaAgent struct {
	*node
	eng   *rdma.Engine
	ex    *exchanger
	acc   *acceptor
	notes notes
}

// startRDMA serves n's peer channel over mTLS with an rdma engine that exchanges its queue pairs through it;
// withEngine false runs the channel alone, telling peers why (noRDMA).
func startRDMA(t *testing.T, n *node, dir peers.Directory, net *fakeverbs.Network, withEngine bool, noRDMA string) *rdmaAgent {
	t.Helper()
	t.Cleanup(func() { n.dataLn.Close() }) // the tcp engine's listener: unused here
	p, err := peers.New(peers.Options{Node: n.name, PoolNamespace: "infer", PoolName: "kv", AgentVersion: "test",
		Listener: n.peerLn, TLS: n.tls, Directory: dir, Refresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := &rdmaAgent{node: n, ex: &exchanger{p: p}, notes: notes{ch: make(chan engines.Notification, 16)}}
	n.peers = p
	if withEngine {
		a.eng, err = rdma.New(rdma.Options{Node: n.name, Provider: net.Provider(n.name), NICs: rdmanics.FromReport(nicReport()),
			Exchanger: a.ex, Notifier: p, ChunkBytes: 64 << 10, QPsPerPeer: 2, DrainTimeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.eng.Close() })
		a.acc = &acceptor{e: a.eng, raced: make(chan struct{})}
		p.SetQPAcceptor(a.acc, "")
	} else if noRDMA != "" {
		p.SetQPAcceptor(nil, noRDMA)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, a.notes) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", n.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not stop", n.name)
		}
	})
	return a
}

// hostRegion registers size random bytes of host memory with the agent's rdma engine.
func (a *rdmaAgent) hostRegion(t *testing.T, id string, size int) (engines.MemoryDesc, []byte) {
	t.Helper()
	buf := make([]byte, size)
	if _, err := rand.Read(buf); err != nil {
		t.Fatal(err)
	}
	d, err := a.eng.Register(context.Background(), engines.MemoryDesc{ID: engines.MemoryID(a.name + "/" + id), Node: a.name,
		Location: engines.Location{Kind: engines.LocationHost}, Size: uint64(size), Handles: engines.Handles{Host: buf}})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Handles.RDMA) != 1 {
		t.Fatalf("%s registered without an RDMA key: %+v", d.ID, d.Handles)
	}
	return d, buf
}

// importFrom makes the other agent's region known to this one, as a descriptor that crossed the wire.
func (a *rdmaAgent) importFrom(t *testing.T, d engines.MemoryDesc) {
	t.Helper()
	wire, err := engines.MarshalDesc(d.Remote())
	if err != nil {
		t.Fatal(err)
	}
	back, err := engines.UnmarshalDesc(wire)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.eng.Import(context.Background(), back); err != nil {
		t.Fatal(err)
	}
}

func (a *rdmaAgent) move(t *testing.T, src, dst engines.MemoryID, size int, notify []byte) error {
	t.Helper()
	b := a.eng.NewPlan()
	if err := b.Add(engines.Item{Src: src, Dst: dst, Size: uint64(size), Tag: 7}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tr, err := a.eng.Submit(ctx, b.Build(), engines.SubmitOptions{Notify: notify})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Wait(ctx)
}

func twoRDMAAgents(t *testing.T) (*fakeverbs.Network, *rdmaAgent, *rdmaAgent) {
	t.Helper()
	certs := newPoolCerts(t, "infer", "kv")
	na, nb := newNode(t, "node-a", certs), newNode(t, "node-b", certs)
	dir := peers.StaticDirectory{"node-a": na.peerLn.Addr().String(), "node-b": nb.peerLn.Addr().String()}
	net := fakeverbs.NewNetwork()
	return net, startRDMA(t, na, dir, net, true, ""), startRDMA(t, nb, dir, net, true, "")
}

func sum(b []byte) [32]byte { return sha256.Sum256(b) }

// TestRDMAEnginesExchangeQueuePairsOverThePeerChannel: two agents' peer channels (mTLS gRPC) carry their rdma
// engines' queue-pair exchange; node A writes into node B and reads from it, node B writes into node A, every
// destination checksummed against its source, and A's write notifies B through the channel.
func TestRDMAEnginesExchangeQueuePairsOverThePeerChannel(t *testing.T) {
	net, a, b := twoRDMAAgents(t)
	const size = 1 << 20
	srcA, bufSrcA := a.hostRegion(t, "src", size)
	dstA, bufDstA := a.hostRegion(t, "dst", size)
	srcB, bufSrcB := b.hostRegion(t, "src", size)
	dstB, bufDstB := b.hostRegion(t, "dst", size)
	a.importFrom(t, srcB)
	a.importFrom(t, dstB)
	b.importFrom(t, dstA)

	if err := a.move(t, srcA.ID, dstB.ID, size, []byte("written by a")); err != nil {
		t.Fatalf("node A writing into node B: %v", err)
	}
	if sum(bufDstB) != sum(bufSrcA) {
		t.Fatal("node B's destination differs from node A's source after the rdma write")
	}
	select {
	case n := <-b.notes.ch:
		if n.From != "node-a" || string(n.Payload) != "written by a" || len(n.Regions) != 1 || n.Regions[0] != dstB.ID {
			t.Fatalf("notification on node B: %+v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node B got no notification of the write")
	}
	if calls, from, n, errs := b.acc.seen(); calls != 1 || from != "node-a" || n != 2 || errs[0] != nil {
		t.Fatalf("node B's engine accepted %d exchanges (last from %q, %d queue pairs, errors %v); want one of 2 from node-a",
			calls, from, n, errs)
	}

	if err := a.move(t, srcB.ID, dstA.ID, size, nil); err != nil {
		t.Fatalf("node A reading from node B: %v", err)
	}
	if sum(bufDstA) != sum(bufSrcB) {
		t.Fatal("node A's destination differs from node B's source after the rdma read")
	}
	// Node B writes back over the set node A dialed: no second exchange.
	copy(bufSrcB, bytes.Repeat([]byte("kv-block"), size/8))
	if err := b.move(t, srcB.ID, dstA.ID, size, nil); err != nil {
		t.Fatalf("node B writing into node A: %v", err)
	}
	if sum(bufDstA) != sum(bufSrcB) {
		t.Fatal("node A's destination differs from node B's source after node B's write")
	}
	if got := len(a.ex.results()) + len(b.ex.results()); got != 1 {
		t.Fatalf("%d queue-pair exchanges for one peer pair, want 1", got)
	}
	if net.Connected != 4 {
		t.Fatalf("%d queue pairs connected, want 4 (2 per side)", net.Connected)
	}
}

// TestSimultaneousDialsResolveAcrossTheWire: both nodes dial each other at once. Node A, whose name sorts
// first, refuses node B's queue pairs with ErrConnectRace; that refusal crosses the wire as itself, so node B
// waits for node A's set instead of failing, and both transfers complete over one set.
func TestSimultaneousDialsResolveAcrossTheWire(t *testing.T) {
	net, a, b := twoRDMAAgents(t)
	// Both dials are in flight at once: node B sends its queue pairs only once node A's dial has begun (its
	// set is pending on node A), and node A sends its own only once it has refused node B's. Without the first
	// gate node B's dial could be accepted before node A's transfer dials at all; that is no race, node A then
	// uses node B's set, and there is nothing to refuse.
	aDialing := make(chan struct{})
	var aDialOnce sync.Once
	a.ex.before = func(ctx context.Context) error {
		aDialOnce.Do(func() { close(aDialing) })
		select {
		case <-a.acc.raced:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("node B's queue pairs never reached node A: %w", ctx.Err())
		}
	}
	b.ex.before = func(ctx context.Context) error {
		select {
		case <-aDialing:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("node A never dialed node B: %w", ctx.Err())
		}
	}
	const size = 256 << 10
	srcA, bufSrcA := a.hostRegion(t, "src", size)
	dstA, bufDstA := a.hostRegion(t, "dst", size)
	srcB, bufSrcB := b.hostRegion(t, "src", size)
	dstB, bufDstB := b.hostRegion(t, "dst", size)
	a.importFrom(t, dstB)
	b.importFrom(t, dstA)

	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = a.move(t, srcA.ID, dstB.ID, size, nil) }()
	go func() { defer wg.Done(); errs[1] = b.move(t, srcB.ID, dstA.ID, size, nil) }()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	if sum(bufDstB) != sum(bufSrcA) || sum(bufDstA) != sum(bufSrcB) {
		t.Fatal("bytes differ after the simultaneous transfers")
	}
	bErrs := b.ex.results()
	if len(bErrs) != 1 || !errors.Is(bErrs[0], rdma.ErrConnectRace) {
		t.Fatalf("node B's exchange returned %v, want one error that is rdma.ErrConnectRace", bErrs)
	}
	if aErrs := a.ex.results(); len(aErrs) != 1 || aErrs[0] != nil {
		t.Fatalf("node A's exchanges returned %v, want one success", aErrs)
	}
	if calls, from, _, errs := a.acc.seen(); calls != 1 || from != "node-b" || !errors.Is(errs[0], rdma.ErrConnectRace) {
		t.Fatalf("node A's engine answered %d exchanges (last from %q) with %v, want node B's refused with rdma.ErrConnectRace",
			calls, from, errs)
	}
	if calls, from, _, errs := b.acc.seen(); calls != 1 || from != "node-a" || errs[0] != nil {
		t.Fatalf("node B's engine answered %d exchanges (last from %q) with %v, want node A's accepted", calls, from, errs)
	}
	if net.Connected != 4 {
		t.Fatalf("%d queue pairs connected, want 4: one set of 2 per side", net.Connected)
	}
}

// TestExchangeWithoutAnRDMAEngineIsUnavailableWithTheReason: an agent that runs no rdma engine answers
// Unavailable, saying so and why; that is a refusal, not a lost peer. An agent that cannot be reached is one.
func TestExchangeWithoutAnRDMAEngineIsUnavailableWithTheReason(t *testing.T) {
	certs := newPoolCerts(t, "infer", "kv")
	na, nb, nc := newNode(t, "node-a", certs), newNode(t, "node-b", certs), newNode(t, "node-c", certs)
	gone := nc.peerLn.Addr().String()
	nc.peerLn.Close()
	nc.dataLn.Close()
	dir := peers.StaticDirectory{"node-a": na.peerLn.Addr().String(), "node-b": nb.peerLn.Addr().String(), "node-c": gone}
	net := fakeverbs.NewNetwork()
	a := startRDMA(t, na, dir, net, false, "")
	startRDMA(t, nb, dir, net, false, "libibverbs did not load: no RDMA verbs library")

	req := rdma.ExchangeRequest{From: "node-a", To: "node-b", FromNIC: "mlx5_0", ToNIC: "mlx5_0",
		QPs: []verbs.ConnInfo{{QPN: 0x100, PSN: 0x700, LID: 1, MTU: 4096}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.peers.ExchangeQPs(ctx, req)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("exchange with an agent without rdma = %v, want Unavailable", err)
	}
	if want := "rdma engine not running on node node-b: libibverbs did not load: no RDMA verbs library"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("exchange with an agent without rdma = %v, want it to say %q", err, want)
	}
	if errors.Is(err, engines.ErrPeerLost) || errors.Is(err, rdma.ErrConnectRace) {
		t.Fatalf("a refusal reported as a lost peer or a race: %v", err)
	}

	req.To = "node-c"
	_, err = a.peers.ExchangeQPs(ctx, req)
	if !errors.Is(err, engines.ErrPeerLost) {
		t.Fatalf("exchange with an unreachable agent = %v, want ErrPeerLost", err)
	}
}

// TestForgedSenderIsRefused: every agent of the pool holds the pool's certificate, so the handshake does not
// say which node calls; a request in the name of a node outside the pool, or of the answering node itself,
// or meant for another node, is refused before the engine sees it.
func TestForgedSenderIsRefused(t *testing.T) {
	_, a, b := twoRDMAAgents(t)
	conn, err := grpc.NewClient("passthrough:///"+b.peerLn.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(a.tls.Config())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := agentv1.NewPeerClient(conn)
	qps := []*agentv1.QPConnInfo{{Qpn: 0x100, Psn: 0x700, Lid: 1, Mtu: 4096}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		req  *agentv1.ExchangeQPsRequest
		code codes.Code
		says string
	}{
		{&agentv1.ExchangeQPsRequest{FromNode: "node-z", ToNode: "node-b", FromNic: "mlx5_0", ToNic: "mlx5_0", Qps: qps},
			codes.PermissionDenied, `node "node-z", which is not a node of pool infer/kv`},
		{&agentv1.ExchangeQPsRequest{FromNode: "node-b", ToNode: "node-b", FromNic: "mlx5_0", ToNic: "mlx5_0", Qps: qps},
			codes.PermissionDenied, "node node-b, which is this node"},
		{&agentv1.ExchangeQPsRequest{FromNode: "", ToNode: "node-b", FromNic: "mlx5_0", ToNic: "mlx5_0", Qps: qps},
			codes.InvalidArgument, "without the sender's node name"},
		{&agentv1.ExchangeQPsRequest{FromNode: "node-a", ToNode: "node-c", FromNic: "mlx5_0", ToNic: "mlx5_0", Qps: qps},
			codes.InvalidArgument, `queue pairs for node "node-c" reached node "node-b"`},
		{&agentv1.ExchangeQPsRequest{FromNode: "node-a", ToNode: "node-b", FromNic: "mlx5_0", ToNic: "mlx5_0",
			Qps: []*agentv1.QPConnInfo{{Qpn: 1, Lid: 1 << 16}}}, codes.InvalidArgument, "LID 65536 exceeds 16 bits"},
		{&agentv1.ExchangeQPsRequest{FromNode: "node-a", ToNode: "node-b", FromNic: strings.Repeat("m", 1<<20), ToNic: "mlx5_0", Qps: qps},
			codes.InvalidArgument, "an RDMA device of 1048576 bytes"},
		{&agentv1.ExchangeQPsRequest{FromNode: "node-a", ToNode: "node-b", FromNic: "mlx5_0", ToNic: "../mlx5_0", Qps: qps},
			codes.InvalidArgument, "an RDMA device of 9 bytes"},
	} {
		_, err := api.ExchangeQPs(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.says) {
			t.Errorf("ExchangeQPs from %q to %q = %v, want %s saying %q", tc.req.FromNode, tc.req.ToNode, err, tc.code, tc.says)
		}
	}
	if calls, _, _, _ := b.acc.seen(); calls != 0 {
		t.Fatalf("node B's engine saw %d refused requests", calls)
	}
}
