// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// certFinalizer deletes a pool's certificate Secrets, which live in the agents' namespace and cannot carry an
// owner reference to it. It is the certificate controller's own: the pool controller's finalizer removes the
// agents, this one what they authenticate with, so neither controller reaches into the other's objects.
const certFinalizer = "fabricxfer.io/agent-certificates"

// PoolSecretIssuer creates or rotates the Secrets that hold a pool's agent-to-agent certificates.
type PoolSecretIssuer interface {
	// EnsurePoolSecret issues or renews what is due and says what it did.
	EnsurePoolSecret(ctx context.Context, pool *fxv1.TransferPool, namespace, name string) (PoolCertificates, error)
}

// PoolCertReconciler keeps each pool's agent certificates: the pool's CA (a Secret only the operator reads)
// and the agents' trust bundle, issued once the pool runs agents, renewed before they expire, deleted with the
// pool. What it did shows as the pool's CertificatesReady condition and as Events. Signing each agent's own
// certificate is NodeCertReconciler's.
type PoolCertReconciler struct {
	client.Client
	Clock clock.PassiveClock
	Agent AgentSettings
	// Issuer issues the certificates; nil (the operator's --issue-agent-certs=false: the admin provides them)
	// issues none and only lets pools that carry the finalizer from an earlier run go.
	Issuer PoolSecretIssuer
	// Recorder records Events on pools; nil records none.
	Recorder events.EventRecorder
	// APIReader reads a pool from the API server when a write met a newer version; the Client when nil.
	APIReader client.Reader
}

// recheckCerts bounds the wait before looking at a pool's certificates again, should a renewal time be lost.
const recheckCerts = 12 * time.Hour

// Reconcile issues or renews one pool's certificates and writes its CertificatesReady condition.
func (r *PoolCertReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	pool := &fxv1.TransferPool{}
	if err := r.Get(ctx, req.NamespacedName, pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, pool)
	}
	if r.Issuer == nil {
		return ctrl.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(pool, certFinalizer) {
		// Before the first Secret: a pool being deleted refuses new finalizers, so nothing is issued for it.
		if _, err := setPoolFinalizer(ctx, r.Client, r.apiReader(), pool, certFinalizer, true); err != nil {
			return ctrl.Result{}, err
		}
		if !controllerutil.ContainsFinalizer(pool, certFinalizer) {
			return ctrl.Result{}, nil // gone, replaced or being deleted: its own event brings the next reconcile
		}
	}

	cond := metav1.Condition{Type: fxv1.ConditionCertificatesReady, ObservedGeneration: pool.Generation}
	var issued PoolCertificates
	defer func() {
		// What was issued is announced whatever becomes of the condition: the Secrets are written, and the
		// next pass finds nothing to issue.
		record(r.Recorder, pool, "IssueCertificates", certEvents(nil, nil, issued))
		if cond.Reason == "" {
			return // nothing was concluded (reading the pool's agents failed): the condition stays as it was
		}
		// The other controllers write the rest of the status: only this condition is written, under the
		// pool's resourceVersion, merged with theirs on a conflict (writePool).
		was, wrote, err := setPoolCondition(ctx, r.Client, r.apiReader(), pool, cond)
		if err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("writing the certificate condition of pool %s: %w", req, err))
			return
		}
		if wrote {
			// A failure is announced once, when the condition written turns to it.
			now := meta.FindStatusCondition(pool.Status.Conditions, fxv1.ConditionCertificatesReady)
			record(r.Recorder, pool, "IssueCertificates", certEvents(was, now, PoolCertificates{}))
		}
	}()

	running, err := r.agentsRun(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !running {
		cond.Status, cond.Reason = metav1.ConditionFalse, fxv1.ReasonWaitingForAgents
		cond.Message = "the pool runs no agents (refused spec, conflict, or not applied yet); certificates are issued once it does"
		return ctrl.Result{}, nil
	}
	issued, err = r.Issuer.EnsurePoolSecret(ctx, pool, r.Agent.namespace(), tlsSecretName(pool))
	if err != nil {
		err = fmt.Errorf("issuing agent certificates for pool %s: %w", req, err)
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, fxv1.ReasonCertificatesFailed, err.Error()
		return ctrl.Result{}, err
	}
	cond.Status, cond.Reason = metav1.ConditionTrue, fxv1.ReasonCertificatesIssued
	cond.Message = fmt.Sprintf("the pool's CA is valid until %s; its bundle is in Secret %s/%s; agents' certificates are signed on their requests",
		issued.CAExpires.UTC().Format(time.RFC3339), r.Agent.namespace(), tlsSecretName(pool))
	after := recheckCerts
	if !issued.Next.IsZero() {
		after = min(after, max(issued.Next.Sub(r.Clock.Now()), time.Second))
	}
	return ctrl.Result{RequeueAfter: after}, nil
}

