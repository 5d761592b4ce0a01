// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	deadline := time.Now().Add(5 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	errc := make(chan error, 1)
	go func() { errc <- tls.Server(a, server).Handshake() }()
	cerr := tls.Client(b, client).Handshake()
	serr := <-errc
	if cerr != nil {
		return cerr
	}
	return serr
}

// TestCertificateRotationWithoutRestart: agent B's files move to a new CA in two steps, as the operator
// rotates; agent A, whose files are read once at start, keeps talking to B throughout because its bundle is
// updated first.
func TestCertificateRotationWithoutRestart(t *testing.T) {
	now := time.Now()
	oldCA, _ := pki.NewCA("infer", "kv", now, 24*time.Hour)
	newCA, _ := pki.NewCA("infer", "kv", now, 48*time.Hour)
	oldCert, _ := pki.IssueAgent(oldCA, "infer", "kv", now, time.Hour)
	newCert, err := pki.IssueAgent(newCA, "infer", "kv", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	if err := peers.WriteFiles(dirA, oldCert, oldCA.CertPEM); err != nil {
		t.Fatal(err)
	}
	if err := peers.WriteFiles(dirB, oldCert, oldCA.CertPEM); err != nil {
		t.Fatal(err)
	}
	a, err := peers.NewTLSFiles(dirA, "infer", "kv")
	if err != nil {
		t.Fatal(err)
	}
	b, err := peers.NewTLSFiles(dirB, "infer", "kv")
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(t, a.Config(), b.Config()); err != nil {
		t.Fatalf("before rotation: %v", err)
	}
	// Step 1: both bundles trust old and new; step 2: B gets a certificate of the new CA.
	both, _ := pki.AppendToBundle(oldCA.CertPEM, newCA.CertPEM)
	if err := peers.WriteFiles(dirA, oldCert, both); err != nil {
		t.Fatal(err)
	}
	if err := peers.WriteFiles(dirB, newCert, both); err != nil {
		t.Fatal(err)
	}
	bump(t, dirA)
	bump(t, dirB)
	time.Sleep(1100 * time.Millisecond) // files are re-checked at most once a second
	if err := handshake(t, a.Config(), b.Config()); err != nil {
		t.Fatalf("during rotation (A old cert, B new cert, both bundles): %v", err)
	}
	// A peer of another pool is still refused.
	strangerCA, _ := pki.NewCA("infer", "kv", now, time.Hour)
	stranger, _ := pki.IssueAgent(strangerCA, "infer", "kv", now, time.Hour)
	dirS := filepath.Join(t.TempDir(), "s")
	if err := peers.WriteFiles(dirS, stranger, strangerCA.CertPEM); err != nil {
		t.Fatal(err)
	}
	s, _ := peers.NewTLSFiles(dirS, "infer", "kv")
	if err := handshake(t, a.Config(), s.Config()); err == nil {
		t.Fatal("a certificate of another CA was accepted")
	}
	// Bad files are refused at start with a clear error.
	if err := os.WriteFile(filepath.Join(dirS, pki.BundleKey), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := peers.NewTLSFiles(dirS, "infer", "kv"); err == nil {
		t.Fatal("a junk CA bundle was accepted")
	}
}

// bump moves the files' modification time forward so a rewrite within the same clock tick is noticed.
func bump(t *testing.T, dir string) {
	later := time.Now().Add(2 * time.Second)
	for _, n := range []string{pki.CertKey, pki.KeyKey, pki.BundleKey} {
		if err := os.Chtimes(filepath.Join(dir, n), later, later); err != nil {
			t.Fatal(err)
		}
	}
}
