// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodecert"
	"github.com/fabricxfer/fabricxfer/agent/peers"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

func requester(c client.Client, pool *fxv1.TransferPool, node string) *nodecert.Requester {
	return &nodecert.Requester{Client: c, PoolNamespace: pool.Namespace, PoolName: pool.Name, Node: node,
		Timeout: settle, Poll: 50 * time.Millisecond}
}

// poolCA reads the pool's CA certificate as the operator keeps it.
func poolCA(t *testing.T, c client.Client, pool *fxv1.TransferPool) *x509.Certificate {
	t.Helper()
	s := &corev1.Secret{}
	eventually(t, settle, "the pool's CA", func() error {
		return c.Get(context.Background(), client.ObjectKey{Namespace: testAgentNamespace, Name: tlsSecretName(pool) + "-ca"}, s)
	})
	certs, err := pki.ParseCertificates(s.Data[pki.CertKey])
	if err != nil || len(certs) == 0 {
		t.Fatalf("reading the pool's CA: %v", err)
	}
	return certs[0]
}

// TestNodeCertificatePerNode: each agent, with its own pod-bound token, gets a certificate naming its node,
// signed by its pool's CA, for a key that never left it; the agents' Secret holds the bundle and no key, the
// DaemonSet asks agents for --node-cert, and no agent token reads any certificate Secret.
func TestNodeCertificatePerNode(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "nodecert", 2)
	pool := newPool(t, c, ns, "kv", "nodecert")
	other := newPool(t, c, newNamespace(t, c), "kv", "nodecert-other")
	ca := poolCA(t, c, pool)
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	var keys [][]byte
	for _, node := range nodes {
		ac := agentClient(t, c, pool, node)
		cert, err := requester(ac, pool, node).Request(ctx)
		if err != nil {
			t.Fatalf("node %s asking for its certificate: %v", node, err)
		}
		if got := pki.NodeOf(cert.Leaf); got != node {
			t.Errorf("node %s got a certificate naming %q", node, got)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: pki.PoolServerName(pool.Namespace, pool.Name),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("node %s's certificate does not chain to its pool's CA: %v", node, err)
		}
		if life := time.Until(cert.Leaf.NotAfter); life > NodeCertValidity || life < NodeCertValidity-time.Hour {
			t.Errorf("node %s's certificate lives %s, want about %s", node, life, NodeCertValidity)
		}
		keys = append(keys, cert.Leaf.RawSubjectPublicKeyInfo)
		// The agent's token reads no certificate Secret: not its pool's bundle or CA, not another pool's.
		for _, name := range []string{tlsSecretName(pool), tlsSecretName(pool) + "-ca", tlsSecretName(other)} {
			err := ac.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: name}, &corev1.Secret{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("agent of node %s reading Secret %s: want Forbidden, got %v", node, name, err)
			}
		}
	}
	if slices.Equal(keys[0], keys[1]) {
		t.Error("two nodes share one key")
	}
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: tlsSecretName(pool)}, s); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Data[pki.KeyKey]; ok || len(s.Data[pki.BundleKey]) == 0 {
		t.Errorf("the agents' Secret holds %v, want only the bundle", slices.Sorted(mapKeys(s.Data)))
	}
	ds := &appsv1.DaemonSet{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: agentName(pool)}, ds); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--node-cert") {
		t.Errorf("agent arguments %q lack --node-cert", ds.Spec.Template.Spec.Containers[0].Args)
	}
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// csrAs creates a request with c and returns it once the operator answered it (or the deadline passed).
func csrAs(t *testing.T, c client.Client, pool *fxv1.TransferPool, csrPEM []byte, signer string) (*certificatesv1.CertificateSigningRequest, error) {
	t.Helper()
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "fabricxfer-test-",
			Labels: map[string]string{fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: pool.Namespace}},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: signer,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
	}
	if err := c.Create(context.Background(), csr); err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = testCluster.client.Delete(context.Background(), csr) })
	eventually(t, settle, "the operator's answer to "+csr.Name, func() error {
		if err := testCluster.client.Get(context.Background(), client.ObjectKeyFromObject(csr), csr); err != nil {
			return err
		}
		if answered, _ := answeredAt(csr); !answered {
			return errNotYet
		}
		return nil
	})
	return csr, nil
}

var errNotYet = apierrors.NewServiceUnavailable("not answered yet")

func denial(csr *certificatesv1.CertificateSigningRequest) string {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied {
			return c.Message
		}
	}
	return ""
}

