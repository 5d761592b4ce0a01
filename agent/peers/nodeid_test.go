// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// nodeTLS writes node's own certificate (signed by ca) as files and loads them; such an agent requires its
// peers to present certificates naming their node.
func nodeTLS(t *testing.T, ca pki.KeyPair, node string) *peers.TLSFiles {
	t.Helper()
	kp, err := pki.IssueNode(ca, "infer", "kv", node, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), node)
	if err := peers.WriteFiles(dir, kp, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	f, err := peers.NewTLSFiles(dir, "infer", "kv")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// growingDirectory is a static directory a test adds nodes to while the peer channel reads it.
type growingDirectory struct {
	mu      sync.Mutex
	nodes   peers.StaticDirectory
	lookups map[string]int // Endpoint calls by node
}

func (d *growingDirectory) add(node, endpoint string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodes[node] = endpoint
}

func (d *growingDirectory) Endpoint(ctx context.Context, node string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lookups == nil {
		d.lookups = map[string]int{}
	}
	d.lookups[node]++
	return d.nodes.Endpoint(ctx, node)
}

func (d *growingDirectory) lookupsOf(node string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lookups[node]
}

func (d *growingDirectory) Nodes(ctx context.Context) (map[string]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nodes.Nodes(ctx)
}

type quietLocal struct {
	mu       sync.Mutex
	notified []string
	// asked and forgot record the layouts looked up (segment, node told) and forgotten (node, segment, asker).
	asked, forgot []string
}

func (l *quietLocal) LookupLayout(segment, _, node string) (*agentv1.LayoutDescriptor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, segment+" by "+node)
	return nil, status.Errorf(codes.NotFound, "no layout segment %q", segment)
}

func (l *quietLocal) ForgetPeerLayout(node, segment, asker string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgot = append(l.forgot, node+" "+segment+" "+asker)
}

func (l *quietLocal) LookupSegment(segment, _ string) ([]byte, error) {
	return []byte("desc:" + segment), nil
}
func (l *quietLocal) IssuedDescriptor(uint64, []byte) ([]byte, error) {
	return nil, status.Error(codes.NotFound, "no region")
}

func (l *quietLocal) DeliverPeerNotification(n engines.Notification) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notified = append(l.notified, n.From)
	return nil
}

// servePeer runs the peer channel of node on tlsFiles until the test ends and returns its endpoint.
func servePeer(t *testing.T, node string, tlsFiles *peers.TLSFiles, dir peers.Directory, local peers.Local) (*peers.Peers, string) {
	t.Helper()
	ln := listen(t)
	p, err := peers.New(peers.Options{Node: node, PoolNamespace: "infer", PoolName: "kv", AgentVersion: "test",
		Listener: ln, TLS: tlsFiles, Directory: dir, Refresh: time.Hour, CallTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, local) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("peer channel did not stop")
		}
	})
	return p, ln.Addr().String()
}

