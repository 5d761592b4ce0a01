// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

func request(t *testing.T, key any, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// TestSignNodeRequestChecksEverything: the operator signs only a request for exactly the requesting node's
// certificate in the pool, and the certificate names that node alone; hostile requests get a clear refusal.
func TestSignNodeRequestChecksEverything(t *testing.T) {
	now := time.Now()
	ca, err := NewCA("infer", "kv", now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	good, _, err := NewNodeRequest("infer", "kv", "node-a")
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := SignNodeRequest(ca, good, "infer", "kv", "node-a", now, time.Hour)
	if err != nil {
		t.Fatalf("signing a good request: %v", err)
	}
	certs, _ := ParseCertificates(certPEM)
	if len(certs) != 1 || NodeOf(certs[0]) != "node-a" || certs[0].Subject.CommonName != "node-a" {
		t.Fatalf("signed certificate names %q (CN %q)", NodeOf(certs[0]), certs[0].Subject.CommonName)
	}
	if err := verify(t, ca.CertPEM, KeyPair{CertPEM: certPEM}, PoolServerName("infer", "kv"), now); err != nil {
		t.Fatalf("node certificate does not verify as an agent of its pool: %v", err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	pool := PoolServerName("infer", "kv")
	forged := request(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{pool},
		URIs: []*url.URL{NodeURI("node-a")}})
	// Flip a byte of the signature: the key does not sign what the request says.
	block, _ := pem.Decode(forged)
	block.Bytes[len(block.Bytes)-3] ^= 0xff
	badSig := pem.EncodeToMemory(block)
	for name, c := range map[string]struct {
		csr  []byte
		node string
		want string
	}{
		"another node's request":   {good, "node-b", `names node "node-a" in its subject, but comes from node node-b`},
		"two node URIs":            {request(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{pool}, URIs: []*url.URL{NodeURI("node-a"), NodeURI("node-b")}}), "node-a", "want only"},
		"another pool's name":      {request(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{PoolServerName("infer", "other")}, URIs: []*url.URL{NodeURI("node-a")}}), "node-a", "DNS names"},
		"extra DNS name":           {request(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{pool, "kubernetes.default"}, URIs: []*url.URL{NodeURI("node-a")}}), "node-a", "DNS names"},
		"IP address":               {request(t, key, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{pool}, URIs: []*url.URL{NodeURI("node-a")}, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 1)}}), "node-a", "IP addresses"},
		"RSA key":                  {request(t, rsaKey, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node-a"}, DNSNames: []string{pool}, URIs: []*url.URL{NodeURI("node-a")}}), "node-a", "P-256"},
		"bad signature":            {badSig, "node-a", "signature"},
		"garbage":                  {[]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), "node-a", "parsing"},
		"not PEM":                  {[]byte("hello"), "node-a", "not one PEM"},
		"two requests":             {append(append([]byte{}, good...), good...), "node-a", "not one PEM"},
		"requester names no node":  {good, "", "not a node name"},
		"requester node not a DNS": {good, "Node_A", "not a node name"},
	} {
		_, err := SignNodeRequest(ca, c.csr, "infer", "kv", c.node, now, time.Hour)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: want a refusal saying %q, got %v", name, c.want, err)
		}
	}
}

// TestNodeOf: the pool-wide certificate names no node, a node certificate its node, and a certificate naming
// two nodes (or a malformed one) none.
func TestNodeOf(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA("infer", "kv", now, time.Hour)
	shared, _ := IssueAgent(ca, "infer", "kv", now, time.Hour)
	certs, _ := ParseCertificates(shared.CertPEM)
	if n := NodeOf(certs[0]); n != "" {
		t.Errorf("pool-wide certificate names node %q", n)
	}
	for _, c := range []struct {
		uris []string
		want string
	}{
		{[]string{"urn:fabricxfer:node:n1"}, "n1"},
		{[]string{"urn:fabricxfer:node:n1", "urn:fabricxfer:node:n2"}, ""},
		{[]string{"urn:fabricxfer:node:N1"}, ""},
		{[]string{"urn:fabricxfer:node:"}, ""},
		{[]string{"urn:fabricxfer:node:n1/../n2"}, ""},
		{[]string{"spiffe://x/n1", "urn:fabricxfer:node:n1.rack-2"}, "n1.rack-2"},
	} {
		cert := &x509.Certificate{}
		for _, u := range c.uris {
			parsed, err := url.Parse(u)
			if err != nil {
				t.Fatal(err)
			}
			cert.URIs = append(cert.URIs, parsed)
		}
		if got := NodeOf(cert); got != c.want {
			t.Errorf("URIs %q: node %q, want %q", c.uris, got, c.want)
		}
	}
}
