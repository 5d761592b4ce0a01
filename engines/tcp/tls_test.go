// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// testCA issues certificates for 127.0.0.1 that serve as both client and server identity, as agents' are.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// config returns the mutual-TLS configuration of one agent.
func (ca *testCA) config(t testing.TB, name string) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		RootCAs:      ca.pool, ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}
}

func tlsEngine(t *testing.T, node string, cfg *tls.Config, serve bool) *Engine {
	t.Helper()
	var ln net.Listener
	if serve {
		ln = listen(t)
	}
	e, err := New(Options{Node: node, Listener: ln, TLS: cfg, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func writeOnce(t *testing.T, a *Engine, remote engines.MemoryDesc, payload []byte) error {
	t.Helper()
	local := register(t, a, "node-a/src", payload)
	imp(t, a, remote)
	return moveWithin(a, 10*time.Second, item(engines.Item{Src: local.ID, Dst: remote.ID, Size: uint64(len(payload)), Tag: 1}))
}

func TestMutualTLS(t *testing.T) {
	ca := newCA(t)
	b := tlsEngine(t, "node-b", ca.config(t, "node-b"), true)
	dstBuf := make([]byte, 1<<20)
	dst := register(t, b, "node-b/dst", dstBuf)

	payload := make([]byte, 1<<20)
	for i := range payload {
		payload[i] = byte(i % 251)
	}
	a := tlsEngine(t, "node-a", ca.config(t, "node-a"), false)
	if err := writeOnce(t, a, dst, payload); err != nil {
		t.Fatalf("write over mutual TLS: %v", err)
	}
	view, unpin, err := b.Pin(dst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if string(view) != string(payload) {
		t.Fatal("bytes written over TLS differ")
	}
	unpin()

	for name, cfg := range map[string]*tls.Config{
		"plain TCP":                 nil,
		"certificate of another CA": newCA(t).config(t, "node-a"),
	} {
		intruder := tlsEngine(t, "node-a", cfg, false)
		err := writeOnce(t, intruder, dst, payload)
		if !errors.Is(err, engines.ErrPeerLost) {
			t.Errorf("%s client: %v, want the transfer refused (peer lost)", name, err)
		}
	}
}
