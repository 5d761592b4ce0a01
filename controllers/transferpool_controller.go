// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

// FieldManager is the operator's server-side-apply field manager.
const FieldManager = "fabricxfer-operator"

// poolFinalizer removes what the pool owns outside its namespace (agents, their ServiceAccount and
// certificates in the agents' namespace, the ClusterRoleBinding), which cannot carry an owner reference to it.
const poolFinalizer = "fabricxfer.io/cluster-rbac"

// TransferPoolReconciler runs the agents of each TransferPool and keeps its status true to what agents report.
type TransferPoolReconciler struct {
	client.Client
	Scheme *runtime.Scheme
	Clock  clock.PassiveClock
	Agent  AgentSettings
	// Recorder records Events on pools (nodes joining and leaving, conflicts, refused specs); nil records none.
	Recorder events.EventRecorder

	// APIReader reads a pool from the API server, not the cache, when a status patch met a newer version
	// (another controller wrote the pool meanwhile); the Client when nil.
	APIReader client.Reader

	// applied remembers, per pool, the UID and generation whose owned objects were applied last. Heartbeats
	// reach Reconcile many times a second on a large pool; re-applying six unchanged objects each time was most
	// of the operator's API load. An event on an owned object forgets the entry, so drift is still repaired.
	appliedMu sync.Mutex
	applied   map[types.NamespacedName]appliedAt

	// written remembers each pool as this reconciler's last write (status patch, finalizer) returned it. While
	// reports arrive the pool is reconciled again before the cache shows that write; a status patch from the
	// cache's older copy, under its resourceVersion, was refused as a conflict, and each conflict returned as an
	// error doubled the pool's work-queue backoff (docs/benchmarks.md, 2026-12-02 evening).
	writtenMu sync.Mutex
	written   map[types.NamespacedName]*fxv1.TransferPool
}

type appliedAt struct {
	uid        types.UID
	generation int64
}

// The operator's RBAC: cluster-wide only what pools in any namespace need (their Role and RoleBinding, which
// grant heartbeat Leases and reading the pool, so the operator holds those verbs itself), and the agents'
// ClusterRoleBinding, which may name only the installed agent ClusterRole (bind on that name, no escalate, no
// ClusterRole writes). DaemonSets, ServiceAccounts and Secrets only in the agents' namespace (a Role there;
// the chart renders it into agent.namespace).
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/finalizers,verbs=update
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transfernodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=vpodtopologies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fabricxfer.io,resources=vpodtopologies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings;clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=fabricxfer-agent
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apps,namespace=fabricxfer-system,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=fabricxfer-system,resources=serviceaccounts;secrets,verbs=get;list;watch;create;update;patch;delete

// Reconcile applies the pool's agent objects and records what the agents report.
func (r *TransferPoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	pool := &fxv1.TransferPool{}
	if err := r.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetWritten(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	pool = r.newestOf(pool)
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, pool)
	}
	if !controllerutil.ContainsFinalizer(pool, poolFinalizer) {
		if err := setFinalizer(ctx, r.Client, pool, poolFinalizer, true); err != nil {
			return ctrl.Result{}, err
		}
		r.rememberWritten(pool)
	}

	before := pool.DeepCopy()
	obs := PoolObservation{Now: r.Clock.Now()}
	observed := false
	defer func() {
		if !observed {
			return // a status from nothing read would say no node matches
		}
		if err := r.patchStatus(ctx, before, pool, obs); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()

	if err := r.observe(ctx, pool, &obs); err != nil {
		return ctrl.Result{}, err
	}
	observed = true
	// A pool the operator refuses gets nothing written for it (objects of an earlier, valid generation stay as
	// they are) and no retry: only a new generation can change the verdict.
	obs.Invalid = ValidatePool(pool, r.Agent)
	switch {
	case obs.Invalid != nil:
	case len(OlderConflicts(pool, obs)) > 0:
		// The pool that selected these nodes first keeps them: a later pool runs no agent (two agents would
		// fight over each node's TransferNode and ports) and cannot change the first pool's conditions.
		obs.ApplyError = r.removeAgents(ctx, pool)
	default:
		if r.needsApply(pool) {
			if obs.ApplyError = r.applyOwned(ctx, pool); obs.ApplyError == nil {
				r.markApplied(pool)
			}
		}
	}
	if obs.ApplyError != nil {
		return ctrl.Result{}, obs.ApplyError
	}
	// Heartbeats age without any event (renewals that change nothing are filtered out), so look again when
	// the first fresh one expires.
	return ctrl.Result{RequeueAfter: PoolRequeueAfter(pool, obs)}, nil
}