// TestNodeCertificateRefusals: a node's token asking for another node's certificate, a pool's agents asking
// in another pool's name, a token bound to no node, and a node the pool does not select are denied with the
// reason and get no certificate; an agent asking another signer is refused at admission.
func TestNodeCertificateRefusals(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "nodecert-deny", 2)
	outsider := newNodes(t, c, "nodecert-outsider", 1)[0]
	pool := newPool(t, c, ns, "kv", "nodecert-deny")
	other := newPool(t, c, newNamespace(t, c), "kv", "nodecert-deny-other")
	poolCA(t, c, pool)
	a := agentClient(t, c, pool, nodes[0])

	forB, _, err := pki.NewNodeRequest(pool.Namespace, pool.Name, nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	forA, _, err := pki.NewNodeRequest(pool.Namespace, pool.Name, nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, csr *certificatesv1.CertificateSigningRequest, err error, want string) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: creating the request: %v", what, err)
		}
		if len(csr.Status.Certificate) != 0 || !strings.Contains(denial(csr), want) {
			t.Errorf("%s: want a denial saying %q and no certificate, got conditions %+v, %d certificate bytes", what, want,
				csr.Status.Conditions, len(csr.Status.Certificate))
		}
	}
	csr, err := csrAs(t, a, pool, forB, pki.SignerName)
	check("node a's token asking for node b's certificate", csr, err, `names node "`+nodes[1]+`" in its subject, but comes from node `+nodes[0])

	// Labels naming another pool: the token is not that pool's agents'.
	csr, err = csrAs(t, a, other, forA, pki.SignerName)
	check("agents of one pool asking in another pool's name", csr, err, "not by the agents of pool")

	// The admin is not the pool's agents.
	csr, err = csrAs(t, c, pool, forA, pki.SignerName)
	check("the admin's credentials", csr, err, `requested by "admin", not by the agents of pool`)

	// The agents' own ServiceAccount with a token bound to no pod names no node: refused at admission.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNamespace, Name: agentName(pool)}}
	tr := &authenticationv1.TokenRequest{}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("requesting an unbound agent token: %v", err)
	}
	cfg := rest.AnonymousClientConfig(testCluster.cfg)
	cfg.BearerToken = tr.Status.Token
	unbound, err := client.New(cfg, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := csrAs(t, unbound, pool, forA, pki.SignerName); err == nil || !strings.Contains(err.Error(), "must be bound to its pod on a node") {
		t.Errorf("an agent token bound to no node: want refused at admission, got %v", err)
	}

	// A node the pool does not select (an agent pod there would be a stray).
	forOutsider, _, _ := pki.NewNodeRequest(pool.Namespace, pool.Name, outsider)
	csr, err = csrAs(t, agentClient(t, c, pool, outsider), pool, forOutsider, pki.SignerName)
	check("a node the pool does not select", csr, err, "does not select node "+outsider)

	// Garbage in the request: refused by the API server or denied, never signed.
	garbage := []byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")
	if csr, err := csrAs(t, a, pool, garbage, pki.SignerName); err == nil && len(csr.Status.Certificate) != 0 {
		t.Error("a garbage request was signed")
	}

	// Another signer: the admission policy refuses it before anybody could approve it.
	_, err = csrAs(t, a, pool, forA, "kubernetes.io/kube-apiserver-client")
	if err == nil || !strings.Contains(err.Error(), "may ask only the operator") {
		t.Errorf("an agent asking the API server's client signer: want refused at admission, got %v", err)
	}

	// And node a's own request still works after all that.
	if _, err := requester(a, pool, nodes[0]).Request(ctx); err != nil {
		t.Errorf("node a's own request: %v", err)
	}
}