// agentsRun reports whether the pool controller runs agents for the pool: its DaemonSet exists. A pool the
// operator refuses, or one that lost its nodes to an earlier pool, has none, and gets no certificates.
func (r *PoolCertReconciler) agentsRun(ctx context.Context, pool *fxv1.TransferPool) (bool, error) {
	ds := &appsv1.DaemonSetList{}
	if err := r.List(ctx, ds, client.InNamespace(r.Agent.namespace()), ownerLabels(pool)); err != nil {
		return false, fmt.Errorf("listing the agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	return len(ds.Items) > 0, nil
}

// finalize deletes the pool's certificate Secrets once its agents are gone (they stop before what they
// authenticate with goes), then lets the pool go.
func (r *PoolCertReconciler) finalize(ctx context.Context, pool *fxv1.TransferPool) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, certFinalizer) {
		return ctrl.Result{}, nil
	}
	running, err := r.agentsRun(ctx, pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if running {
		return ctrl.Result{RequeueAfter: time.Second}, nil // the DaemonSet's deletion brings us back sooner
	}
	if _, err := deleteOwned(ctx, r.Client, pool, &corev1.SecretList{}, client.InNamespace(r.Agent.namespace())); err != nil {
		return ctrl.Result{}, err
	}
	_, err = setPoolFinalizer(ctx, r.Client, r.apiReader(), pool, certFinalizer, false)
	return ctrl.Result{}, err
}

func (r *PoolCertReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// certEvents are the Events of one pass: certificates issued or rotated, and a failure when the condition
// (now, nil when none was written) turns to it, not on every retry.
func certEvents(was, now *metav1.Condition, issued PoolCertificates) []pendingEvent {
	var evs []pendingEvent
	switch {
	case issued.Change == "":
	case issued.First:
		evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventCertsIssued, issued.Change})
	default:
		evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventCertsRotated, issued.Change})
	}
	if now != nil && now.Reason == fxv1.ReasonCertificatesFailed && (was == nil || was.Reason != now.Reason) {
		evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventCertsFailed, now.Message})
	}
	return evs
}

// SetupWithManager watches pools (spec changes and deletion), their agent DaemonSets (certificates follow
// the agents) and their certificate Secrets (an edited or deleted Secret is issued again).
func (r *PoolCertReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	ownedBy := handler.EnqueueRequestsFromMapFunc(poolOfOwned)
	return ctrl.NewControllerManagedBy(mgr).
		Named("poolcertificates").
		For(&fxv1.TransferPool{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, beingDeleted()))).
		Watches(&appsv1.DaemonSet{}, ownedBy, builder.WithPredicates(createdOrDeleted())).
		Watches(&corev1.Secret{}, ownedBy).
		Complete(r)
}

// beingDeleted passes every update of a pool whose deletion began (another finalizer going changes no
// generation, and the certificate Secrets wait for it).
func beingDeleted() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return !e.ObjectNew.GetDeletionTimestamp().IsZero() }}
}

// createdOrDeleted passes objects appearing and going, not their updates (a DaemonSet's status changes often).
func createdOrDeleted() predicate.Predicate {
	return predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
}
