// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodecert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// TestKeyPairChecksWhatTheOperatorReturned: a certificate for another node, for another key, or garbage in
// place of the signed certificate is refused before the agent would present it.
func TestKeyPairChecksWhatTheOperatorReturned(t *testing.T) {
	now := time.Now()
	ca, _ := pki.NewCA("infer", "kv", now, time.Hour)
	csr, key, err := pki.NewNodeRequest("infer", "kv", "a")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.SignNodeRequest(ca, csr, "infer", "kv", "a", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := keyPair(cert, key, "a"); err != nil || pki.NodeOf(c.Leaf) != "a" {
		t.Fatalf("the good answer: %v", err)
	}
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	bCSR, _, _ := pki.NewNodeRequest("infer", "kv", "b")
	bCert, _ := pki.SignNodeRequest(ca, bCSR, "infer", "kv", "b", now, time.Hour)
	for name, c := range map[string]struct {
		cert []byte
		key  any
		want string
	}{
		"another node's certificate": {bCert, key, `names node "b", not a`},
		"another key":                {cert, otherKey, "does not match its key"},
		"garbage":                    {[]byte("not a certificate"), key, "reading the signed certificate"},
		"empty":                      {nil, key, "no certificate"},
	} {
		if _, err := keyPair(c.cert, c.key, "a"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want an error saying %q, got %v", name, c.want, err)
		}
	}
}

type memLeaf struct {
	mu   sync.Mutex
	leaf *x509.Certificate
}

func (m *memLeaf) SetLeaf(c tls.Certificate) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leaf = c.Leaf
	return nil
}

func (m *memLeaf) Leaf() *x509.Certificate {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leaf
}

// TestKeepRetriesUntilRenewed: renewals that fail (the operator away, a denial) are retried with backoff,
// the old certificate stays in use meanwhile, and the first success is presented.
func TestKeepRetriesUntilRenewed(t *testing.T) {
	now := time.Now()
	ca, _ := pki.NewCA("infer", "kv", now, time.Hour)
	issue := func() tls.Certificate {
		kp, err := pki.IssueNode(ca, "infer", "kv", "a", time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	due := issue()
	aged := *due.Leaf
	aged.NotBefore, aged.NotAfter = now.Add(-time.Hour), now.Add(time.Minute) // renewal due at once
	leaf := &memLeaf{leaf: &aged}
	var calls atomic.Int32
	request := func(context.Context) (tls.Certificate, error) {
		if calls.Add(1) < 3 {
			return tls.Certificate{}, errors.New("certificate request denied: pool does not select node a")
		}
		return issue(), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); Keep(ctx, leaf, request, slog.New(slog.DiscardHandler)) }()
	deadline := time.Now().Add(20 * time.Second)
	for leaf.Leaf() == &aged {
		if time.Now().After(deadline) {
			t.Fatalf("no renewal after %d requests", calls.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Keep did not stop with its context")
	}
	if n := calls.Load(); n != 3 {
		t.Errorf("%d requests, want 3 (two refused, one signed)", n)
	}
	if !RenewAt(leaf.Leaf()).After(time.Now().Add(30 * time.Minute)) {
		t.Errorf("the renewed certificate is due again at %s", RenewAt(leaf.Leaf()))
	}
}
