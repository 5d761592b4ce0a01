// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Secret keys, as kubernetes.io/tls Secrets name them, plus the CA bundle.
const (
	CertKey   = "tls.crt"
	KeyKey    = "tls.key"
	BundleKey = "ca.crt"
	// CAKeyKey holds the CA private key in the operator-only Secret (never mounted into agents).
	CAKeyKey = "ca.key"
)

// KeyPair is a PEM certificate and its PEM (PKCS#8) private key.
type KeyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// PoolServerName is the DNS name every agent certificate of a pool carries and every agent verifies when it
// dials a peer: it proves "an agent of this pool", whatever address the peer was reached at.
func PoolServerName(poolNamespace, poolName string) string {
	return fmt.Sprintf("%s.%s.agents.fabricxfer.io", poolName, poolNamespace)
}

// NewCA creates a self-signed CA for one pool, valid from now (minus a minute of clock skew) for validity.
func NewCA(poolNamespace, poolName string, now time.Time, validity time.Duration) (KeyPair, error) {
	if poolNamespace == "" || poolName == "" {
		return KeyPair{}, errors.New("creating a pool CA: pool namespace and name must be set")
	}
	if validity <= 0 {
		return KeyPair{}, fmt.Errorf("creating a pool CA: validity %s must be positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("creating a pool CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return KeyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("fabricxfer pool CA %s/%s", poolNamespace, poolName), Organization: []string{"fabricxfer"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing the pool CA: %w", err)
	}
	return encode(der, key)
}

// IssueAgent issues the certificate agents of the pool present both as TLS server and as TLS client.
// extraDNS adds names (for instance a Service name) next to PoolServerName.
func IssueAgent(ca KeyPair, poolNamespace, poolName string, now time.Time, validity time.Duration, extraDNS ...string) (KeyPair, error) {
	caCert, caKey, err := parse(ca)
	if err != nil {
		return KeyPair{}, fmt.Errorf("issuing an agent certificate: CA: %w", err)
	}
	if !caCert.IsCA {
		return KeyPair{}, errors.New("issuing an agent certificate: the given CA certificate is not a CA")
	}
	if validity <= 0 {
		return KeyPair{}, fmt.Errorf("issuing an agent certificate: validity %s must be positive", validity)
	}
	notAfter := now.Add(validity)
	if notAfter.After(caCert.NotAfter) {
		notAfter = caCert.NotAfter // never outlive the CA: verification would fail silently later
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, fmt.Errorf("creating an agent key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return KeyPair{}, err
	}
	name := PoolServerName(poolNamespace, poolName)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"fabricxfer"}},
		DNSNames:     append([]string{name}, extraDNS...),
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return KeyPair{}, fmt.Errorf("signing the agent certificate: %w", err)
	}
	return encode(der, key)
}

// AppendToBundle returns bundle with the certificates of add appended, skipping ones it already holds.
func AppendToBundle(bundle []byte, add ...[]byte) ([]byte, error) {
	certs, err := ParseCertificates(bundle)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	for _, a := range add {
		more, err := ParseCertificates(a)
		if err != nil {
			return nil, fmt.Errorf("reading a CA to add: %w", err)
		}
		for _, m := range more {
			if !contains(certs, m) {
				certs = append(certs, m)
			}
		}
	}
	return encodeCerts(certs), nil
}

// PruneBundle drops expired certificates and those that are not CAs, keeping the order of the rest.
func PruneBundle(bundle []byte, now time.Time) ([]byte, error) {
	certs, err := ParseCertificates(bundle)
	if err != nil {
		return nil, fmt.Errorf("reading the CA bundle: %w", err)
	}
	var keep []*x509.Certificate
	for _, c := range certs {
		if c.IsCA && now.Before(c.NotAfter) {
			keep = append(keep, c)
		}
	}
	return encodeCerts(keep), nil
}

// NeedsRenewal reports whether the first certificate in certPEM expires within renewBefore of now.
func NeedsRenewal(certPEM []byte, now time.Time, renewBefore time.Duration) (bool, error) {
	certs, err := ParseCertificates(certPEM)
	if err != nil {
		return false, err
	}
	if len(certs) == 0 {
		return true, nil
	}
	return !now.Add(renewBefore).Before(certs[0].NotAfter), nil
}

// ParseCertificates reads every CERTIFICATE block in data.
func ParseCertificates(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing a certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(data)) != 0 {
		return nil, errors.New("trailing data that is not PEM")
	}
	return out, nil
}

func parse(kp KeyPair) (*x509.Certificate, any, error) {
	certs, err := ParseCertificates(kp.CertPEM)
	if err != nil {
		return nil, nil, err
	}
	if len(certs) == 0 {
		return nil, nil, errors.New("no certificate")
	}
	block, _ := pem.Decode(kp.KeyPEM)
	if block == nil {
		return nil, nil, errors.New("no PEM private key")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the private key: %w", err)
	}
	return certs[0], key, nil
}

func encode(der []byte, key *ecdsa.PrivateKey) (KeyPair, error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyPair{}, fmt.Errorf("encoding the private key: %w", err)
	}
	return KeyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func encodeCerts(certs []*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func contains(certs []*x509.Certificate, c *x509.Certificate) bool {
	for _, x := range certs {
		if x.Equal(c) {
			return true
		}
	}
	return false
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("making a serial number: %w", err)
	}
	return s, nil
}