// TestNodeLeavingRemovesItsCertificate: once a node leaves the pool (its labels no longer match) the request
// holding its certificate is deleted; a deleted pool's requests go too.
func TestNodeLeavingRemovesItsCertificate(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "nodecert-leave", 2)
	pool := newPool(t, c, ns, "kv", "nodecert-leave")
	poolCA(t, c, pool)
	for _, node := range nodes {
		if _, err := requester(agentClient(t, c, pool, node), pool, node).Request(ctx); err != nil {
			t.Fatalf("node %s: %v", node, err)
		}
	}
	list := func() map[string]string {
		l := &certificatesv1.CertificateSigningRequestList{}
		if err := c.List(ctx, l, client.MatchingLabels{fxv1.LabelPoolName: pool.Name, fxv1.LabelPoolNamespace: pool.Namespace}); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, r := range l.Items {
			out[r.Spec.Extra[nodeNameExtra][0]] = r.Name
		}
		return out
	}
	names := list()
	if len(names) != 2 {
		t.Fatalf("requests by node: %v, want one for each of %v", names, nodes)
	}
	n := &corev1.Node{}
	if err := c.Get(ctx, client.ObjectKey{Name: nodes[0]}, n); err != nil {
		t.Fatal(err)
	}
	n.Labels["fabricxfer.io/test-group"] = "elsewhere"
	if err := c.Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "the certificate of the node that left is removed", func() error {
		got := list()
		if _, ok := got[nodes[0]]; ok {
			return apierrors.NewConflict(certificatesv1.Resource("certificatesigningrequests"), names[nodes[0]], errNotYet)
		}
		if _, ok := got[nodes[1]]; !ok {
			t.Fatalf("the certificate of node %s, which stayed, was removed too", nodes[1])
		}
		return nil
	})
	if err := c.Delete(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "the deleted pool's certificates are removed", func() error {
		if got := list(); len(got) != 0 {
			return apierrors.NewConflict(certificatesv1.Resource("certificatesigningrequests"), "remaining", errNotYet)
		}
		return nil
	})
}

// TestSharedKeyMigration: a pool the earlier version set up (one CA, one pool-wide key pair in the agents'
// Secret, written by the operator's field manager) moves to per-node certificates: the key leaves the Secret,
// the CA stays, the Secret says until when the old certificate is accepted, and an old agent (still holding
// the pool-wide key) and a new one (its node certificate, the migrated Secret) complete a handshake both ways.
func TestSharedKeyMigration(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "nodecert-migrate", 1)
	name := AgentObjectName(ns, "kv")
	now := time.Now()
	ca, err := pki.NewCA(ns, "kv", now, 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	shared, err := pki.IssueAgent(ca, ns, "kv", now, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app.kubernetes.io/name": "fabricxfer-agent", "app.kubernetes.io/instance": "kv",
		"app.kubernetes.io/managed-by": managedBy, fxv1.LabelPoolName: "kv", fxv1.LabelPoolNamespace: ns}
	for secret, data := range map[string]map[string][]byte{
		name + "-tls-ca": {pki.CertKey: ca.CertPEM, pki.CAKeyKey: ca.KeyPEM, pki.BundleKey: ca.CertPEM},
		name + "-tls":    {pki.CertKey: shared.CertPEM, pki.KeyKey: shared.KeyPEM, pki.BundleKey: ca.CertPEM},
	} {
		ac := corev1ac.Secret(secret, testAgentNamespace).WithLabels(labels).WithType(corev1.SecretTypeOpaque).WithData(data)
		if err := c.Apply(ctx, ac, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			t.Fatalf("writing the earlier version's Secret %s: %v", secret, err)
		}
	}
	pool := newPool(t, c, ns, "kv", "nodecert-migrate")
	s := &corev1.Secret{}
	eventually(t, settle, "the pool-wide key removed from the agents' Secret", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: name + "-tls"}, s); err != nil {
			return err
		}
		if _, ok := s.Data[pki.KeyKey]; ok {
			return errNotYet
		}
		return nil
	})
	if got := string(s.Data[pki.BundleKey]); got != string(ca.CertPEM) {
		t.Errorf("the bundle changed in the migration:\n%s", got)
	}
	until, err := time.Parse(time.RFC3339, string(s.Data[pki.SharedUntilKey]))
	if err != nil {
		t.Fatalf("the migrated Secret's %s: %v", pki.SharedUntilKey, err)
	}
	if d := until.Sub(now); d < 23*time.Hour || d > 25*time.Hour {
		t.Errorf("the pool-wide certificate is accepted until %s, %s from now; want a day", until, d)
	}
	caSecret := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: name + "-tls-ca"}, caSecret); err != nil {
		t.Fatal(err)
	}
	if string(caSecret.Data[pki.CertKey]) != string(ca.CertPEM) {
		t.Error("the migration replaced the pool's CA; old and new agents would not trust each other")
	}

	// A new agent: the migrated Secret as the kubelet mounts it, its own certificate from the operator.
	dir := t.TempDir()
	for k, v := range s.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	newTLS, err := peers.NewTLSFilesWith(dir, ns, "kv", peers.TLSOptions{NodeCert: true})
	if err != nil {
		t.Fatalf("a new agent loading the migrated Secret: %v", err)
	}
	cert, err := requester(agentClient(t, c, pool, nodes[0]), pool, nodes[0]).Request(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := newTLS.SetLeaf(cert); err != nil {
		t.Fatal(err)
	}
	oldDir := t.TempDir()
	if err := peers.WriteFiles(oldDir, shared, ca.CertPEM); err != nil {
		t.Fatal(err)
	}
	oldTLS, err := peers.NewTLSFiles(oldDir, ns, "kv")
	if err != nil {
		t.Fatal(err)
	}
	if err := tlsHandshake(newTLS.Config(), oldTLS.Config()); err != nil {
		t.Errorf("old agent dialing a new one during the transition: %v", err)
	}
	if err := tlsHandshake(oldTLS.Config(), newTLS.Config()); err != nil {
		t.Errorf("new agent dialing an old one during the transition: %v", err)
	}
	// Once the transition is over, the new agent refuses the pool-wide certificate.
	late, _ := peers.NewTLSFilesWith(dir, ns, "kv", peers.TLSOptions{NodeCert: true, Now: func() time.Time { return until.Add(time.Minute) }})
	_ = late.SetLeaf(cert)
	if err := tlsHandshake(oldTLS.Config(), late.Config()); err == nil || !strings.Contains(err.Error(), "names no node") {
		t.Errorf("new agent dialing an old one after the transition: want a refusal, got %v", err)
	}
}

