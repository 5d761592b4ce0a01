// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/internal/pki"
	"google.golang.org/protobuf/proto"
)

// poolCerts are the pool's certificates as the operator issues them: one CA, one agent key pair every agent of
// the pool mounts.
type poolCerts struct {
	ca    pki.KeyPair
	agent pki.KeyPair
}

func newPoolCerts(t *testing.T, ns, name string) poolCerts {
	t.Helper()
	now := time.Now()
	ca, err := pki.NewCA(ns, name, now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.IssueAgent(ca, ns, name, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return poolCerts{ca: ca, agent: agent}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// node is one agent: its own host root (socket dir, certificate dir), engines, peer channel and socket server.
type node struct {
	name    string
	root    string
	srv     *server.Server
	peers   *peers.Peers
	peerLn  net.Listener
	dataLn  net.Listener
	tls     *peers.TLSFiles
	stopped chan struct{}
	// handshake, when set, is the peer listener's handshake timeout; callLimit its ServeCallLimit.
	handshake, callLimit time.Duration
}

func newNode(t *testing.T, name string, certs poolCerts) *node {
	t.Helper()
	n := &node{name: name, root: t.TempDir(), peerLn: listen(t), dataLn: listen(t), stopped: make(chan struct{})}
	certDir := filepath.Join(n.root, "etc", "fabricxfer", "tls")
	if err := peers.WriteFiles(certDir, certs.agent, certs.ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	var err error
	if n.tls, err = peers.NewTLSFiles(certDir, "infer", "kv"); err != nil {
		t.Fatal(err)
	}
	return n
}

// start wires the node the way the agent does and serves until the test ends.
func (n *node) start(t *testing.T, dir peers.Directory) {
	t.Helper()
	x, err := xgmi.New(xgmi.Options{Node: n.name}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	te, err := tcp.New(tcp.Options{Node: n.name, Listener: n.dataLn, TLS: n.tls.Config(), ChunkBytes: 256 << 10,
		PeerTimeout: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: n.name}, x, te)
	if err != nil {
		t.Fatal(err)
	}
	n.peers, err = peers.New(peers.Options{Node: n.name, PoolNamespace: "infer", PoolName: "kv", AgentVersion: "test",
		Listener: n.peerLn, TLS: n.tls, Directory: dir, Refresh: 100 * time.Millisecond, HandshakeTimeout: n.handshake, ServeCallLimit: n.callLimit})
	if err != nil {
		t.Fatal(err)
	}
	proc := filepath.Join(n.root, "proc", strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(proc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "cgroup"), []byte("0::/user.slice\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.srv, err = server.New(server.Options{SocketDir: filepath.Join(n.root, "run", "fabricxfer"), PoolNamespace: "infer",
		PoolName: "kv", NodeName: n.name, AgentVersion: "test", PeerEndpoint: n.peerLn.Addr().String(),
		Engine: comp, Peers: n.peers, SocketGID: -1,
		Identifier: identity.Identifier{ProcRoot: filepath.Join(n.root, "proc"), AllowLocal: true}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	peersDone, srvDone := make(chan error, 1), make(chan error, 1)
	go func() { peersDone <- n.peers.Serve(ctx, n.srv) }()
	go func() { srvDone <- n.srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		for _, ch := range []chan error{srvDone, peersDone} {
			select {
			case err := <-ch:
				if err != nil {
					t.Errorf("%s stopped with %v", n.name, err)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("%s did not stop", n.name)
			}
		}
		comp.Close()
	})
	waitFor(t, func() bool { _, err := os.Stat(n.srv.FDSocketPath()); return err == nil }, "socket of "+n.name)
}

func waitFor(t *testing.T, ok func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within 5 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func dialNode(t *testing.T, n *node) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// describedMemory decodes a region's descriptor and the engines' description of its memory inside it.
func describedMemory(t *testing.T, desc []byte) (*agentv1.SegmentDescriptor, engines.MemoryDesc) {
	t.Helper()
	var sd agentv1.SegmentDescriptor
	if err := proto.Unmarshal(desc, &sd); err != nil {
		t.Fatal(err)
	}
	md, err := engines.UnmarshalDesc(sd.Memory)
	if err != nil {
		t.Fatal(err)
	}
	return &sd, md
}

func randomShm(t *testing.T, size uint64) *client.SharedMemory {
	t.Helper()
	m, err := client.NewSharedMemory("kv", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if _, err := rand.Read(m.Bytes); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTwoAgentsMoveHostMemoryBothWaysOverMutualTLS runs two agents on two fixture roots, talking over TCP with
// the pool's certificates: clients on each node register host memory and move it both ways through the tcp
// engine, by segment name and by descriptor, with a notification on the receiving side.
func TestTwoAgentsMoveHostMemoryBothWaysOverMutualTLS(t *testing.T) {
	a, b := startTwoNodes(t)
	moveBothWays(t, a, b)
}

// startTwoNodes starts node-a and node-b of pool infer/kv, which find each other in a static directory, and
// waits until each is connected to the other; tune, when given, sets their options first.
func startTwoNodes(t *testing.T, tune ...func(a, b *node)) (a, b *node) {
	t.Helper()
	certs := newPoolCerts(t, "infer", "kv")
	a, b = newNode(t, "node-a", certs), newNode(t, "node-b", certs)
	for _, f := range tune {
		f(a, b)
	}
	dir := peers.StaticDirectory{"node-a": a.peerLn.Addr().String(), "node-b": b.peerLn.Addr().String()}
	a.start(t, dir)
	b.start(t, dir)
	waitFor(t, func() bool { return len(a.peers.Connected()) == 1 && len(b.peers.Connected()) == 1 }, "pre-connected peers")
	return a, b
}

// TestTwoAgentsFindEachOtherThroughTransferNodes is the same exchange with peers found the way they are in a
// cluster: through TransferNode .status.endpoint in the API server.
func TestTwoAgentsFindEachOtherThroughTransferNodes(t *testing.T) {
	kube := startAPIServer(t)
	certs := newPoolCerts(t, "infer", "kv")
	a, b := newNode(t, "node-a", certs), newNode(t, "node-b", certs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addTransferNode(ctx, t, kube, "node-a", "kv", a.peerLn.Addr().String())
	addTransferNode(ctx, t, kube, "node-b", "kv", b.peerLn.Addr().String())
	dir := &peers.APIDirectory{Reader: kube, PoolNamespace: "infer", PoolName: "kv"}
	a.start(t, dir)
	b.start(t, dir)
	moveBothWays(t, a, b)
}

func moveBothWays(t *testing.T, a, b *node) {
	t.Helper()
	waitFor(t, func() bool { return len(a.peers.Connected()) == 1 && len(b.peers.Connected()) == 1 }, "pre-connected peers")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca, cb := dialNode(t, a), dialNode(t, b)
	const size, half = 4 << 20, 2 << 20
	memA, memB := randomShm(t, size), randomShm(t, size)
	origA, origB := bytes.Clone(memA.Bytes), bytes.Clone(memB.Bytes)
	ra, err := ca.RegisterHost(ctx, memA.File, 0, size, client.Segment("kv-a"))
	if err != nil {
		t.Fatal(err)
	}
	rb, err := cb.RegisterHost(ctx, memB.File, 0, size, client.Segment("kv-b"))
	if err != nil {
		t.Fatal(err)
	}
	notes, _, err := cb.Notifications(ctx, rb)
	if err != nil {
		t.Fatal(err)
	}

	// A -> B: node A's client writes the first half of its memory into node B's segment, in 64 KiB items.
	var items []client.Item
	for off := uint64(0); off < half; off += 64 << 10 {
		items = append(items, client.Item{Local: ra, LocalOffset: off, Remote: client.ToSegment("node-b", "kv-b"),
			RemoteOffset: off, Length: 64 << 10, Tag: "blk-" + strconv.FormatUint(off>>16, 10)})
	}
	tr, err := ca.Submit(ctx, client.Write, items, client.TransferOptions{Timeout: 20 * time.Second, Notify: []byte("first half landed")})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Engines) == 0 || tr.Engines[0] != engines.EngineTCP {
		t.Fatalf("engines %v, want tcp for host memory on two nodes", tr.Engines)
	}
	if _, err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notes:
		if string(n.Payload) != "first half landed" || n.SourceNode != "node-a" || n.RegionId != rb.ID() {
			t.Fatalf("notification on node B: %v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node B's client got no notification")
	}

	// The peer channel carries notifications for engines without a wire of their own (fabric copies).
	_, md := describedMemory(t, rb.Descriptor())
	if err := a.peers.SendNotification(ctx, "node-b", engines.Notification{From: "node-a", Regions: []engines.MemoryID{md.ID},
		Payload: []byte("via the peer channel")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notes:
		if string(n.Payload) != "via the peer channel" || n.RegionId != rb.ID() {
			t.Fatalf("peer-channel notification on node B: %v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node B's client got no peer-channel notification")
	}
	if err := a.peers.SendNotification(ctx, "node-b", engines.Notification{From: "node-a", Regions: []engines.MemoryID{"node-b/unknown"}}); err == nil {
		t.Fatal("a notification for memory node B does not have was accepted")
	}

	// B -> A: node B's client writes the second half of its memory into node A's region, named by the
	// descriptor it resolved.
	descA, err := cb.ResolveSegment(ctx, "node-a", "kv-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Do(ctx, client.Write, []client.Item{{Local: rb, LocalOffset: half, Remote: client.ToDescriptor(descA),
		RemoteOffset: half, Length: half}}, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	wantB := append(bytes.Clone(origA[:half]), origB[half:]...)
	wantA := append(bytes.Clone(origA[:half]), origB[half:]...)
	if sha256.Sum256(memB.Bytes) != sha256.Sum256(wantB) {
		t.Fatal("node B's memory checksum differs after A wrote the first half")
	}
	if sha256.Sum256(memA.Bytes) != sha256.Sum256(wantA) {
		t.Fatal("node A's memory checksum differs after B wrote the second half")
	}

	// A reads back from B (pull) into a fresh region and compares.
	back := randomShm(t, size)
	rback, err := ca.RegisterHost(ctx, back.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Read(ctx, rback, 0, client.ToSegment("node-b", "kv-b"), 0, size); err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(back.Bytes) != sha256.Sum256(memB.Bytes) {
		t.Fatal("reading node B's memory back gave different bytes")
	}

	// Explain says why the pair goes over tcp.
	ex, err := ca.API().Explain(ctx, &agentv1.ExplainRequest{
		Source:      &agentv1.Endpoint{Target: &agentv1.Endpoint_RegionId{RegionId: ra.ID()}},
		Destination: &agentv1.Endpoint{Node: "node-b", Target: &agentv1.Endpoint_Segment{Segment: "kv-b"}}})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Engine != engines.EngineTCP || len(ex.Verdicts) < 2 || ex.Verdicts[0].Engine != engines.EngineXGMI || ex.Verdicts[0].CanHandle {
		t.Fatalf("explain: %v", ex)
	}

	// A segment that does not exist on the peer is a clear NotFound, and so is a node the pool does not have (a
	// mistyped name: Unavailable would be retried for ever).
	if _, err := ca.ResolveSegment(ctx, "node-b", "nope"); client.Code(err).String() != "NotFound" {
		t.Fatalf("resolving a missing segment: %v", err)
	}
	if _, err := ca.Read(ctx, rback, 0, client.ToSegment("node-bb", "kv-b"), 0, 4096); client.Code(err).String() != "NotFound" || !strings.Contains(err.Error(), "node-bb") {
		t.Fatalf("reading from a node the pool does not have: %v, want NotFound naming it", err)
	}
}

// TestAgentOfAnotherPoolIsRefused: a peer whose certificate was issued by another pool's CA cannot resolve
// segments (mTLS fails), even when it claims the right pool.
func TestAgentOfAnotherPoolIsRefused(t *testing.T) {
	good := newPoolCerts(t, "infer", "kv")
	a := newNode(t, "node-a", good)
	intruderCerts := newPoolCerts(t, "infer", "kv") // same names, different CA
	x := newNode(t, "node-x", intruderCerts)
	dir := peers.StaticDirectory{"node-a": a.peerLn.Addr().String(), "node-x": x.peerLn.Addr().String()}
	a.start(t, dir)
	x.start(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ca := dialNode(t, a)
	m := randomShm(t, 4096)
	if _, err := ca.RegisterHost(ctx, m.File, 0, 4096, client.Segment("secret")); err != nil {
		t.Fatal(err)
	}
	_, err := x.peers.ResolveSegment(ctx, "node-a", "secret", "")
	if err == nil {
		t.Fatal("an agent with another pool's CA resolved a segment")
	}
	if !strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
		t.Errorf("refusal does not say it is about certificates: %v", err)
	}
}

// TestUnauthenticatedPeerConnectionsAreClosed: a TCP connection to the peer port that never completes the TLS
// handshake is closed after the handshake timeout, and the agent keeps serving its peers.
func TestUnauthenticatedPeerConnectionsAreClosed(t *testing.T) {
	a, b := startTwoNodes(t, func(a, _ *node) { a.handshake = 300 * time.Millisecond })
	idle, err := net.Dial("tcp", a.peerLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := idle.Read(make([]byte, 1)); err == nil {
		t.Fatal("the agent wrote to a connection that sent nothing")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a connection that never handshook is still open after %s", time.Since(start))
	}
	if held := time.Since(start); held > 3*time.Second {
		t.Fatalf("held %s, want about the 300 ms handshake timeout", held)
	}
	moveBothWays(t, a, b)
}
