// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/pki"
)

// nodeNameExtra is the user extra the API server adds for a ServiceAccount token bound to a pod: the node the
// pod runs on. The CSR API copies the requester's extras into the request, so the node is the API server's
// word, not the agent's.
const nodeNameExtra = "authentication.kubernetes.io/node-name"

// csrNodeIndex indexes fabricxfer.io/agent CSRs by the node of the token that created them.
const csrNodeIndex = "fabricxfer.io/csr-node"

// keepSignedFor is how long a signed or denied request stays for an admin to read.
const keepSignedFor = time.Hour

// NodeCertReconciler is the signer fabricxfer.io/agent: it signs an agent's CertificateSigningRequest with
// its pool's CA when the request comes from that pool's agent token bound to a node the pool selects and asks
// for exactly that node's certificate, and denies it, saying why, otherwise. It deletes the requests of a
// node that left its pool (and of a pool that is gone) at once, and every other one an hour after it was
// answered; the certificate itself lives only in its agent's memory.
type NodeCertReconciler struct {
	client.Client
	Clock  clock.PassiveClock
	Agent  AgentSettings
	Issuer *CertIssuer
	// Validity is the life of a signed certificate (default NodeCertValidity); a request's
	// spec.expirationSeconds may shorten it.
	Validity time.Duration
}

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=approve;sign,resourceNames=fabricxfer.io/agent

// Reconcile answers one request, or deletes it when it is no longer needed.
func (r *NodeCertReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := r.Get(ctx, req.NamespacedName, csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != pki.SignerName || !csr.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	pool, node, why, err := r.check(ctx, csr)
	if err != nil {
		return reconcile.Result{}, err
	}
	if answered, at := answeredAt(csr); answered {
		// The certificate of a node that left its pool goes at once; other answers stay until an admin (and the
		// agent, for a denial's reason) had time to read them.
		left := why != "" && len(csr.Status.Certificate) > 0
		if wait := at.Add(keepSignedFor).Sub(r.Clock.Now()); !left && wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(r.Delete(ctx, csr, client.Preconditions{UID: &csr.UID}))
	}
	if why != "" {
		return reconcile.Result{}, r.answer(ctx, csr, certificatesv1.CertificateDenied, "NotThisNode", why, nil)
	}
	ca, ok, err := r.Issuer.CA(ctx, r.Agent.namespace(), tlsSecretName(pool))
	if err != nil {
		return reconcile.Result{}, err
	}
	if !ok {
		return reconcile.Result{RequeueAfter: time.Second}, nil // PoolCertReconciler issues the CA
	}
	validity := r.Validity
	if validity <= 0 {
		validity = NodeCertValidity
	}
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < validity {
		validity = time.Duration(*s) * time.Second
	}
	cert, err := pki.SignNodeRequest(ca, csr.Spec.Request, pool.Namespace, pool.Name, node, r.Clock.Now(), validity)
	if err != nil {
		return reconcile.Result{}, r.answer(ctx, csr, certificatesv1.CertificateDenied, "BadRequest", err.Error(), nil)
	}
	if err := r.answer(ctx, csr, certificatesv1.CertificateApproved, "NodeOfPool",
		fmt.Sprintf("node %s of pool %s/%s", node, pool.Namespace, pool.Name), cert); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: keepSignedFor}, nil
}

