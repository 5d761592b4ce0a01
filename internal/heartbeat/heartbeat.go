// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package heartbeat

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// DefaultLeaseDuration stands for a Lease that says none: the default heartbeat timeout.
const DefaultLeaseDuration = 30 * time.Second

// defaultPeriodSeconds is spec.agent.heartbeatSeconds when the pool leaves it unset.
const defaultPeriodSeconds = 10

// Timeout is how old a node's heartbeat may be before the node counts as not ready: three periods of
// heartbeatSeconds (10 s when not positive), so one lost or late write does not flap the pool.
func Timeout(heartbeatSeconds int32) time.Duration {
	if heartbeatSeconds <= 0 {
		heartbeatSeconds = defaultPeriodSeconds
	}
	return 3 * time.Duration(heartbeatSeconds) * time.Second
}

// PoolTimeout is Timeout for a pool's configured period.
func PoolTimeout(pool *fxv1.TransferPool) time.Duration {
	return Timeout(pool.Spec.Agent.HeartbeatSeconds)
}

// Key names one agent's Lease: the pool it runs for and its node.
type Key struct {
	PoolNamespace, PoolName, Node string
}

// String is the key as one index value: pool namespace/pool/node.
func (k Key) String() string { return k.PoolNamespace + "/" + k.PoolName + "/" + k.Node }

// KeyOf is the key of the agent that wrote a report.
func KeyOf(tn *fxv1.TransferNode) Key {
	return Key{PoolNamespace: tn.Spec.PoolNamespace, PoolName: tn.Spec.PoolName, Node: tn.Name}
}

// Beats are the renew times of agents' Leases.
type Beats map[Key]time.Time

// LeaseSelector selects agents' Leases: those that carry the pool label (not a kubelet's node lease, nor a
// leader election).
func LeaseSelector() labels.Selector {
	req, err := labels.NewRequirement(fxv1.LabelPoolName, selection.Exists, nil)
	if err != nil {
		panic(fmt.Sprintf("building the heartbeat Lease selector: %v", err)) // a constant label: cannot fail
	}
	return labels.NewSelector().Add(*req)
}

// List reads every agent's heartbeat Lease (from the operator's cache, without copies, or the API server for
// a plain client).
func List(ctx context.Context, c client.Reader) (Beats, error) {
	leases := &coordinationv1.LeaseList{}
	if err := c.List(ctx, leases, client.MatchingLabelsSelector{Selector: LeaseSelector()}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing heartbeat leases: %w", err)
	}
	hb := make(Beats, len(leases.Items))
	for i := range leases.Items {
		hb.Add(&leases.Items[i])
	}
	return hb, nil
}

// Add counts one Lease, keeping the later renewal where two name the same key. A Lease that is not an agent's
// heartbeat, or holds no renewal, counts for nothing.
func (h Beats) Add(l *coordinationv1.Lease) {
	if key, renew, ok := FromLease(l); ok && renew.After(h[key]) {
		h[key] = renew
	}
}

// FromLease reads an agent Lease's key and renew time; ok is false for any other Lease, or one never renewed.
func FromLease(l *coordinationv1.Lease) (_ Key, renew time.Time, ok bool) {
	pool := l.Labels[fxv1.LabelPoolName]
	if pool == "" || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return Key{}, time.Time{}, false
	}
	return Key{PoolNamespace: l.Namespace, PoolName: pool, Node: *l.Spec.HolderIdentity}, l.Spec.RenewTime.Time, true
}

// Last is when the agent that wrote tn last showed it was alive: the later of its Lease's renewal and the
// report's own lastHeartbeat. Zero when neither exists.
func (h Beats) Last(tn *fxv1.TransferNode) time.Time {
	return h.latest(tn, func(time.Time) bool { return true })
}

// LastAt is Last at now, leaving out a beat more than timeout ahead of now: the agent's clock and the
// operator's agree to far less than a timeout, and a beat further ahead was written to be fresh for ever (a
// node's token writes its own report and Lease), which would keep a dead node Ready until its date. Left out, not
// judged: a report written while the node's clock ran ahead must not hide its Lease's current renewals.
func (h Beats) LastAt(tn *fxv1.TransferNode, now time.Time, timeout time.Duration) time.Time {
	return h.latest(tn, func(at time.Time) bool { return at.Sub(now) < timeout })
}

// latest is the later of tn's Lease renewal and its report's lastHeartbeat among those counted.
func (h Beats) latest(tn *fxv1.TransferNode, counted func(time.Time) bool) time.Time {
	var at time.Time
	if tn.Status.LastHeartbeat != nil && counted(tn.Status.LastHeartbeat.Time) {
		at = tn.Status.LastHeartbeat.Time
	}
	if renew := h[KeyOf(tn)]; renew.After(at) && counted(renew) {
		at = renew
	}
	return at
}

// Fresh reports whether a TransferNode's agent heartbeat is younger than timeout at now (LastAt).
func (h Beats) Fresh(tn *fxv1.TransferNode, now time.Time, timeout time.Duration) bool {
	at := h.LastAt(tn, now, timeout)
	return !at.IsZero() && now.Sub(at) < timeout
}

// IsAgentLease reports whether obj is an agent's heartbeat Lease.
func IsAgentLease(obj client.Object) bool {
	l, ok := obj.(*coordinationv1.Lease)
	return ok && l.Labels[fxv1.LabelPoolName] != ""
}

// RenewalChangesFreshness reports whether a Lease update can change what is concluded about its node:
// anything but a renewal of a Lease that was still valid when the renewal was seen. Such a renewal only
// pushes an expiry further out, which a reconciler's requeue at the earliest expiry already covers.
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
	duration := DefaultLeaseDuration
	if d := old.Spec.LeaseDurationSeconds; d != nil && *d > 0 {
		duration = time.Duration(*d) * time.Second
	}
	return now.Sub(old.Spec.RenewTime.Time) >= duration
}

func equalPtr[T comparable](a, b *T) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}