// tlsHandshake runs both ends of a handshake over loopback TCP and returns the dialing side's error, or the
// serving side's.
func tlsHandshake(server, clientCfg *tls.Config) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		tc := tls.Server(conn, server)
		err = tc.Handshake()
		if err == nil {
			// TLS 1.3 clients finish before the server checked their certificate: read once to see its verdict.
			_, _ = tc.Write([]byte{1})
		}
		errc <- err
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), clientCfg)
	if err != nil {
		<-errc
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, rerr := conn.Read(make([]byte, 1))
	if serr := <-errc; serr != nil {
		return serr
	}
	return rerr
}

// TestNodeCertificateRenewal: the agent's renewal loop asks for a new certificate once its current one is
// two thirds through its life, and presents the new one.
func TestNodeCertificateRenewal(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	nodes := newNodes(t, c, "nodecert-renew", 1)
	pool := newPool(t, c, ns, "kv", "nodecert-renew")
	poolCA(t, c, pool)
	req := requester(agentClient(t, c, pool, nodes[0]), pool, nodes[0])
	first, err := req.Request(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	leaf := &ageingLeaf{}
	leaf.set(first, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		nodecert.Keep(ctx, leaf, req.Request, slog.New(slog.DiscardHandler))
	}()
	defer func() { cancel(); <-done }()
	eventually(t, settle, "a renewed certificate", func() error {
		if cur := leaf.Leaf(); cur.SerialNumber.Cmp(first.Leaf.SerialNumber) == 0 {
			return errNotYet
		}
		return nil
	})
	cur := leaf.Leaf()
	if pki.NodeOf(cur) != nodes[0] || string(cur.RawSubjectPublicKeyInfo) == string(first.Leaf.RawSubjectPublicKeyInfo) {
		t.Errorf("renewed certificate names %q; new key: %v", pki.NodeOf(cur), string(cur.RawSubjectPublicKeyInfo) != string(first.Leaf.RawSubjectPublicKeyInfo))
	}
	if !nodecert.RenewAt(cur).After(time.Now().Add(24 * time.Hour)) {
		t.Errorf("the renewed certificate is due again at %s", nodecert.RenewAt(cur))
	}
}

// ageingLeaf holds a certificate; the first one it is given looks almost expired, so renewal is due at once.
type ageingLeaf struct {
	mu   sync.Mutex
	leaf *x509.Certificate
}

func (l *ageingLeaf) set(c tls.Certificate, aged bool) {
	leaf := c.Leaf
	if aged {
		cp := *leaf
		cp.NotBefore, cp.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Minute)
		leaf = &cp
	}
	l.mu.Lock()
	l.leaf = leaf
	l.mu.Unlock()
}

func (l *ageingLeaf) SetLeaf(c tls.Certificate) error { l.set(c, false); return nil }
func (l *ageingLeaf) Leaf() *x509.Certificate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaf
}