// check finds who asked and whether they may have this certificate: the agents' ServiceAccount of the pool
// the request names, with a token bound to a node that pool selects. why says what is wrong ("" when
// nothing); pool is nil when it does not exist.
func (r *NodeCertReconciler) check(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (*fxv1.TransferPool, string, string, error) {
	key := client.ObjectKey{Namespace: csr.Labels[fxv1.LabelPoolNamespace], Name: csr.Labels[fxv1.LabelPoolName]}
	if key.Namespace == "" || key.Name == "" {
		return nil, "", fmt.Sprintf("the request names no pool (labels %s and %s)", fxv1.LabelPoolNamespace, fxv1.LabelPoolName), nil
	}
	want := "system:serviceaccount:" + r.Agent.namespace() + ":" + AgentObjectName(key.Namespace, key.Name)
	if csr.Spec.Username != want {
		return nil, "", fmt.Sprintf("requested by %q, not by the agents of pool %s (%s)", csr.Spec.Username, key, want), nil
	}
	nodes := csr.Spec.Extra[nodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return nil, "", "the requester's token is not bound to a pod on a node, so it cannot say which node it is", nil
	}
	node := nodes[0]
	pool := &fxv1.TransferPool{}
	if err := r.Get(ctx, key, pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, node, fmt.Sprintf("pool %s does not exist", key), nil
		}
		return nil, "", "", fmt.Errorf("reading pool %s: %w", key, err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return pool, node, fmt.Sprintf("pool %s is being deleted", key), nil
	}
	n := &corev1.Node{}
	if err := r.Get(ctx, client.ObjectKey{Name: node}, n); err != nil {
		if apierrors.IsNotFound(err) {
			return pool, node, fmt.Sprintf("node %s does not exist", node), nil
		}
		return nil, "", "", fmt.Errorf("reading node %s: %w", node, err)
	}
	if !selects(pool, n) {
		return pool, node, fmt.Sprintf("pool %s does not select node %s", key, node), nil
	}
	return pool, node, "", nil
}

// answer approves (with the certificate) or denies a request. Approval and certificate are two subresources,
// so two writes; a crash between them leaves an approved request without a certificate, which the next
// reconcile signs.
func (r *NodeCertReconciler) answer(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, verdict certificatesv1.RequestConditionType, reason, msg string, cert []byte) error {
	if !hasCondition(csr, verdict) {
		now := metav1.NewTime(r.Clock.Now())
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: verdict, Status: corev1.ConditionTrue, Reason: reason, Message: msg, LastUpdateTime: now, LastTransitionTime: now})
		if err := r.SubResource("approval").Update(ctx, csr); err != nil {
			return fmt.Errorf("%s certificate request %s: %w", strings.ToLower(string(verdict)), csr.Name, err)
		}
	}
	if cert == nil {
		return nil
	}
	csr.Status.Certificate = cert
	if err := r.Status().Update(ctx, csr); err != nil {
		return fmt.Errorf("writing the certificate of request %s: %w", csr.Name, err)
	}
	return nil
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// answeredAt says whether a request was signed, denied or failed, and when.
func answeredAt(csr *certificatesv1.CertificateSigningRequest) (bool, time.Time) {
	at := csr.CreationTimestamp.Time
	answered := len(csr.Status.Certificate) > 0
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			answered = true
		}
		if c.LastUpdateTime.After(at) {
			at = c.LastUpdateTime.Time
		}
	}
	return answered, at
}

// SetupWithManager watches the signer's requests, and the Nodes and pools that decide whether a node's
// requests may stay.
func (r *NodeCertReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &certificatesv1.CertificateSigningRequest{}, csrNodeIndex,
		func(o client.Object) []string {
			csr := o.(*certificatesv1.CertificateSigningRequest)
			if n := csr.Spec.Extra[nodeNameExtra]; len(n) == 1 {
				return []string{n[0]}
			}
			return nil
		}); err != nil {
		return fmt.Errorf("indexing certificate requests by node: %w", err)
	}
	requestsOf := func(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
		list := &certificatesv1.CertificateSigningRequestList{}
		if err := mgr.GetClient().List(ctx, list, opts...); err != nil {
			mgr.GetLogger().Error(err, "listing certificate requests to requeue")
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, c := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Name: c.Name}})
		}
		return out
	}
	return ctrl.ControllerManagedBy(mgr).
		Named("nodecert").
		For(&certificatesv1.CertificateSigningRequest{}, ctrl.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*certificatesv1.CertificateSigningRequest).Spec.SignerName == pki.SignerName
		}))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return requestsOf(ctx, client.MatchingFields{csrNodeIndex: o.GetName()})
		}), ctrl.WithPredicates(nodeLeftPredicate())).
		Watches(&fxv1.TransferPool{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return requestsOf(ctx, client.MatchingLabels{fxv1.LabelPoolName: o.GetName(), fxv1.LabelPoolNamespace: o.GetNamespace()})
		}), ctrl.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, deletedPredicate()))).
		Complete(r)
}

// nodeLeftPredicate passes Node deletions and label changes (a selector may no longer match).
func nodeLeftPredicate() predicate.Predicate {
	return predicate.Or(predicate.LabelChangedPredicate{}, deletedPredicate())
}

func deletedPredicate() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(e event.UpdateEvent) bool { return !e.ObjectNew.GetDeletionTimestamp().IsZero() },
		DeleteFunc:  func(event.DeleteEvent) bool { return true },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}
