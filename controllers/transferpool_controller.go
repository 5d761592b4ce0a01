// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

// TransferPoolReconciler keeps each TransferPool's aggregate status true to what its agents report: node
// counts, engines, vPODs and the Ready, Progressing and Degraded conditions. Running the agents is
// PoolAgentsReconciler's, their certificates PoolCertReconciler's; each writes its own condition beside these.
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

	// written remembers each pool as this reconciler's last status patch returned it. While
	// reports arrive the pool is reconciled again before the cache shows that write; a status patch from the
	// cache's older copy, under its resourceVersion, was refused as a conflict, and each conflict returned as an
	// error doubled the pool's work-queue backoff (docs/benchmarks.md, 2026-12-02 evening).
	writtenMu sync.Mutex
	written   map[types.NamespacedName]*fxv1.TransferPool
}

// The operator's RBAC for pool status: read what agents report (TransferNodes, heartbeat Leases, Nodes) and
// write the pool's status; the agents' objects' rights are with PoolAgentsReconciler.
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/finalizers,verbs=update
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transfernodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=vpodtopologies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fabricxfer.io,resources=vpodtopologies/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile records what the pool's agents report.
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
		// The agents' and the certificates' finalizers are their controllers'; nothing of the status matters now.
		r.forgetWritten(req.NamespacedName)
		return ctrl.Result{}, nil
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
	// The verdicts the agents controller acts on are recomputed here from the same inputs (the spec, other
	// pools, nodes), so Ready says why a pool runs no agent without waiting for that controller's write; an
	// apply the API server refused is known only from its AgentsReady condition.
	obs.Invalid = ValidatePool(pool, r.Agent)
	obs.ApplyError = agentsApplyError(pool)
	// Heartbeats age without any event (renewals that change nothing are filtered out), so look again when
	// the first fresh one expires.
	return ctrl.Result{RequeueAfter: PoolRequeueAfter(pool, obs)}, nil
}

// agentsApplyError is the agents controller's failure to apply the pool's objects, as its AgentsReady
// condition of the pool's current generation says; nil when there is none.
func agentsApplyError(pool *fxv1.TransferPool) error {
	c := meta.FindStatusCondition(pool.Status.Conditions, fxv1.ConditionAgentsReady)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fxv1.ReasonReconcileError || c.ObservedGeneration != pool.Generation {
		return nil
	}
	return errors.New(c.Message)
}

// agentsApplyErrorChanged passes pool updates that change agentsApplyError: the agents controller's condition
// is the one status write of another controller this controller's Ready depends on.
func agentsApplyErrorChanged() predicate.Predicate {
	return poolChangedIn(func(p *fxv1.TransferPool) string {
		if err := agentsApplyError(p); err != nil {
			return err.Error()
		}
		return ""
	})
}

// agentsRolloutChanged passes a pool whose agents started or finished rolling out (the AgentsReady condition's
// reason and generation), which Progressing follows.
func agentsRolloutChanged() predicate.Predicate {
	return poolChangedIn(func(p *fxv1.TransferPool) string {
		if c := meta.FindStatusCondition(p.Status.Conditions, fxv1.ConditionAgentsReady); c != nil {
			return c.Reason + "/" + strconv.FormatInt(c.ObservedGeneration, 10)
		}
		return ""
	})
}

// poolChangedIn passes pool updates whose key differs between the old and the new object.
func poolChangedIn(key func(*fxv1.TransferPool) string) predicate.Predicate {
	of := func(o client.Object) string {
		if p, ok := o.(*fxv1.TransferPool); ok {
			return key(p)
		}
		return ""
	}
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool { return of(e.ObjectOld) != of(e.ObjectNew) }}
}

// patchStatus writes the status computed from obs, only what changed. The agents and certificate controllers
// write their conditions beside these: the merge patch carries the pool's resourceVersion, so a patch from a
// copy that lacks the others' latest write is refused instead of dropping it. Refused, the pool is read again from the
// API server and the status computed on that copy is patched again (at most poolWriteAttempts writes): a
// conflict is someone else's write to merge with, not a failure to back off from.
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
		case !apierrors.IsConflict(err) || attempt >= poolWriteAttempts:
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
	vpods := &fxv1.VPodTopologyList{}
	if err := r.List(ctx, vpods, client.UnsafeDisableDeepCopy); err != nil {
		return fmt.Errorf("listing VPodTopologies for pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs.VPodNames = make(map[string]string, len(vpods.Items))
	for i := range vpods.Items {
		v := &vpods.Items[i]
		if cur, ok := obs.VPodNames[v.Spec.Domain]; v.Spec.Domain != "" && (!ok || v.Name < cur) {
			obs.VPodNames[v.Spec.Domain] = v.Name // one name for a domain whatever the list's order
		}
	}
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

// SetupWithManager watches pools, the agents controller's condition of them, and everything their status is
// computed from.
func (r *TransferPoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	allPools := enqueueAllPools(mgr)
	return ctrl.NewControllerManagedBy(mgr).
		Named("transferpool").
		For(&fxv1.TransferPool{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{},
			agentsApplyErrorChanged(), agentsRolloutChanged()))).
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

// enqueueAllPools maps any event to a request for every pool: for objects whose change may concern any of them.
func enqueueAllPools(mgr ctrl.Manager) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
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
}
