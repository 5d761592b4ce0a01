// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/pki"
	"github.com/fabricxfer/fabricxfer/topology"
)

func TestFlagsAndValidation(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"--peers=node-b=10.0.0.2:7470,node-c=10.0.0.3:7470", "--socket-dir=relative"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pool") {
		t.Fatalf("no pool: %v", err)
	}
	c.NodeName, c.PoolNamespace, c.PoolName = "node-a", "infer", "kv"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Fatalf("relative socket dir: %v", err)
	}
	c.SocketDir = "/run/fx"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// A gid past 2^31-1 would wrap in a chown or reach (gid_t)-1, which leaves the group as it is.
	for _, gid := range []int{-2, 1 << 31, 1<<32 - 1} {
		c.SocketGID = gid
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--socket-gid") {
			t.Errorf("--socket-gid=%d: %v, want it refused", gid, err)
		}
	}
	for _, gid := range []int{-1, 0, 4242, 1<<31 - 1} {
		c.SocketGID = gid
		if err := c.Validate(); err != nil {
			t.Errorf("--socket-gid=%d refused: %v", gid, err)
		}
	}
	c.SocketGID = -1
	// Staging memory is pinned: a value too small for two slots, or one that would pin the host's memory, is
	// refused before anything is allocated.
	for _, v := range []string{"-1", "4194304", "8388607", "68719476737", "9223372036854775807"} {
		c.TCPStagingBytes = 0
		if err := fs.Set("tcp-staging-bytes", v); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--tcp-staging-bytes") {
			t.Errorf("--tcp-staging-bytes=%s: %v, want it refused", v, err)
		}
	}
	if err := fs.Set("tcp-staging-bytes", "lots"); err == nil {
		t.Error("--tcp-staging-bytes=lots parsed")
	}
	for _, v := range []int64{0, 8 << 20, 1 << 30} {
		c.TCPStagingBytes = v
		if err := c.Validate(); err != nil {
			t.Errorf("--tcp-staging-bytes=%d refused: %v", v, err)
		}
	}
	c.TCPStagingBytes = 0
	for _, v := range []string{"-1", "65", "1000000"} {
		if err := fs.Set("tcp-conns-per-peer", v); err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--tcp-conns-per-peer") {
			t.Errorf("--tcp-conns-per-peer=%s: %v, want it refused", v, err)
		}
	}
	for _, v := range []int{0, 1, 8, 64} {
		c.TCPConnsPerPeer = v
		if err := c.Validate(); err != nil {
			t.Errorf("--tcp-conns-per-peer=%d refused: %v", v, err)
		}
	}
	d, _ := ParsePeers(c.StaticPeers)
	if len(d) != 2 || d["node-c"] != "10.0.0.3:7470" {
		t.Fatalf("peers %v", d)
	}
	if _, err := ParsePeers("node-b"); err == nil {
		t.Fatal("a peer without an address was accepted")
	}
	// Peers without certificates would be ignored (the node runs alone): refused, saying where they come from.
	c.TLSDir = ""
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--tls-dir") || !strings.Contains(err.Error(), "agent certs") {
		t.Errorf("--peers without --tls-dir: %v, want it refused naming --tls-dir and agent certs", err)
	}
	c.StaticPeers = ""
	if err := c.Validate(); err != nil {
		t.Errorf("no peers and no certificates (a node alone) refused: %v", err)
	}
}

func runStack(t *testing.T, cfg Config, deps Deps) (endpoint string) {
	t.Helper()
	return runStackOn(t, cfg, topology.Report{}, deps)
}