// patchStatus writes the status computed from obs, only what changed. The certificate controller writes its
// condition beside these: the merge patch carries the pool's resourceVersion, so a patch from a copy that
// lacks the other's latest write is refused instead of dropping it. Refused, the pool is read again from the
// API server and the status computed on that copy is patched once more: a conflict is someone else's write
// to merge with, not a failure to back off from.
func (r *TransferPoolReconciler) patchStatus(ctx context.Context, before, pool *fxv1.TransferPool, obs PoolObservation) error {
	key := client.ObjectKeyFromObject(pool)
	for attempt := 1; ; attempt++ {
		pool.Status = ComputePoolStatus(pool, obs)
		if equality.Semantic.DeepEqual(before.Status, pool.Status) {
			return nil
		}
		err := r.Status().Patch(ctx, pool, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
		switch {
		case err == nil:
			r.rememberWritten(pool)
			record(r.Recorder, pool, "Reconcile", poolEvents(before.Status, pool.Status))
			return nil
		case apierrors.IsNotFound(err):
			r.forgetWritten(key)
			return nil
		case !apierrors.IsConflict(err) || attempt > 1:
			r.forgetWritten(key)
			return fmt.Errorf("patching status of pool %s: %w", key, err)
		}
		fresh := &fxv1.TransferPool{}
		if err := r.apiReader().Get(ctx, key, fresh); err != nil {
			r.forgetWritten(key)
			return client.IgnoreNotFound(fmt.Errorf("reading pool %s again after a conflicting write: %w", key, err))
		}
		if fresh.Generation != before.Generation || fresh.UID != before.UID || !fresh.DeletionTimestamp.IsZero() {
			// A new spec, a new pool or a deletion: its own event brings the next reconcile; what was observed
			// here was for the old one.
			r.forgetWritten(key)
			return nil
		}
		before, *pool = fresh.DeepCopy(), *fresh
	}
}

func (r *TransferPoolReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// newestOf is the cached pool, or this reconciler's own last write of it when the cache has not shown that
// write yet (a later resourceVersion, of the same pool).
func (r *TransferPoolReconciler) newestOf(cached *fxv1.TransferPool) *fxv1.TransferPool {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	key := client.ObjectKeyFromObject(cached)
	w, ok := r.written[key]
	if !ok {
		return cached
	}
	if w.UID == cached.UID && newerVersion(w.ResourceVersion, cached.ResourceVersion) {
		return w.DeepCopy()
	}
	delete(r.written, key) // the cache caught up (or the pool is another one)
	return cached
}

func (r *TransferPoolReconciler) rememberWritten(pool *fxv1.TransferPool) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	if r.written == nil {
		r.written = map[types.NamespacedName]*fxv1.TransferPool{}
	}
	r.written[client.ObjectKeyFromObject(pool)] = pool.DeepCopy()
}

func (r *TransferPoolReconciler) forgetWritten(key types.NamespacedName) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	delete(r.written, key)
}

