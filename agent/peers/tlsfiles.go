// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// recheckEvery bounds how often the certificate files are stat'ed (on handshakes).
const recheckEvery = time.Second

// TLSFiles serves the pool's certificates from a directory and re-reads them when they change (a Secret
// volume swaps its files atomically).
type TLSFiles struct {
	dir        string
	serverName string

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cert    *tls.Certificate
	roots   *x509.CertPool
}

// NewTLSFiles loads dir/{tls.crt,tls.key,ca.crt} for the agents of pool namespace/name.
func NewTLSFiles(dir, poolNamespace, poolName string) (*TLSFiles, error) {
	f := &TLSFiles{dir: dir, serverName: pki.PoolServerName(poolNamespace, poolName)}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *TLSFiles) paths() []string {
	return []string{filepath.Join(f.dir, pki.CertKey), filepath.Join(f.dir, pki.KeyKey), filepath.Join(f.dir, pki.BundleKey)}
}

func (f *TLSFiles) fingerprint() (string, error) {
	var s string
	for _, p := range f.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("reading pool certificates: %w", err)
		}
		s += fmt.Sprintf("%s:%d:%d;", p, fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}

// reload reads the files; on failure the previous certificates stay in use.
func (f *TLSFiles) reload() error {
	stamp, err := f.fingerprint()
	if err != nil {
		return err
	}
	p := f.paths()
	cert, err := tls.LoadX509KeyPair(p[0], p[1])
	if err != nil {
		return fmt.Errorf("loading the agent certificate from %s: %w", f.dir, err)
	}
	bundle, err := os.ReadFile(p[2])
	if err != nil {
		return fmt.Errorf("reading the CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return fmt.Errorf("the CA bundle %s holds no certificate", p[2])
	}
	f.mu.Lock()
	f.cert, f.roots, f.stamp, f.checked = &cert, roots, stamp, time.Now()
	f.mu.Unlock()
	return nil
}

func (f *TLSFiles) current() (*tls.Certificate, *x509.CertPool) {
	f.mu.Lock()
	due := time.Since(f.checked) > recheckEvery
	if due {
		f.checked = time.Now()
	}
	stamp := f.stamp
	f.mu.Unlock()
	if due {
		if now, err := f.fingerprint(); err == nil && now != stamp {
			_ = f.reload() // half-written files: keep the old ones, retry next time
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cert, f.roots
}

// Config returns a TLS configuration for both ends of an agent-to-agent connection: it presents the pool's
// agent certificate and accepts only peers whose certificate chains to the current CA bundle and names this
// pool. The files are re-checked on handshakes, so rotation needs no restart.
func (f *TLSFiles) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, _ := f.current()
			return c, nil
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, _ := f.current()
			return c, nil
		},
		ClientAuth: tls.RequireAnyClientCert,
		// The standard verification cannot follow a CA bundle that changes; VerifyPeerCertificate does the
		// full chain and name check against the current one, on both sides.
		InsecureSkipVerify:    true, //nolint:gosec // verified below
		VerifyPeerCertificate: f.verify,
	}
}

func (f *TLSFiles) verify(raw [][]byte, _ [][]*x509.Certificate) error {
	if len(raw) == 0 {
		return errors.New("peer presented no certificate")
	}
	certs := make([]*x509.Certificate, len(raw))
	for i, r := range raw {
		c, err := x509.ParseCertificate(r)
		if err != nil {
			return fmt.Errorf("parsing the peer certificate: %w", err)
		}
		certs[i] = c
	}
	_, roots := f.current()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: f.serverName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return fmt.Errorf("peer is not an agent of this pool: %w", err)
	}
	return nil
}

// WriteFiles writes a key pair and bundle as the operator's Secret would appear mounted (tests, the demo).
func WriteFiles(dir string, agent pki.KeyPair, bundle []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{pki.CertKey: agent.CertPEM, pki.KeyKey: agent.KeyPEM, pki.BundleKey: bundle} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}
