// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"
)

func verify(t *testing.T, bundle []byte, leaf KeyPair, name string, now time.Time) error {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificate")
	}
	certs, err := ParseCertificates(leaf.CertPEM)
	if err != nil || len(certs) != 1 {
		t.Fatalf("leaf: %v (%d certs)", err, len(certs))
	}
	_, err = certs[0].Verify(x509.VerifyOptions{Roots: pool, DNSName: name, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	return err
}

func TestAgentCertificateVerifiesAgainstItsPoolOnly(t *testing.T) {
	now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	ca, err := NewCA("infer", "kv", now, 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := IssueAgent(ca, "infer", "kv", now, 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(agent.CertPEM, agent.KeyPEM); err != nil {
		t.Fatalf("agent key pair does not load as TLS: %v", err)
	}
	if err := verify(t, ca.CertPEM, agent, PoolServerName("infer", "kv"), now); err != nil {
		t.Fatalf("agent cert does not verify against its CA: %v", err)
	}
	if err := verify(t, ca.CertPEM, agent, PoolServerName("infer", "other"), now); err == nil {
		t.Fatal("agent cert of pool kv verified as an agent of pool other")
	}
	otherCA, err := NewCA("infer", "other", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := verify(t, otherCA.CertPEM, agent, PoolServerName("infer", "kv"), now); err == nil {
		t.Fatal("agent cert verified against another pool's CA")
	}
	if err := verify(t, ca.CertPEM, agent, PoolServerName("infer", "kv"), now.Add(31*24*time.Hour)); err == nil {
		t.Fatal("agent cert still verifies after it expired")
	}
}

func TestAgentCertificateNeverOutlivesItsCA(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("ns", "p", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := IssueAgent(ca, "ns", "p", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	renew, err := NeedsRenewal(agent.CertPEM, now, 2*time.Hour)
	if err != nil || !renew {
		t.Fatalf("NeedsRenewal = %v, %v; want true for a cert cut to the CA's one hour", renew, err)
	}
	renew, err = NeedsRenewal(agent.CertPEM, now, time.Minute)
	if err != nil || renew {
		t.Fatalf("NeedsRenewal(1m) = %v, %v; want false", renew, err)
	}
}

// TestRotationKeepsOldAndNewAgentsTalking walks the rotation: while the bundle holds both CAs, an agent
// with an old certificate and one with a new certificate accept each other over real TLS.
func TestRotationKeepsOldAndNewAgentsTalking(t *testing.T) {
	now := time.Now()
	oldCA, err := NewCA("ns", "p", now, 48*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	newCA, err := NewCA("ns", "p", now, 96*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := AppendToBundle(oldCA.CertPEM, newCA.CertPEM, oldCA.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	if certs, _ := ParseCertificates(bundle); len(certs) != 2 {
		t.Fatalf("bundle holds %d certificates, want 2 (duplicates skipped)", len(certs))
	}
	oldAgent, _ := IssueAgent(oldCA, "ns", "p", now, 24*time.Hour)
	newAgent, _ := IssueAgent(newCA, "ns", "p", now, 24*time.Hour)
	if err := handshake(t, bundle, oldAgent, newAgent, PoolServerName("ns", "p")); err != nil {
		t.Fatalf("old server, new client during rotation: %v", err)
	}
	if err := handshake(t, bundle, newAgent, oldAgent, PoolServerName("ns", "p")); err != nil {
		t.Fatalf("new server, old client during rotation: %v", err)
	}
	if err := handshake(t, newCA.CertPEM, oldAgent, newAgent, PoolServerName("ns", "p")); err == nil {
		t.Fatal("handshake succeeded with a bundle that no longer trusts the old CA")
	}
	pruned, err := PruneBundle(bundle, now.Add(72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if certs, _ := ParseCertificates(pruned); len(certs) != 1 || !certs[0].Equal(mustFirst(t, newCA.CertPEM)) {
		t.Fatalf("pruned bundle holds %d certificates, want only the new CA", len(certs))
	}
}

func mustFirst(t *testing.T, p []byte) *x509.Certificate {
	c, err := ParseCertificates(p)
	if err != nil || len(c) == 0 {
		t.Fatalf("parse: %v", err)
	}
	return c[0]
}

func handshake(t *testing.T, bundle []byte, server, client KeyPair, name string) error {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(bundle)
	sc, err := tls.X509KeyPair(server.CertPEM, server.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := tls.X509KeyPair(client.CertPEM, client.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{sc}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13})
	cli := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{cc}, RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS13})
	done := make(chan error, 1)
	go func() { done <- srv.Handshake() }()
	_ = b.SetDeadline(time.Now().Add(5 * time.Second))
	_ = a.SetDeadline(time.Now().Add(5 * time.Second))
	cerr := cli.Handshake()
	serr := <-done
	if cerr != nil {
		return cerr
	}
	return serr
}

func TestBadInputIsRefused(t *testing.T) {
	if _, err := NewCA("", "p", time.Now(), time.Hour); err == nil {
		t.Error("NewCA accepted an empty namespace")
	}
	if _, err := IssueAgent(KeyPair{CertPEM: []byte("junk")}, "ns", "p", time.Now(), time.Hour); err == nil {
		t.Error("IssueAgent accepted a junk CA")
	}
	if _, err := AppendToBundle([]byte("not pem")); err == nil {
		t.Error("AppendToBundle accepted junk")
	}
}
