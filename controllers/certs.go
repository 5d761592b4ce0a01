// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// Certificate lifetimes: agents re-read their Secret on change, so short leaves cost nothing; a CA lives long
// and overlaps its successor in the trust bundle, so rotation never splits a pool.
const (
	caValidity    = 365 * 24 * time.Hour
	caRenewBefore = 30 * 24 * time.Hour
	// NodeCertValidity is the life of a node's certificate; agents renew at two thirds of it.
	NodeCertValidity = 7 * 24 * time.Hour
	// sharedTransition bounds how long agents still accept the pool-wide certificate of earlier versions
	// after the operator removed its key: long enough for a DaemonSet rollout over thousands of nodes.
	sharedTransition = 24 * time.Hour
)

// CertIssuer keeps, per pool, a CA Secret only the operator reads and an agent Secret (ca.crt) the agents
// mount, both in the agents' namespace: no tenant can read a pool's CA key, and no agent another node's key.
type CertIssuer struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// NewCertIssuer returns a CertIssuer on the real clock.
func NewCertIssuer(c client.Client) *CertIssuer {
	return &CertIssuer{Client: c, Clock: clock.RealClock{}}
}

// PoolCertificates is what EnsurePoolSecret found and did.
type PoolCertificates struct {
	// Change says what was issued or changed now ("" when the certificates were current), for the pool's Event.
	Change string
	// First is true when the pool had no CA before: its certificates were issued, not rotated.
	First bool
	// CAExpires is when the pool's current CA expires.
	CAExpires time.Time
	// Next is when there is something to do again: the CA's renewal, or the end of an earlier version's
	// shared-key transition.
	Next time.Time
}

// EnsurePoolSecret creates the pool's certificates, or renews whichever is close to expiry, and says what it
// did.
func (i *CertIssuer) EnsurePoolSecret(ctx context.Context, pool *fxv1.TransferPool, namespace, name string) (PoolCertificates, error) {
	var out PoolCertificates
	now := i.Clock.Now()
	caSecret, err := i.get(ctx, namespace, name+"-ca")
	if err != nil {
		return out, err
	}
	ca := pki.KeyPair{CertPEM: caSecret[pki.CertKey], KeyPEM: caSecret[pki.CAKeyKey]}
	bundle := caSecret[pki.BundleKey]
	caChanged := false
	out.First = len(ca.CertPEM) == 0
	if renew, err := pki.NeedsRenewal(ca.CertPEM, now, caRenewBefore); len(ca.CertPEM) == 0 || err != nil || renew {
		if ca, err = pki.NewCA(pool.Namespace, pool.Name, now, caValidity); err != nil {
			return out, fmt.Errorf("creating the CA of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		if bundle, err = pki.AppendToBundle(bundle, ca.CertPEM); err != nil {
			return out, fmt.Errorf("adding the new CA to the bundle of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		if bundle, err = pki.PruneBundle(bundle, now); err != nil {
			return out, fmt.Errorf("pruning the CA bundle of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		caChanged = true
		if err := i.apply(ctx, pool, namespace, name+"-ca", map[string][]byte{
			pki.CertKey: ca.CertPEM, pki.CAKeyKey: ca.KeyPEM, pki.BundleKey: bundle,
		}); err != nil {
			return out, err
		}
	}

	// The agents' Secret carries the trust bundle only: each agent's key is made on its node and its
	// certificate signed on its request (NodeCertReconciler). A pool-wide key left by an earlier version is removed
	// here, and agents still presenting it are accepted until SharedUntilKey says.
	agentSecret, err := i.get(ctx, namespace, name)
	if err != nil {
		return out, err
	}
	data := map[string][]byte{pki.BundleKey: bundle}
	what := ""
	if shared := agentSecret[pki.CertKey]; len(shared) > 0 {
		until := now.Add(sharedTransition)
		if certs, err := pki.ParseCertificates(shared); err == nil && len(certs) > 0 && certs[0].NotAfter.Before(until) {
			until = certs[0].NotAfter // an expired pool-wide certificate is refused anyway
		}
		data[pki.SharedUntilKey] = []byte(until.UTC().Format(time.RFC3339))
		out.Next = until
		what = fmt.Sprintf("removed the pool-wide agent key from Secret %s/%s: agents get per-node certificates, and accept the old one until %s",
			namespace, name, until.UTC().Format(time.RFC3339))
	} else if u := agentSecret[pki.SharedUntilKey]; len(u) > 0 {
		if t, err := time.Parse(time.RFC3339, string(u)); err == nil && now.Before(t) {
			data[pki.SharedUntilKey] = u // the transition lasts; dropped once it is over
			out.Next = t
		}
	}
	if caChanged && what == "" {
		what = fmt.Sprintf("issued the pool's CA, valid until %s, and its bundle in Secret %s/%s (a previous CA stays in the bundle until it expires); agents' certificates are signed on their requests",
			now.Add(caValidity).UTC().Format(time.RFC3339), namespace, name)
	}
	if certs, err := pki.ParseCertificates(ca.CertPEM); err == nil && len(certs) > 0 {
		out.CAExpires = certs[0].NotAfter
		if renew := out.CAExpires.Add(-caRenewBefore); out.Next.IsZero() || renew.Before(out.Next) {
			out.Next = renew
		}
	}
	if !caChanged && what == "" && sameData(agentSecret, data) {
		return out, nil
	}
	if err := i.apply(ctx, pool, namespace, name, data); err != nil {
		return out, err
	}
	out.Change = what
	return out, nil
}

// sameData compares two Secrets' data.
func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// CA reads the pool's CA key pair from the operator-only Secret (found false when it is not issued yet).
func (i *CertIssuer) CA(ctx context.Context, namespace, name string) (pki.KeyPair, bool, error) {
	data, err := i.get(ctx, namespace, name+"-ca")
	if err != nil {
		return pki.KeyPair{}, false, err
	}
	ca := pki.KeyPair{CertPEM: data[pki.CertKey], KeyPEM: data[pki.CAKeyKey]}
	return ca, len(ca.CertPEM) > 0 && len(ca.KeyPEM) > 0, nil
}

func (i *CertIssuer) get(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	s := &corev1.Secret{}
	if err := i.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("reading secret %s/%s: %w", namespace, name, err)
	}
	return s.Data, nil
}

func (i *CertIssuer) apply(ctx context.Context, pool *fxv1.TransferPool, namespace, name string, data map[string][]byte) error {
	secret := corev1ac.Secret(name, namespace).
		WithLabels(poolLabels(pool)).
		WithType(corev1.SecretTypeOpaque).WithData(data)
	if err := i.Client.Apply(ctx, secret, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying secret %s/%s: %w", namespace, name, err)
	}
	return nil
}
