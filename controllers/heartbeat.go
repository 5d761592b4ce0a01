// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// The heartbeat rule itself (which Lease is whose, when a node is fresh) is package heartbeat's, shared with
// xferctl; here are the operator's uses of it: what its cache holds, when a reconciler looks again, and which
// Lease events reach the reconcilers.

// expiryMargin is added to a requeue at a heartbeat's expiry, so the reconcile runs after it, not at it.
const expiryMargin = 50 * time.Millisecond

// CacheByObject restricts the operator's informers to what it owns: agents' heartbeat Leases (not a kubelet's
// per node, nor leader elections), and DaemonSets, ServiceAccounts and Secrets of the agents' namespace,
// Roles, RoleBindings and ClusterRoleBindings, all carrying the operator's managed-by label. Nothing else of
// those kinds is held in memory, delivered as an event, or needs RBAC to list. Pass it as the manager's
// cache.Options.ByObject.
func CacheByObject(agentNamespace string) map[client.Object]cache.ByObject {
	if agentNamespace == "" {
		agentNamespace = DefaultAgentNamespace
	}
	owned := labels.SelectorFromSet(labels.Set{"app.kubernetes.io/managed-by": managedBy})
	inAgentNamespace := cache.ByObject{Label: owned, Namespaces: map[string]cache.Config{agentNamespace: {}}}
	return map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}:      {Label: heartbeat.LeaseSelector()},
		&appsv1.DaemonSet{}:          inAgentNamespace,
		&corev1.ServiceAccount{}:     inAgentNamespace,
		&corev1.Secret{}:             inAgentNamespace,
		&rbacv1.Role{}:               {Label: owned},
		&rbacv1.RoleBinding{}:        {Label: owned},
		&rbacv1.ClusterRoleBinding{}: {Label: owned},
		// Only the requests of the operator's own signer (agents' node certificates).
		&certificatesv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", pki.SignerName)},
	}
}

// expiryTracker finds when a reconciler must look again: at the earliest moment a fresh heartbeat expires,
// and no later than one timeout while some node that reported is stale (a renewal the event filter judged
// fresh under the Lease's own duration is then still counted, should the pool's timeout be shorter).
type expiryTracker struct {
	now  time.Time
	next time.Duration
}

func (e *expiryTracker) add(d time.Duration) {
	if d <= 0 {
		d = expiryMargin
	}
	if e.next == 0 || d < e.next {
		e.next = d
	}
}

// fresh records a heartbeat at that is fresh until at+timeout.
func (e *expiryTracker) fresh(at time.Time, timeout time.Duration) {
	e.add(at.Add(timeout).Sub(e.now) + expiryMargin)
}

// stale records a node whose heartbeat expired.
func (e *expiryTracker) stale(timeout time.Duration) { e.add(timeout) }

// after is the requeue delay; zero when nothing will expire.
func (e *expiryTracker) after() time.Duration { return e.next }

// heartbeatPredicate passes agents' Leases being created or deleted and updates that change freshness, and
// drops every plain renewal: at a thousand nodes those are a hundred events a second that change nothing.
func heartbeatPredicate(clk clock.PassiveClock) predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return heartbeat.IsAgentLease(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return heartbeat.IsAgentLease(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return heartbeat.IsAgentLease(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*coordinationv1.Lease)
			updated, ok2 := e.ObjectNew.(*coordinationv1.Lease)
			if !ok1 || !ok2 || (!heartbeat.IsAgentLease(old) && !heartbeat.IsAgentLease(updated)) {
				return false
			}
			return heartbeat.RenewalChangesFreshness(old, updated, clk.Now())
		},
	}
}