// TestPeerCertificateMustNameItsNode: with per-node certificates, node a's key cannot speak for node c on the
// peer channel (Hello, Notify, ExchangeQPs) nor on the tcp data path, in either direction, and the refusal
// says whose certificate it was; a's key still speaks for a.
func TestPeerCertificateMustNameItsNode(t *testing.T) {
	ca, err := pki.NewCA("infer", "kv", time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	aTLS, bTLS, cTLS := nodeTLS(t, ca, "a"), nodeTLS(t, ca, "b"), nodeTLS(t, ca, "c")
	local := &quietLocal{}
	dir := &growingDirectory{nodes: peers.StaticDirectory{}}
	_, bEP := servePeer(t, "b", bTLS, dir, local)
	dir.add("b", bEP)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("passthrough:///"+bEP, grpc.WithTransportCredentials(credentials.NewTLS(aTLS.Config())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := agentv1.NewPeerClient(conn)
	hello := func(as string) error {
		_, err := api.Hello(ctx, &agentv1.HelloRequest{NodeName: as, PoolNamespace: "infer", PoolName: "kv", ApiVersions: []string{peers.APIVersion}})
		return err
	}
	if err := hello("a"); err != nil {
		t.Fatalf("node a with its own certificate: %v", err)
	}
	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `certificate is node a's, but it speaks as node "c"`) {
			t.Fatalf("%s in node c's name with node a's certificate: want PermissionDenied naming both nodes, got %v", what, err)
		}
	}
	refused("Hello", hello("c"))
	_, err = api.Notify(ctx, &agentv1.PeerNotifyRequest{FromNode: "c", Payload: []byte("forged")})
	refused("Notify", err)
	// Before c is in the directory: the certificate is checked first, and the directory (an API server read in
	// a cluster) is not asked about a name the certificate does not prove.
	_, err = api.ExchangeQPs(ctx, &agentv1.ExchangeQPsRequest{FromNode: "c", ToNode: "b", Qps: []*agentv1.QPConnInfo{{Qpn: 1}}})
	refused("ExchangeQPs in the name of a node outside the directory", err)
	if n := dir.lookupsOf("c"); n != 0 {
		t.Fatalf("the directory was asked %d times about node c, named by a certificate of node a", n)
	}
	dir.add("c", "127.0.0.1:1") // c is a node of the pool: the check that fails is the certificate's
	_, err = api.ExchangeQPs(ctx, &agentv1.ExchangeQPsRequest{FromNode: "c", ToNode: "b", Qps: []*agentv1.QPConnInfo{{Qpn: 1}}})
	refused("ExchangeQPs", err)
	// Saying a layout is gone is the owner's to say, and the node to tell is the one asking: in c's name, nothing
	// is forgotten and nothing recorded.
	_, err = api.ForgetLayout(ctx, &agentv1.PeerForgetLayoutRequest{FromNode: "c", Segment: "kv", RequesterNamespace: "default"})
	refused("ForgetLayout", err)
	_, err = api.ResolveSegment(ctx, &agentv1.PeerResolveSegmentRequest{Segment: "kv", RequesterNamespace: "default", Layout: true, RequesterNode: "c"})
	refused("ResolveSegment of a layout", err)
	if _, err := api.Notify(ctx, &agentv1.PeerNotifyRequest{FromNode: "a", Payload: []byte("ok")}); err != nil {
		t.Fatalf("Notify from a as a: %v", err)
	}
	if _, err := api.ForgetLayout(ctx, &agentv1.PeerForgetLayoutRequest{FromNode: "a", Segment: "kv", RequesterNamespace: "default"}); err != nil {
		t.Fatalf("ForgetLayout from a as a: %v", err)
	}
	_, err = api.ResolveSegment(ctx, &agentv1.PeerResolveSegmentRequest{Segment: "kv", RequesterNamespace: "default", Layout: true, RequesterNode: "a"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("resolving a layout as a: %v, want the local answer (NotFound)", err)
	}
	local.mu.Lock()
	if got := strings.Join(local.notified, ","); got != "a" {
		t.Errorf("notifications delivered from %q, want only a's", got)
	}
	if got := strings.Join(local.forgot, ","); got != "a kv default" {
		t.Errorf("layouts forgotten: %q, want only a's", got)
	}
	if got := strings.Join(local.asked, ","); got != "kv by a" {
		t.Errorf("layouts looked up: %q, want only the one a asked for itself", got)
	}
	local.mu.Unlock()

	// The other direction: an agent at b's endpoint answering as b with c's certificate is not b.
	_, impostorEP := servePeer(t, "b", cTLS, peers.StaticDirectory{}, &quietLocal{})
	aPeers, _ := servePeer(t, "a", aTLS, peers.StaticDirectory{"b": impostorEP}, &quietLocal{})
	_, err = aPeers.ResolveSegment(ctx, "b", "seg", "default")
	if err == nil || !strings.Contains(err.Error(), `certificate is node c's, but it speaks as node "b"`) {
		t.Fatalf("resolving on an impostor of b with c's certificate: want a refusal naming both nodes, got %v", err)
	}
	if got, err := aPeers.ResolveSegment(ctx, "b", "seg", "default"); err == nil {
		t.Fatalf("a second call reached the impostor: %q", got)
	}

	// The tcp data path: a's key claiming c is refused by b's engine, whose log says why; b's engine refuses
	// to talk to an impostor of a.
	var logMu sync.Mutex
	var logs []string
	logf := func(f string, args ...any) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, strings.TrimSpace(strings.ReplaceAll(f, "%v", "")+" "+strings.TrimSpace(fmtArgs(args))))
	}
	bData, err := tcp.New(tcp.Options{Node: "b", Listener: listen(t), TLS: bTLS.Config(), CheckPeer: bTLS.CheckPeer, Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	defer bData.Close()
	forger, err := tcp.New(tcp.Options{Node: "c", TLS: aTLS.Config(), CheckPeer: aTLS.CheckPeer, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	if err := forger.Preconnect(ctx, "b", bData.Addr()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("tcp hello as c with a's certificate: want refused, got %v", err)
	}
	eventuallyLogged(t, &logMu, &logs, `node a's, but it speaks as node "c"`)
	honest, err := tcp.New(tcp.Options{Node: "a", TLS: aTLS.Config(), CheckPeer: aTLS.CheckPeer, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer honest.Close()
	if err := honest.Preconnect(ctx, "b", bData.Addr()); err != nil {
		t.Fatalf("tcp hello as a with a's certificate: %v", err)
	}
	impostor, err := tcp.New(tcp.Options{Node: "b", Listener: listen(t), TLS: cTLS.Config(), CheckPeer: cTLS.CheckPeer})
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	if err := honest.Preconnect(ctx, "b", impostor.Addr()); !errors.Is(err, peers.ErrWrongNode) {
		t.Fatalf("tcp dial of b answered with c's certificate: want ErrWrongNode, got %v", err)
	}
}

func fmtArgs(args []any) string {
	var b strings.Builder
	for _, a := range args {
		if err, ok := a.(error); ok {
			b.WriteString(err.Error())
		} else if s, ok := a.(string); ok {
			b.WriteString(s)
		}
		b.WriteString(" ")
	}
	return b.String()
}

func eventuallyLogged(t *testing.T, mu *sync.Mutex, logs *[]string, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		for _, l := range *logs {
			if strings.Contains(l, want) {
				mu.Unlock()
				return
			}
		}
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("no log line says %q; got %q", want, *logs)
}

// TestSharedCertificateDuringTransition: an agent on its node certificate accepts a peer still on the
// pool-wide certificate of the earlier version until the time the operator wrote into its directory, and
// refuses it after, saying why; the old agent accepts the new one throughout. Before its certificate is
// issued, a node-certificate agent completes no handshake.
func TestSharedCertificateDuringTransition(t *testing.T) {
	now := time.Now()
	ca, _ := pki.NewCA("infer", "kv", now, 24*time.Hour)
	shared, err := pki.IssueAgent(ca, "infer", "kv", now, 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oldDir := filepath.Join(t.TempDir(), "old")
	if err := peers.WriteFiles(oldDir, shared, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	old, err := peers.NewTLSFiles(oldDir, "infer", "kv")
	if err != nil {
		t.Fatal(err)
	}
	newDir := filepath.Join(t.TempDir(), "new")
	if err := os.MkdirAll(newDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(newDir, pki.BundleKey), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	until := now.Add(time.Hour).UTC().Truncate(time.Second)
	if err := os.WriteFile(filepath.Join(newDir, pki.SharedUntilKey), []byte(until.Format(time.RFC3339)), 0o600); err != nil {
		t.Fatal(err)
	}
	var clockMu sync.Mutex
	clock := now
	newTLS, err := peers.NewTLSFilesWith(newDir, "infer", "kv", peers.TLSOptions{NodeCert: true,
		Now: func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return clock }})
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, old.Config(), newTLS.Config()); err == nil || !strings.Contains(err.Error(), "not issued yet") {
		t.Fatalf("handshake before the node certificate was set: want 'not issued yet', got %v", err)
	}
	kp, err := pki.IssueNode(ca, "infer", "kv", "b", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if err := newTLS.SetLeaf(cert); err != nil {
		t.Fatal(err)
	}
	if err := old.SetLeaf(cert); err == nil {
		t.Error("an agent on certificate files took a node certificate in memory")
	}
	for _, dir := range []struct {
		name           string
		server, client *tls.Config
	}{{"old dials new", newTLS.Config(), old.Config()}, {"new dials old", old.Config(), newTLS.Config()}} {
		if err := handshake(t, dir.server, dir.client); err != nil {
			t.Fatalf("%s during the transition: %v", dir.name, err)
		}
	}
	clockMu.Lock()
	clock = until.Add(time.Second)
	clockMu.Unlock()
	if err := handshake(t, newTLS.Config(), old.Config()); err == nil {
		t.Fatal("old dials new after the transition: the pool-wide certificate was accepted")
	}
	// The dialing side's error is its own verification's.
	if err := handshake(t, old.Config(), newTLS.Config()); err == nil || !strings.Contains(err.Error(), "names no node") {
		t.Fatalf("new dials old after the transition: want a refusal saying the certificate names no node, got %v", err)
	}
}
