// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// Agents heartbeat with a coordination.k8s.io Lease per (pool, node) in the pool's namespace, labelled with
// the pool and held by the node; the TransferNode is rewritten only when the report changes. A node's
// heartbeat is the later of its Lease's renewTime and its TransferNode's status.lastHeartbeat, so agents that
// predate Leases (status every period, no Lease) keep counting.

// defaultLeaseDuration stands for a Lease that says none: the default heartbeat timeout.
const defaultLeaseDuration = 30 * time.Second

// expiryMargin is added to a requeue at a heartbeat's expiry, so the reconcile runs after it, not at it.
const expiryMargin = 50 * time.Millisecond

// HeartbeatKey names one agent's Lease: the pool it runs for and its node.
type HeartbeatKey struct {
	PoolNamespace, PoolName, Node string
}

// Heartbeats are the renew times of agents' Leases.
type Heartbeats map[HeartbeatKey]time.Time

// heartbeatLeaseSelector selects agents' Leases: those that carry the pool label.
func heartbeatLeaseSelector() labels.Selector {
	req, err := labels.NewRequirement(fxv1.LabelPoolName, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("building the heartbeat Lease selector: %v", err)) // a constant label: cannot fail
	}
	return labels.NewSelector().Add(*req)
}

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
		&coordinationv1.Lease{}:      {Label: heartbeatLeaseSelector()},
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

// ListHeartbeats reads every agent's heartbeat Lease (from the operator's cache, without copies, or the API
// server for a plain client).
func ListHeartbeats(ctx context.Context, c client.Reader) (Heartbeats, error) {
	leases := &coordinationv1.LeaseList{}
	if err := c.List(ctx, leases, client.MatchingLabelsSelector{Selector: heartbeatLeaseSelector()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing heartbeat leases: %w", err)
	}
	hb := make(Heartbeats, len(leases.Items))
	for i := range leases.Items {
		key, renew, ok := leaseHeartbeat(&leases.Items[i])
		if ok && renew.After(hb[key]) {
			hb[key] = renew
		}
	}
	return hb, nil
}

// leaseHeartbeat reads an agent Lease's key and renew time.
func leaseHeartbeat(l *coordinationv1.Lease) (HeartbeatKey, time.Time, bool) {
	pool := l.Labels[fxv1.LabelPoolName]
	if pool == "" || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return HeartbeatKey{}, time.Time{}, false
	}
	return HeartbeatKey{PoolNamespace: l.Namespace, PoolName: pool, Node: *l.Spec.HolderIdentity}, l.Spec.RenewTime.Time, true
}

// LastHeartbeat is when the agent that wrote tn last showed it was alive: the later of its Lease's renewal
// and the report's own lastHeartbeat. Zero when neither exists.
func (h Heartbeats) LastHeartbeat(tn *fxv1.TransferNode) time.Time {
	var at time.Time
	if tn.Status.LastHeartbeat != nil {
		at = tn.Status.LastHeartbeat.Time
	}
	if renew := h[HeartbeatKey{PoolNamespace: tn.Spec.PoolNamespace, PoolName: tn.Spec.PoolName, Node: tn.Name}]; renew.After(at) {
		at = renew
	}
	return at
}

// heartbeatFresh reports whether a TransferNode's agent heartbeat is younger than timeout at now.
func (h Heartbeats) heartbeatFresh(tn *fxv1.TransferNode, now time.Time, timeout time.Duration) bool {
	at := h.LastHeartbeat(tn)
	return !at.IsZero() && now.Sub(at) < timeout
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

// isAgentLease reports whether obj is an agent's heartbeat Lease.
func isAgentLease(obj client.Object) bool {
	l, ok := obj.(*coordinationv1.Lease)
	return ok && l.Labels[fxv1.LabelPoolName] != ""
}

// RenewalChangesFreshness reports whether a Lease update can change what the operator concludes: anything
// but a renewal of a Lease that was still valid when the renewal was seen. Such a renewal only pushes an
// expiry further out, which the reconcilers' requeue at the earliest expiry already covers.
func RenewalChangesFreshness(old, updated *coordinationv1.Lease, now time.Time) bool {
	if old.Spec.RenewTime == nil || updated.Spec.RenewTime == nil ||
		!equalPtr(old.Spec.HolderIdentity, updated.Spec.HolderIdentity) ||
		!equalPtr(old.Spec.LeaseDurationSeconds, updated.Spec.LeaseDurationSeconds) ||
		old.Labels[fxv1.LabelPoolName] != updated.Labels[fxv1.LabelPoolName] {
		return true
	}
	if !updated.Spec.RenewTime.After(old.Spec.RenewTime.Time) {
		return true // not a renewal: the heartbeat moved back (a restored or rewritten Lease)
	}
	duration := defaultLeaseDuration
	if d := old.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		duration = time.Duration(*d) * time.Second
	}
	return now.Sub(old.Spec.RenewTime.Time) >= duration
}

func equalPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// heartbeatPredicate passes agents' Leases being created or deleted and updates that change freshness, and
// drops every plain renewal: at a thousand nodes those are a hundred events a second that change nothing.
func heartbeatPredicate(clk clock.PassiveClock) predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return isAgentLease(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return isAgentLease(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return isAgentLease(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, ok1 := e.ObjectOld.(*coordinationv1.Lease)
			updated, ok2 := e.ObjectNew.(*coordinationv1.Lease)
			if !ok1 || !ok2 || (!isAgentLease(old) && !isAgentLease(updated)) {
				return false
			}
			return RenewalChangesFreshness(old, updated, clk.Now())
		},
	}
}
