// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodecert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// Requester asks the operator for this node's certificate.
type Requester struct {
	// Client creates and reads CertificateSigningRequests with the agent's own token (its node is what the
	// operator checks the request against).
	Client        client.Client
	PoolNamespace string
	PoolName      string
	Node          string
	// Timeout bounds one request, from creating it to the signed certificate (default 2 min).
	Timeout time.Duration
	// Poll is how often the request is read back while it waits for the operator (default 250 ms).
	Poll time.Duration
}

// Request makes a key and obtains its certificate; a request the operator denied returns its reason.
func (r *Requester) Request(ctx context.Context) (tls.Certificate, error) {
	timeout, poll := r.Timeout, r.Poll
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	csrPEM, key, err := pki.NewNodeRequest(r.PoolNamespace, r.PoolName, r.Node)
	if err != nil {
		return tls.Certificate{}, err
	}
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "fabricxfer-agent-",
			Labels: map[string]string{fxv1.LabelPoolName: r.PoolName, fxv1.LabelPoolNamespace: r.PoolNamespace}},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM, SignerName: pki.SignerName,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}},
	}
	if err := r.Client.Create(ctx, csr); err != nil {
		return tls.Certificate{}, fmt.Errorf("asking for the certificate of node %s: %w", r.Node, err)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		got := &certificatesv1.CertificateSigningRequest{}
		if err := r.Client.Get(ctx, client.ObjectKey{Name: csr.Name}, got); err != nil {
			return tls.Certificate{}, fmt.Errorf("reading certificate request %s: %w", csr.Name, err)
		}
		for _, c := range got.Status.Conditions {
			if (c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed) && c.Status == corev1.ConditionTrue {
				return tls.Certificate{}, fmt.Errorf("certificate request %s of node %s %s: %s: %s", csr.Name, r.Node, c.Type, c.Reason, c.Message)
			}
		}
		if len(got.Status.Certificate) > 0 {
			return keyPair(got.Status.Certificate, key, r.Node)
		}
		select {
		case <-ctx.Done():
			return tls.Certificate{}, fmt.Errorf("waiting for the operator to sign certificate request %s of node %s: %w", csr.Name, r.Node, ctx.Err())
		case <-t.C:
		}
	}
}

// keyPair checks that the signed certificate is this key's and this node's before the agent presents it.
func keyPair(certPEM []byte, key any, node string) (tls.Certificate, error) {
	certs, err := pki.ParseCertificates(certPEM)
	if err != nil || len(certs) == 0 {
		return tls.Certificate{}, fmt.Errorf("reading the signed certificate of node %s: %v", node, errors.Join(err, errors.New("no certificate")))
	}
	if got := pki.NodeOf(certs[0]); got != node {
		return tls.Certificate{}, fmt.Errorf("the signed certificate names node %q, not %s", got, node)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("encoding the node key: %w", err)
	}
	c, err := tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certs[0].Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("the signed certificate of node %s does not match its key: %w", node, err)
	}
	return c, nil
}

// Leaf is where the agent keeps its certificate (peers.TLSFiles).
type Leaf interface {
	SetLeaf(tls.Certificate) error
	Leaf() *x509.Certificate
}

// RenewAt is when a certificate is renewed: two thirds into its life, as the kubelet does, so a failed
// renewal has a third of the lifetime to be retried.
func RenewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// Keep renews the certificate held by leaf before it expires, until ctx ends. request is Requester.Request;
// a failed renewal is retried with backoff (1 s doubling to a tenth of the time left, at most 5 min).
func Keep(ctx context.Context, leaf Leaf, request func(context.Context) (tls.Certificate, error), log *slog.Logger) {
	backoff := time.Second
	for {
		cur := leaf.Leaf()
		wait := time.Duration(0)
		if cur != nil {
			wait = time.Until(RenewAt(cur))
		}
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		c, err := request(ctx)
		if err == nil {
			err = leaf.SetLeaf(c)
		}
		if err == nil {
			backoff = time.Second
			log.Info("renewed the node certificate", "notAfter", c.Leaf.NotAfter)
			continue
		}
		if ctx.Err() != nil {
			return
		}
		limit := 5 * time.Minute
		if cur != nil {
			if left := time.Until(cur.NotAfter) / 10; left < limit {
				limit = max(left, time.Second)
			}
		}
		backoff = min(backoff*2, limit)
		d := backoff/2 + rand.N(backoff/2+1) // jitter: many agents of a pool renew at about the same time
		log.Info("renewing the node certificate failed; retrying", "error", err, "in", d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}
