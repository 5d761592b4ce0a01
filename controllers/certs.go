// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
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
	agentValidity = 30 * 24 * time.Hour
	agentRenewAt  = 10 * 24 * time.Hour
)

// CertIssuer keeps, per pool, a CA Secret only the operator reads and an agent Secret (tls.crt, tls.key,
// ca.crt) the agents mount, both in the agents' namespace: no tenant can read a pool's key.
type CertIssuer struct {
	Client client.Client
	Clock  clock.PassiveClock
}

// NewCertIssuer returns a CertIssuer on the real clock.
func NewCertIssuer(c client.Client) *CertIssuer {
	return &CertIssuer{Client: c, Clock: clock.RealClock{}}
}

// EnsurePoolSecret creates the pool's certificates, or renews whichever is close to expiry. It says what it
// issued ("" when the certificates were current), for the pool's Event.
func (i *CertIssuer) EnsurePoolSecret(ctx context.Context, pool *fxv1.TransferPool, namespace, name string) (string, error) {
	now := i.Clock.Now()
	caSecret, err := i.get(ctx, namespace, name+"-ca")
	if err != nil {
		return "", err
	}
	ca := pki.KeyPair{CertPEM: caSecret[pki.CertKey], KeyPEM: caSecret[pki.CAKeyKey]}
	bundle := caSecret[pki.BundleKey]
	caChanged := false
	if renew, err := pki.NeedsRenewal(ca.CertPEM, now, caRenewBefore); len(ca.CertPEM) == 0 || err != nil || renew {
		if ca, err = pki.NewCA(pool.Namespace, pool.Name, now, caValidity); err != nil {
			return "", fmt.Errorf("creating the CA of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		if bundle, err = pki.AppendToBundle(bundle, ca.CertPEM); err != nil {
			return "", fmt.Errorf("adding the new CA to the bundle of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		if bundle, err = pki.PruneBundle(bundle, now); err != nil {
			return "", fmt.Errorf("pruning the CA bundle of pool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		caChanged = true
		if err := i.apply(ctx, pool, namespace, name+"-ca", map[string][]byte{
			pki.CertKey: ca.CertPEM, pki.CAKeyKey: ca.KeyPEM, pki.BundleKey: bundle,
		}); err != nil {
			return "", err
		}
	}

	agentSecret, err := i.get(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	renew, err := pki.NeedsRenewal(agentSecret[pki.CertKey], now, agentRenewAt)
	if !caChanged && err == nil && !renew && signedBy(agentSecret[pki.CertKey], ca.CertPEM) {
		return "", nil
	}
	leaf, err := pki.IssueAgent(ca, pool.Namespace, pool.Name, now, agentValidity)
	if err != nil {
		return "", fmt.Errorf("issuing the agent certificate of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	if err := i.apply(ctx, pool, namespace, name, map[string][]byte{pki.CertKey: leaf.CertPEM, pki.KeyKey: leaf.KeyPEM, pki.BundleKey: bundle}); err != nil {
		return "", err
	}
	what := "issued the agents' certificate"
	if caChanged {
		what = "issued a CA (the bundle keeps the previous one until it expires) and the agents' certificate"
	}
	return fmt.Sprintf("%s in Secret %s/%s, valid until %s", what, namespace, name,
		now.Add(agentValidity).UTC().Format(time.RFC3339)), nil
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

// signedBy reports whether the first certificate of leafPEM was signed by the CA in caPEM.
func signedBy(leafPEM, caPEM []byte) bool {
	leaves, err1 := pki.ParseCertificates(leafPEM)
	cas, err2 := pki.ParseCertificates(caPEM)
	if err := errors.Join(err1, err2); err != nil || len(leaves) == 0 || len(cas) == 0 {
		return false
	}
	return leaves[0].CheckSignatureFrom(cas[0]) == nil
}
