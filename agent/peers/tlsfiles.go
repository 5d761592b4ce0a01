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
	"strings"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// recheckEvery bounds how often the certificate files are stat'ed (on handshakes).
const recheckEvery = time.Second

// TLSFiles serves the agent's certificate and the pool's CA bundle. The bundle (and, for the pool-wide
// certificate of earlier versions, the key pair) is read from a directory and re-read when it changes (a
// Secret volume swaps its files atomically); a per-node certificate the operator signed on this agent's
// request is set with SetLeaf.
type TLSFiles struct {
	dir        string
	serverName string
	opts       TLSOptions

	mu      sync.Mutex
	checked time.Time
	stamp   string
	cert    *tls.Certificate
	leaf    *x509.Certificate
	roots   *x509.CertPool
	// sharedUntil is the operator's end of the transition (pki.SharedUntilKey in the directory).
	sharedUntil time.Time
}

// TLSOptions choose where the agent's own certificate comes from and which peers' certificates pass.
type TLSOptions struct {
	// NodeCert: the directory holds only ca.crt; this node's certificate is set with SetLeaf (its key never
	// left the agent). Until then no handshake succeeds.
	NodeCert bool
	// AcceptSharedUntil: while this agent's own certificate names its node, a peer presenting the pool-wide
	// certificate of earlier versions (it names no node) is accepted only before this time, so a pool keeps
	// working while its agents roll to per-node certificates. The later of it and the time the operator
	// writes into the directory (pki.SharedUntilKey, during the transition) counts. Zero: never.
	AcceptSharedUntil time.Time
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// ErrWrongNode says a peer's certificate belongs to another node than the one it speaks for.
var ErrWrongNode = errors.New("peer certificate names another node")

// NewTLSFiles loads dir/{tls.crt,tls.key,ca.crt} for the agents of pool namespace/name.
func NewTLSFiles(dir, poolNamespace, poolName string) (*TLSFiles, error) {
	return NewTLSFilesWith(dir, poolNamespace, poolName, TLSOptions{})
}

// NewTLSFilesWith loads the directory as opts say.
func NewTLSFilesWith(dir, poolNamespace, poolName string, opts TLSOptions) (*TLSFiles, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	f := &TLSFiles{dir: dir, serverName: pki.PoolServerName(poolNamespace, poolName), opts: opts}
	if err := f.reload(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *TLSFiles) paths() []string {
	if f.opts.NodeCert {
		return []string{filepath.Join(f.dir, pki.BundleKey)}
	}
	return []string{filepath.Join(f.dir, pki.BundleKey), filepath.Join(f.dir, pki.CertKey), filepath.Join(f.dir, pki.KeyKey)}
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
	if fi, err := os.Stat(filepath.Join(f.dir, pki.SharedUntilKey)); err == nil {
		s += fmt.Sprintf("until:%d:%d", fi.ModTime().UnixNano(), fi.Size())
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
	bundle, err := os.ReadFile(p[0])
	if err != nil {
		return fmt.Errorf("reading the CA bundle: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return fmt.Errorf("the CA bundle %s holds no certificate", p[0])
	}
	// The operator names the end of the transition from the pool-wide certificate here while it lasts; a
	// file that does not parse ends it (refusing is the safe side).
	var sharedUntil time.Time
	if b, err := os.ReadFile(filepath.Join(f.dir, pki.SharedUntilKey)); err == nil {
		sharedUntil, _ = time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	}
	var cert *tls.Certificate
	if !f.opts.NodeCert {
		c, err := tls.LoadX509KeyPair(p[1], p[2])
		if err != nil {
			return fmt.Errorf("loading the agent certificate from %s: %w", f.dir, err)
		}
		cert = &c
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.roots, f.stamp, f.checked, f.sharedUntil = roots, stamp, time.Now(), sharedUntil
	if cert != nil {
		f.cert, f.leaf = cert, cert.Leaf
	}
	return nil
}

// SetLeaf makes c this agent's certificate from the next handshake on (a per-node certificate, renewed).
func (f *TLSFiles) SetLeaf(c tls.Certificate) error {
	if !f.opts.NodeCert {
		return errors.New("setting the node certificate: this agent uses the certificate files")
	}
	if len(c.Certificate) == 0 {
		return errors.New("setting the node certificate: no certificate")
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return fmt.Errorf("setting the node certificate: %w", err)
	}
	c.Leaf = leaf
	f.mu.Lock()
	f.cert, f.leaf = &c, leaf
	f.mu.Unlock()
	return nil
}

// Leaf returns this agent's current certificate (nil before SetLeaf in NodeCert mode).
func (f *TLSFiles) Leaf() *x509.Certificate {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.leaf
}

// Roots returns the current CA bundle.
func (f *TLSFiles) Roots() *x509.CertPool {
	_, roots := f.current()
	return roots
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

func (f *TLSFiles) ownCert() (*tls.Certificate, error) {
	c, _ := f.current()
	if c == nil {
		return nil, errors.New("this node's agent certificate is not issued yet")
	}
	return c, nil
}

// strict reports whether a peer must present a certificate naming its node: once this agent's own certificate
// names one and the transition from the pool-wide certificate is over.
func (f *TLSFiles) strict() bool {
	f.mu.Lock()
	own, until := f.leaf, f.sharedUntil
	f.mu.Unlock()
	if f.opts.AcceptSharedUntil.After(until) {
		until = f.opts.AcceptSharedUntil
	}
	return own != nil && pki.NodeOf(own) != "" && !f.opts.Now().Before(until)
}

// SharedUntil is when this agent stops accepting the pool-wide certificate of earlier versions.
func (f *TLSFiles) SharedUntil() time.Time {
	f.current()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.opts.AcceptSharedUntil.After(f.sharedUntil) {
		return f.opts.AcceptSharedUntil
	}
	return f.sharedUntil
}

// Config returns a TLS configuration for both ends of an agent-to-agent connection: it presents this agent's
// certificate and accepts only peers whose certificate chains to the current CA bundle and names this pool.
// The files are re-checked on handshakes, so rotation needs no restart. Which node a peer is, is checked by
// CheckPeer once the peer says which node it speaks for.
func (f *TLSFiles) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return f.ownCert()
		},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return f.ownCert()
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
		CurrentTime: f.opts.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
	if err != nil {
		return fmt.Errorf("peer is not an agent of this pool: %w", err)
	}
	if pki.NodeOf(certs[0]) == "" && f.strict() {
		return fmt.Errorf("peer presented the pool-wide certificate of an earlier version, which names no node (accepted until %s)",
			f.SharedUntil().UTC().Format(time.RFC3339))
	}
	return nil
}

// CheckPeer checks that the certificate a peer presented on this connection is node's, the node the peer
// says it is (its hello, its Hello request, the sender of a request). A pool-wide certificate of an earlier
// version names no node; it reached this point only during the transition (see TLSOptions), and passes.
func (f *TLSFiles) CheckPeer(state tls.ConnectionState, node string) error {
	if len(state.PeerCertificates) == 0 {
		return errors.New("the peer presented no certificate")
	}
	got := pki.NodeOf(state.PeerCertificates[0])
	switch {
	case got == "" && f.strict():
		return errors.New("the peer's certificate names no node")
	case got != "" && got != node:
		return fmt.Errorf("%w: the peer's certificate is node %s's, but it speaks as node %q", ErrWrongNode, got, node)
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
