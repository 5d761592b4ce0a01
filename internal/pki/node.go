// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// nodeURIPrefix starts the URI SAN that names the node a per-node agent certificate belongs to. A URI, not a
// DNS name: node names may be 253 characters, more than a DNS label under the pool's name can hold.
const nodeURIPrefix = "urn:fabricxfer:node:"

// maxNodeName is the longest Node name Kubernetes accepts (a DNS subdomain).
const maxNodeName = 253

// NodeURI is the URI SAN of node's certificate.
func NodeURI(node string) *url.URL {
	return &url.URL{Scheme: "urn", Opaque: strings.TrimPrefix(nodeURIPrefix, "urn:") + node}
}

// NodeOf returns the node a certificate names, or "" for a certificate that names none (the pool-wide
// certificate of earlier versions). A certificate naming two nodes, or a malformed one, names none.
func NodeOf(c *x509.Certificate) string {
	node := ""
	for _, u := range c.URIs {
		s := u.String()
		if !strings.HasPrefix(s, nodeURIPrefix) {
			continue
		}
		n := strings.TrimPrefix(s, nodeURIPrefix)
		if node != "" || !validNodeName(n) {
			return ""
		}
		node = n
	}
	return node
}

// validNodeName accepts DNS subdomains, the names Nodes have.
func validNodeName(n string) bool {
	if n == "" || len(n) > maxNodeName {
		return false
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// NewNodeRequest makes the key of node's agent certificate and a PEM certificate request for it. The key
// never leaves the agent: the operator signs the request.
func NewNodeRequest(poolNamespace, poolName, node string) (csrPEM []byte, key *ecdsa.PrivateKey, err error) {
	if !validNodeName(node) {
		return nil, nil, fmt.Errorf("requesting a node certificate: %q is not a node name", node)
	}
	key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the node key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: node, Organization: []string{"fabricxfer"}},
		DNSNames: []string{PoolServerName(poolNamespace, poolName)},
		URIs:     []*url.URL{NodeURI(node)},
	}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the certificate request of node %s: %w", node, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), key, nil
}

// SignNodeRequest checks that a PEM certificate request asks for exactly node's certificate in the pool (the
// pool's name, the node's URI, nothing else, a P-256 key it proves it holds) and signs it with the pool's CA.
// The signed certificate is built from the checked names, never from the request's extensions.
func SignNodeRequest(ca KeyPair, csrPEM []byte, poolNamespace, poolName, node string, now time.Time, validity time.Duration) ([]byte, error) {
	block, rest := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" || len(strings.TrimSpace(string(rest))) != 0 {
		return nil, errors.New("the request is not one PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the request's signature does not match its key: %w", err)
	}
	pub, ok := req.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("the request's key is %T, want an ECDSA P-256 key", req.PublicKey)
	}
	if !validNodeName(node) {
		return nil, fmt.Errorf("%q is not a node name", node)
	}
	pool := PoolServerName(poolNamespace, poolName)
	var uris []string
	for _, u := range req.URIs {
		uris = append(uris, u.String())
	}
	switch {
	case req.Subject.CommonName != node:
		return nil, fmt.Errorf("the request names node %q in its subject, but comes from node %s", req.Subject.CommonName, node)
	case !slices.Equal(uris, []string{NodeURI(node).String()}):
		return nil, fmt.Errorf("the request asks for URIs %q, want only %s (node %s)", uris, NodeURI(node), node)
	case !slices.Equal(req.DNSNames, []string{pool}):
		return nil, fmt.Errorf("the request asks for DNS names %q, want only %s", req.DNSNames, pool)
	case len(req.IPAddresses) != 0 || len(req.EmailAddresses) != 0:
		return nil, errors.New("the request asks for IP addresses or e-mail addresses")
	}
	return issueLeaf(ca, pub, &x509.Certificate{
		Subject:  pkix.Name{CommonName: node, Organization: []string{"fabricxfer"}},
		DNSNames: []string{pool},
		URIs:     []*url.URL{NodeURI(node)},
	}, now, validity)
}

// issueLeaf signs tmpl's names for pub as an agent certificate (server and client), valid for validity but
// never past the CA.
func issueLeaf(ca KeyPair, pub any, tmpl *x509.Certificate, now time.Time, validity time.Duration) ([]byte, error) {
	caCert, caKey, err := parse(ca)
	if err != nil {
		return nil, fmt.Errorf("reading the CA: %w", err)
	}
	if !caCert.IsCA {
		return nil, errors.New("the given CA certificate is not a CA")
	}
	if validity <= 0 {
		return nil, fmt.Errorf("validity %s must be positive", validity)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Minute)
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(caCert.NotAfter) {
		tmpl.NotAfter = caCert.NotAfter // never outlive the CA: verification would fail silently later
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueNode makes a key and node's certificate in one step, for agents run without the operator (standalone
// pairs, tests); the operator signs agents' own requests instead (SignNodeRequest).
func IssueNode(ca KeyPair, poolNamespace, poolName, node string, now time.Time, validity time.Duration) (KeyPair, error) {
	csr, key, err := NewNodeRequest(poolNamespace, poolName, node)
	if err != nil {
		return KeyPair{}, err
	}
	cert, err := SignNodeRequest(ca, csr, poolNamespace, poolName, node, now, validity)
	if err != nil {
		return KeyPair{}, fmt.Errorf("issuing the certificate of node %s: %w", node, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("encoding the node key: %w", err)
	}
	return KeyPair{CertPEM: cert, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}, nil
}

// SignerName is the Kubernetes CertificateSigningRequest signer of agents' node certificates; the operator
// is its only signer.
const SignerName = "fabricxfer.io/agent"

// SharedUntilKey is the key of the agents' Secret that, while a pool moves from the pool-wide certificate of
// earlier versions to per-node ones, says until when (RFC 3339) agents still accept the old certificate.
const SharedUntilKey = "accept-shared-until"