func (r *TransferPoolReconciler) applyOwned(ctx context.Context, pool *fxv1.TransferPool) error {
	ds, err := DesiredDaemonSet(pool, r.Agent)
	if err != nil {
		return fmt.Errorf("building the agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	opts := []client.ApplyOption{client.FieldOwner(FieldManager), client.ForceOwnership}
	for _, obj := range []runtime.ApplyConfiguration{
		DesiredServiceAccount(pool, r.Agent),
		DesiredRole(pool),
		DesiredRoleBinding(pool, r.Agent),
		DesiredClusterRoleBinding(pool, r.Agent),
		ds,
	} {
		if err := r.Apply(ctx, obj, opts...); err != nil {
			return fmt.Errorf("applying %T for pool %s/%s: %w", obj, pool.Namespace, pool.Name, err)
		}
	}
	return nil
}

// removeAgents deletes the pool's DaemonSet, if it has one: a pool that lost its nodes to an earlier pool.
func (r *TransferPoolReconciler) removeAgents(ctx context.Context, pool *fxv1.TransferPool) error {
	r.forgetApplied(client.ObjectKeyFromObject(pool))
	return deleteOwned(ctx, r.Client, pool, &appsv1.DaemonSetList{}, client.InNamespace(r.Agent.namespace()))
}

// deleteOwned deletes every object of the list's kind that carries the pool's owner labels, and nothing else.
func deleteOwned(ctx context.Context, c client.Client, pool *fxv1.TransferPool, list client.ObjectList, opts ...client.ListOption) error {
	if err := c.List(ctx, list, append(opts, ownerLabels(pool))...); err != nil {
		return fmt.Errorf("listing %T of pool %s/%s: %w", list, pool.Namespace, pool.Name, err)
	}
	return meta.EachListItem(list, func(o runtime.Object) error {
		obj, ok := o.(client.Object)
		if !ok {
			return fmt.Errorf("%T is not an object", o)
		}
		// The precondition makes sure the object deleted is the one whose labels were read.
		uid := obj.GetUID()
		if err := c.Delete(ctx, obj, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %T %s/%s of pool %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), pool.Namespace, pool.Name, err)
		}
		return nil
	})
}

func (r *TransferPoolReconciler) needsApply(pool *fxv1.TransferPool) bool {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	at, ok := r.applied[client.ObjectKeyFromObject(pool)]
	return !ok || at.uid != pool.UID || at.generation != pool.Generation
}

func (r *TransferPoolReconciler) markApplied(pool *fxv1.TransferPool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	if r.applied == nil {
		r.applied = map[types.NamespacedName]appliedAt{}
	}
	r.applied[client.ObjectKeyFromObject(pool)] = appliedAt{uid: pool.UID, generation: pool.Generation}
}

// forgetApplied makes the next reconcile of the pool apply its objects again.
func (r *TransferPoolReconciler) forgetApplied(key types.NamespacedName) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	delete(r.applied, key)
}

