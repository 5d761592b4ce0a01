// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// waitCertCondition waits for the pool's CertificatesReady condition with the status and reason, written for
// the pool's current generation.
func waitCertCondition(t *testing.T, c client.Client, pool *fxv1.TransferPool, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	return waitPoolCondition(t, c, pool, fxv1.ConditionCertificatesReady, status, reason)
}

// waitPoolCondition waits for the pool's condition of type typ with the status and reason, written for the
// pool's current generation, and returns it.
func waitPoolCondition(t *testing.T, c client.Client, pool *fxv1.TransferPool, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	eventually(t, settle, fmt.Sprintf("pool %s %s=%s/%s", pool.Name, typ, status, reason), func() error {
		p, err := getPool(c, pool)
		if err != nil {
			return err
		}
		got = meta.FindStatusCondition(p.Status.Conditions, typ)
		if got == nil || got.Status != status || got.Reason != reason || got.ObservedGeneration != p.Generation {
			return fmt.Errorf("condition %+v at generation %d", got, p.Generation)
		}
		return nil
	})
	return got
}

// writeCASecret puts a pool CA into the operator's CA Secret before the pool exists, as an earlier run would
// have left it.
func writeCASecret(t *testing.T, c client.Client, ns, pool string, ca pki.KeyPair, immutable bool) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testAgentNamespace, Name: AgentObjectName(ns, pool) + "-tls-ca",
		Labels: map[string]string{"app.kubernetes.io/managed-by": managedBy, fxv1.LabelPoolName: pool, fxv1.LabelPoolNamespace: ns}},
		Type: corev1.SecretTypeOpaque, Data: map[string][]byte{pki.CertKey: ca.CertPEM, pki.CAKeyKey: ca.KeyPEM, pki.BundleKey: ca.CertPEM}}
	if immutable {
		s.Immutable = &immutable
	}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatalf("writing the CA Secret: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), s) })
	return s
}

// The certificate controller issues a pool's CA once its agents run, says so in CertificatesReady (for the
// pool's generation) and a CertificatesIssued Event, holds its own finalizer, and deletes the Secrets with the
// pool, after the agents.
func TestPoolCertificatesIssuedAndDeletedWithThePool(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	pool := newPool(t, c, ns, "kv", "poolcert-issue") // no node carries the group: agents are applied all the same
	cond := waitCertCondition(t, c, pool, metav1.ConditionTrue, fxv1.ReasonCertificatesIssued)
	if !strings.Contains(cond.Message, AgentObjectName(ns, "kv")+"-tls") {
		t.Errorf("the condition does not name the bundle's Secret: %q", cond.Message)
	}
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventCertsIssued, "valid until")
	got, err := getPool(c, pool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got.Finalizers, certFinalizer) || !slices.Contains(got.Finalizers, poolFinalizer) {
		t.Errorf("finalizers %v, want the pool controller's and the certificate controller's", got.Finalizers)
	}
	// The pool controller's own conditions stand beside this one once both have written (either may be first;
	// each writes under the pool's resourceVersion, so neither drops the other's).
	eventually(t, settle, "the pool's Ready condition beside CertificatesReady", func() error {
		p, err := getPool(c, pool)
		if err != nil {
			return err
		}
		if meta.FindStatusCondition(p.Status.Conditions, fxv1.ConditionReady) == nil ||
			meta.FindStatusCondition(p.Status.Conditions, fxv1.ConditionCertificatesReady) == nil {
			return fmt.Errorf("conditions %+v", p.Status.Conditions)
		}
		got = p
		return nil
	})

	if err := c.Delete(ctx, got); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, "the pool and its certificate Secrets gone", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(pool), &fxv1.TransferPool{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pool still there: %v", err)
		}
		for _, name := range []string{AgentObjectName(ns, "kv") + "-tls", AgentObjectName(ns, "kv") + "-tls-ca"} {
			if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("secret %s: %v", name, err)
			}
		}
		return nil
	})
}

// A CA inside its renewal window is rotated: a new CA, the old one kept in the bundle, a CertificatesRotated
// Event.
func TestPoolCertificatesRotated(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	old, err := pki.NewCA(ns, "kv", time.Now(), 10*24*time.Hour) // renewed 30 days before expiry: due now
	if err != nil {
		t.Fatal(err)
	}
	writeCASecret(t, c, ns, "kv", old, false)
	newPool(t, c, ns, "kv", "poolcert-rotate")
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeNormal, EventCertsRotated, "issued the pool's CA")
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(ns, "kv") + "-tls-ca"}, s); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(s.Data[pki.CertKey], old.CertPEM) || !bytes.Contains(s.Data[pki.BundleKey], old.CertPEM) {
		t.Error("the CA was not renewed, or the old CA left the bundle before it expired")
	}
}

// A CA the operator cannot renew (an immutable Secret in its place) fails loudly and changes nothing else:
// CertificatesReady False with the API server's reason, one CertificateIssueFailed Event, the Secret as it
// was, no agents' Secret written from a CA that was not renewed.
func TestPoolCertificatesFailure(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns := newNamespace(t, c)
	old, err := pki.NewCA(ns, "kv", time.Now(), 10*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeCASecret(t, c, ns, "kv", old, true)
	pool := newPool(t, c, ns, "kv", "poolcert-fail")
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
	cond := waitCertCondition(t, c, pool, metav1.ConditionFalse, fxv1.ReasonCertificatesFailed)
	if !strings.Contains(cond.Message, "immutable") {
		t.Errorf("the condition does not say why: %q", cond.Message)
	}
	waitEvent(t, c, ns, "TransferPool", "kv", corev1.EventTypeWarning, EventCertsFailed, "issuing agent certificates")
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(ns, "kv") + "-tls-ca"}, s); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s.Data[pki.CertKey], old.CertPEM) {
		t.Error("the immutable CA Secret changed")
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: testAgentNamespace, Name: AgentObjectName(ns, "kv") + "-tls"}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Errorf("the agents' Secret was written from a CA that was not renewed: %v", err)
	}
	// Retries do not repeat the Event.
	time.Sleep(2 * time.Second)
	if n := countEvents(t, c, ns, "TransferPool", "kv", EventCertsFailed); n != 1 {
		t.Errorf("%d CertificateIssueFailed Events, want 1", n)
	}
}

// A pool the operator refuses runs no agents and gets no certificates: CertificatesReady says it waits for them.
func TestRefusedPoolGetsNoCertificates(t *testing.T) {
	c := apiClient(t)
	ns := newNamespace(t, c)
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "kv"},
		Spec: fxv1.TransferPoolSpec{NodeSelector: map[string]string{"fabricxfer.io/test-group": "poolcert-refused"},
			Agent: fxv1.AgentSpec{Image: "attacker.example/agent:v1"}}}
	if err := c.Create(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), pool) })
	waitCertCondition(t, c, pool, metav1.ConditionFalse, fxv1.ReasonWaitingForAgents)
	if n := ownedObjects(t, c, pool); n != 0 {
		t.Errorf("%d objects written for a refused pool, want none", n)
	}
}

// countEvents counts the operator's Events of a reason about one object (an Event repeated in a series is one).
func countEvents(t *testing.T, c client.Client, namespace, kind, name, reason string) int {
	t.Helper()
	var list eventsv1.EventList
	if err := c.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason && e.ReportingController == EventRecorderName {
			n++
		}
	}
	return n
}