// runStackOn serves the transfer side of a node detection reported as rep, until the test ends.
func runStackOn(t *testing.T, cfg Config, rep topology.Report, deps Deps) (endpoint string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	deps.AgentVersion, deps.Ready = "test", func(ep string) { ready <- ep }
	go func() { done <- Serve(ctx, TransferOptions{Config: cfg}, rep, deps) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("stack stopped with %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("stack did not stop")
		}
	})
	select {
	case ep := <-ready:
		return ep
	case err := <-done:
		t.Fatalf("stack ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("stack not ready")
	}
	return ""
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// poolCertDir writes the CA bundle and the pool-wide agent certificate of pool namespace/name into a new
// directory, as the operator's Secret mounts them.
func poolCertDir(t *testing.T, namespace, name string) string {
	t.Helper()
	now := time.Now()
	ca, err := pki.NewCA(namespace, name, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := pki.IssueAgent(ca, namespace, name, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := peers.WriteFiles(dir, agent, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestTwoStacksTalk runs the stack twice, as two agents of one pool outside Kubernetes (static peers, the
// pool's certificates on disk), and moves bytes between them. The reading agent opens its data connections as
// soon as it meets the other one, so the transfer opens none.
func TestTwoStacksTalk(t *testing.T) {
	tlsDir := poolCertDir(t, "infer", "kv")
	base := Config{PoolNamespace: "infer", PoolName: "kv", HostRoot: "/", AllowLocal: true, SocketGID: -1, TLSDir: tlsDir,
		PeerListen: "127.0.0.1:0", DataListen: "127.0.0.1:0", MaxRegions: 16, MaxRegisteredBytes: 1 << 30, MaxInFlight: 16}
	twoStacksTalk(t, base, func(string) Deps { return Deps{} })
}

// TestTwoStacksTalkOnNodeCertificates: the same with each agent on its own node's certificate, obtained at
// start (--node-cert: the directory holds only the bundle); a stack whose certificate cannot be obtained does
// not start, and says why.
func TestTwoStacksTalkOnNodeCertificates(t *testing.T) {
	now := time.Now()
	ca, _ := pki.NewCA("infer", "kv", now, time.Hour)
	tlsDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(tlsDir, pki.BundleKey), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	base := Config{PoolNamespace: "infer", PoolName: "kv", HostRoot: "/", AllowLocal: true, SocketGID: -1, TLSDir: tlsDir,
		NodeCert: true, PeerListen: "127.0.0.1:0", DataListen: "127.0.0.1:0", MaxRegions: 16, MaxRegisteredBytes: 1 << 30, MaxInFlight: 16}
	issue := func(node string) Deps {
		return Deps{NodeCertificate: func(context.Context) (tls.Certificate, error) {
			kp, err := pki.IssueNode(ca, "infer", "kv", node, time.Now(), time.Hour)
			if err != nil {
				return tls.Certificate{}, err
			}
			return tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		}}
	}
	for name, c := range map[string]struct {
		deps Deps
		want string
	}{
		"no way to ask": {Deps{}, "--node-cert needs the Kubernetes API"},
		"request denied": {Deps{NodeCertificate: func(context.Context) (tls.Certificate, error) {
			return tls.Certificate{}, errors.New("denied: not this node")
		}}, "obtaining this node's agent-to-agent certificate: denied: not this node"},
	} {
		cfg := base
		cfg.NodeName, cfg.SocketDir = "node-x", t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := Serve(ctx, TransferOptions{Config: cfg}, topology.Report{}, c.deps)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error saying %q, got %v", name, c.want, err)
		}
	}
	twoStacksTalk(t, base, issue)
}

func twoStacksTalk(t *testing.T, base Config, deps func(node string) Deps) {
	// Ports are known only once A listens, so B is told A's endpoint; A never needs to dial B here.
	a := base
	a.NodeName, a.SocketDir = "node-a", t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dataA := &countingListener{Listener: ln}
	da := deps("node-a")
	da.DataListener = dataA
	epA := runStack(t, a, da)
	b := base
	b.NodeName, b.SocketDir, b.StaticPeers = "node-b", t.TempDir(), "node-a="+epA
	runStack(t, b, deps("node-b"))
	const connsPerPeer = 4 // the tcp engine's default
	for deadline := time.Now().Add(10 * time.Second); dataA.n.Load() < connsPerPeer; {
		if time.Now().After(deadline) {
			t.Fatalf("node-b opened %d data connections to node-a within 10 s of starting, want %d", dataA.n.Load(), connsPerPeer)
		}
		time.Sleep(5 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca1, cb := dialNode(ctx, t, a), dialNode(ctx, t, b)
	ma, _ := client.NewSharedMemory("a", 1<<20)
	mb, _ := client.NewSharedMemory("b", 1<<20)
	defer ma.Close()
	defer mb.Close()
	copy(ma.Bytes, bytes.Repeat([]byte("node-a "), 1<<17))
	if _, err := ca1.RegisterHost(ctx, ma.File, 0, 1<<20, client.Segment("a")); err != nil {
		t.Fatal(err)
	}
	rb, err := cb.RegisterHost(ctx, mb.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Read(ctx, rb, 0, client.ToSegment("node-a", "a"), 0, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ma.Bytes, mb.Bytes) {
		t.Fatal("node B read different bytes from node A")
	}
	if n := dataA.n.Load(); n != connsPerPeer {
		t.Fatalf("node-a accepted %d data connections, want the %d opened ahead of the transfer", n, connsPerPeer)
	}
	blocksAcrossNodes(ctx, t, ca1, cb)
	republishedLayout(ctx, t, filepath.Join(a.SocketDir, "kv", "agent.sock"), cb)
}

// hostLayout registers a layout of two host regions of blocks blocks of bs bytes through c, their bytes a pattern
// of name; the regions' memory closes with the test.
func hostLayout(ctx context.Context, t *testing.T, c *client.Client, name string, bs, blocks uint64, opts ...client.LayoutOption) (*client.Layout, []*client.Region, []*client.SharedMemory) {
	t.Helper()
	var regions []*client.Region
	var mems []*client.SharedMemory
	for k := range 2 {
		m, err := client.NewSharedMemory(name, bs*blocks)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		for i := range m.Bytes {
			m.Bytes[i] = byte(i*7 + k*13 + len(name))
		}
		r, err := c.RegisterHost(ctx, m.File, 0, bs*blocks)
		if err != nil {
			t.Fatal(err)
		}
		regions, mems = append(regions, r), append(mems, m)
	}
	l, err := c.RegisterLayout(ctx, regions, bs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l, regions, mems
}

// republishedLayout: node-a's pod publishes a layout, node-b writes to it (and keeps what it resolved), then the
// pod deregisters it and publishes the same name over new memory, as a restarted pod does; node-b's next write,
// at once, lands in the new memory: the write over what node-b had kept fails at node-a (unknown memory) and is
// asked again of the layout published now.
func republishedLayout(ctx context.Context, t *testing.T, socketA string, cb *client.Client) {
	const bs, blocks = 4096, 16
	ca, err := client.Dial(ctx, socketA)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	la, ra, _ := hostLayout(ctx, t, ca, "kv-old", bs, blocks, client.PublishLayout("kv-r"))
	lb, _, memB := hostLayout(ctx, t, cb, "kv-r-b", bs, blocks)
	remote := client.ToLayoutSegment("node-a", "kv-r")
	if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{0}, remote, []uint32{1}, client.TransferOptions{}); err != nil {
		t.Fatalf("writing to node-a's layout: %v", err)
	}
	resolved := time.Now()
	if err := ca.DeregisterLayout(ctx, la); err != nil {
		t.Fatal(err)
	}
	for _, r := range ra {
		if err := ca.Deregister(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	lNew, rNew, memNew := hostLayout(ctx, t, ca, "kv-new", bs, blocks, client.PublishLayout("kv-r"))
	st, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{2}, remote, []uint32{3}, client.TransferOptions{})
	if err != nil {
		t.Fatalf("writing to node-a's layout published again %v after node-b resolved it: %v", time.Since(resolved), err)
	}
	for k := range 2 {
		if !bytes.Equal(memNew[k].Bytes[3*bs:4*bs], memB[k].Bytes[2*bs:3*bs]) {
			t.Fatalf("region %d: the block written after the layout was published again is not in its new memory (status %v)", k, st)
		}
	}
	// Gone without a successor: the read over what node-b kept fails, and so does asking again; the error says
	// the memory is not there, and nothing of node-b's changed.
	if err := ca.DeregisterLayout(ctx, lNew); err != nil {
		t.Fatal(err)
	}
	for _, r := range rNew {
		if err := ca.Deregister(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	before := [][]byte{bytes.Clone(memB[0].Bytes), bytes.Clone(memB[1].Bytes)}
	_, err = cb.TransferBlocks(ctx, client.Read, lb, []uint32{5}, remote, []uint32{6}, client.TransferOptions{})
	if err == nil || !strings.Contains(err.Error(), "unknown or deregistered memory") {
		t.Fatalf("reading node-a's layout after it was deregistered: %v, want it failed on unknown memory", err)
	}
	for k := range 2 {
		if !bytes.Equal(memB[k].Bytes, before[k]) {
			t.Fatalf("a failed read from a deregistered layout changed node-b's region %d", k)
		}
	}
}

// blocksAcrossNodes: node B reads and writes blocks of a layout node A published, by segment, every byte
// checked; refused ids move nothing, and an unknown layout or a layout id of another node are refused.
func blocksAcrossNodes(ctx context.Context, t *testing.T, ca, cb *client.Client) {
	const bs, blocks = 4096, 64
	layout := func(c *client.Client, name string, opts ...client.LayoutOption) (*client.Layout, []*client.SharedMemory) {
		l, _, mems := hostLayout(ctx, t, c, name, bs, blocks, opts...)
		return l, mems
	}
	_, memA := layout(ca, "kv-a", client.PublishLayout("kv-a"))
	lb, memB := layout(cb, "kv-b")
	remote := client.ToLayoutSegment("node-a", "kv-a")
	block := func(m *client.SharedMemory, i uint32) []byte { return m.Bytes[uint64(i)*bs:][:bs] }

	local, far := []uint32{0, 5, 63}, []uint32{9, 1, 40}
	if _, err := cb.TransferBlocks(ctx, client.Read, lb, local, remote, far, client.TransferOptions{}); err != nil {
		t.Fatalf("reading blocks of node-a's layout: %v", err)
	}
	for k := range 2 {
		for i := range local {
			if !bytes.Equal(block(memB[k], local[i]), block(memA[k], far[i])) {
				t.Fatalf("region %d: block %d read from node-a's block %d differs", k, local[i], far[i])
			}
		}
	}
	if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{2, 3}, remote, []uint32{60, 61}, client.TransferOptions{}); err != nil {
		t.Fatalf("writing blocks to node-a's layout: %v", err)
	}
	for k := range 2 {
		if !bytes.Equal(block(memA[k], 60), block(memB[k], 2)) || !bytes.Equal(block(memA[k], 61), block(memB[k], 3)) {
			t.Fatalf("region %d: blocks written to node-a differ", k)
		}
	}
	before := [][]byte{bytes.Clone(memA[0].Bytes), bytes.Clone(memA[1].Bytes)}
	for name, c := range map[string]struct {
		to       client.RemoteLayout
		ids, far []uint32
		want     string
	}{
		"an id past node-a's layout": {remote, []uint32{0}, []uint32{blocks}, "InvalidArgument"},
		"a repeated destination id":  {remote, []uint32{0, 1}, []uint32{7, 7}, "InvalidArgument"},
		"an unknown layout segment":  {client.ToLayoutSegment("node-a", "nope"), []uint32{0}, []uint32{0}, "NotFound"},
	} {
		_, err := cb.TransferBlocks(ctx, client.Write, lb, c.ids, c.to, c.far, client.TransferOptions{})
		if client.Code(err).String() != c.want {
			t.Errorf("%s: %v, want %s", name, err, c.want)
		}
	}
	_, err := cb.API().TransferBlocks(ctx, &agentv1.TransferBlocksRequest{Op: agentv1.Op_OP_WRITE, LayoutId: lb.ID(), IdBytes: 4,
		LocalIds: make([]byte, 4), RemoteIds: make([]byte, 4), Wait: true,
		Remote: &agentv1.LayoutRef{Node: "node-a", Target: &agentv1.LayoutRef_LayoutId{LayoutId: lb.ID()}}})
	if client.Code(err).String() != "InvalidArgument" {
		t.Errorf("a layout id of another node: %v, want InvalidArgument", err)
	}
	for k := range 2 {
		if !bytes.Equal(memA[k].Bytes, before[k]) {
			t.Fatalf("a refused block transfer changed region %d on node-a", k)
		}
	}
}