func (r *TransferPoolReconciler) observe(ctx context.Context, pool *fxv1.TransferPool, obs *PoolObservation) error {
	// Nodes, reports and Leases are only read: the cache's own objects are used without copies (at 2,000 nodes
	// copying every report for every reconcile was most of the operator's work while nodes reported).
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing nodes for pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs.Nodes = nodes.Items
	tns := &fxv1.TransferNodeList{}
	if err := r.List(ctx, tns, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing transfer nodes for pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs.TransferNodes = make(map[string]*fxv1.TransferNode, len(tns.Items))
	for i := range tns.Items {
		obs.TransferNodes[tns.Items[i].Name] = &tns.Items[i]
	}
	beats, err := heartbeat.List(ctx, r.Client)
	if err != nil {
		return fmt.Errorf("reading heartbeats for pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs.Heartbeats = beats
	pools := &fxv1.TransferPoolList{}
	if err := r.List(ctx, pools); err != nil {
		return fmt.Errorf("listing pools to find conflicts with %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	for _, p := range pools.Items {
		if p.UID != pool.UID && p.DeletionTimestamp.IsZero() {
			obs.OtherPools = append(obs.OtherPools, p)
		}
	}
	return nil
}

// finalize deletes the agents and their rights, found by the pool's owner labels: outside its namespace
// nothing else would (no owner reference can cross namespaces), and in it the garbage collector would, later.
// The certificate Secrets are the certificate controller's (its own finalizer), deleted once the agents are.
func (r *TransferPoolReconciler) finalize(ctx context.Context, pool *fxv1.TransferPool) error {
	if !controllerutil.ContainsFinalizer(pool, poolFinalizer) {
		return nil
	}
	ns := client.InNamespace(r.Agent.namespace())
	// The DaemonSet first: agents stop before their identity and certificates go.
	for _, step := range []struct {
		list client.ObjectList
		opts []client.ListOption
	}{
		{&appsv1.DaemonSetList{}, []client.ListOption{ns}},
		{&rbacv1.ClusterRoleBindingList{}, nil},
		{&corev1.ServiceAccountList{}, []client.ListOption{ns}},
		// Owned by the pool too, but the garbage collector took tens of seconds to notice a deleted pool;
		// the agents' rights should end with the pool.
		{&rbacv1.RoleBindingList{}, []client.ListOption{client.InNamespace(pool.Namespace)}},
		{&rbacv1.RoleList{}, []client.ListOption{client.InNamespace(pool.Namespace)}},
	} {
		if err := deleteOwned(ctx, r.Client, pool, step.list, step.opts...); err != nil {
			return err
		}
	}
	r.forgetApplied(client.ObjectKeyFromObject(pool))
	r.forgetWritten(client.ObjectKeyFromObject(pool))
	return setFinalizer(ctx, r.Client, pool, poolFinalizer, false)
}

// SetupWithManager watches pools, what they own, and everything their status is computed from.
func (r *TransferPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	allPools := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		pools := &fxv1.TransferPoolList{}
		if err := mgr.GetClient().List(ctx, pools); err != nil {
			mgr.GetLogger().Error(err, "listing pools to requeue")
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(pools.Items))
		for _, p := range pools.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&p)})
		}
		return reqs
	})
	// An event on an owned object (an edit, a deletion, our own apply) re-applies the owning pool's objects.
	// Objects outside the pool's namespace carry no owner reference: the owner labels name the pool.
	ownedBy := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, obj client.Object) []reconcile.Request {
		reqs := poolOfOwned(ctx, obj)
		for _, req := range reqs {
			r.forgetApplied(req.NamespacedName)
		}
		return reqs
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("transferpool").
		For(&fxv1.TransferPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.DaemonSet{}, ownedBy).
		Watches(&corev1.ServiceAccount{}, ownedBy).
		Watches(&rbacv1.Role{}, ownedBy).
		Watches(&rbacv1.RoleBinding{}, ownedBy).
		Watches(&rbacv1.ClusterRoleBinding{}, ownedBy).
		// Node labels decide selection; any pool may be affected, and another pool's selector decides conflicts.
		Watches(&corev1.Node{}, allPools, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&fxv1.TransferPool{}, allPools, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&fxv1.TransferNode{}, handler.EnqueueRequestsFromMapFunc(poolOfTransferNode)).
		// Heartbeat Leases: only those that change a node's freshness; plain renewals are covered by the
		// requeue at the earliest expiry.
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(poolOfLease),
			builder.WithPredicates(heartbeatPredicate(r.Clock))).
		Complete(r)
}

// poolOfOwned routes an object the operator made for a pool to that pool, by its owner labels (objects outside
// the pool's namespace carry no owner reference).
func poolOfOwned(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l["app.kubernetes.io/managed-by"] != managedBy || l[fxv1.LabelPoolName] == "" || l[fxv1.LabelPoolNamespace] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: l[fxv1.LabelPoolNamespace], Name: l[fxv1.LabelPoolName]}}}
}

// poolOfLease routes an agent's heartbeat Lease to its pool, which lives in the Lease's namespace.
func poolOfLease(_ context.Context, obj client.Object) []reconcile.Request {
	if !heartbeat.IsAgentLease(obj) {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: obj.GetNamespace(), Name: obj.GetLabels()[fxv1.LabelPoolName]}}}
}

// poolOfTransferNode routes a report to the pool whose agent wrote it.
func poolOfTransferNode(_ context.Context, obj client.Object) []reconcile.Request {
	tn, ok := obj.(*fxv1.TransferNode)
	if !ok || tn.Spec.PoolName == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: tn.Spec.PoolNamespace, Name: tn.Spec.PoolName}}}
}
