// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// FieldManager is the operator's server-side-apply field manager.
const FieldManager = "fabricxfer-operator"

// poolFinalizer removes what the pool's agents are made of outside its namespace (their DaemonSet and
// ServiceAccount in the agents' namespace, the ClusterRoleBinding), which cannot carry an owner reference to
// it, and their Role and RoleBinding in its namespace without waiting for the garbage collector. It is the
// agents controller's; the certificate Secrets have their own (certFinalizer). The name predates the split
// and stays: pools carry it.
const poolFinalizer = "fabricxfer.io/cluster-rbac"

// The agents' Events are a few per pool and transition, but a rollout on a large cluster moves a DaemonSet in
// and out of rolled out many times: past a burst each type is recorded at a bounded rate, the rest counted.
const (
	agentEventsPerSecond = 5
	agentEventBurst      = 50
)

// PoolAgentsReconciler runs each TransferPool's agents: it applies their DaemonSet, ServiceAccount and RBAC
// (server-side apply), restores them when someone else changes or deletes them, runs none for a pool the
// operator refuses or one whose nodes an earlier pool serves, and deletes them with the pool (its
// finalizer). What it did shows as the pool's AgentsReady condition, written alone (the pool controller
// writes the aggregate status, the certificate controller CertificatesReady), and as Events.
type PoolAgentsReconciler struct {
	client.Client
	Clock clock.PassiveClock
	Agent AgentSettings
	// Recorder records Events on pools; nil records none. SetupWithManager bounds their rate (eventBudget).
	Recorder events.EventRecorder
	// APIReader reads a pool from the API server when a write met a newer version; the Client when nil.
	APIReader client.Reader

	// applied remembers, per pool, the UID and generation whose objects were applied last: the DaemonSet's
	// status changes reach Reconcile often during a rollout, and re-applying five unchanged objects each time
	// would be most of this controller's API load. An event that changes an object (not its status) or
	// deletes it forgets the entry, so drift is still repaired.
	appliedMu sync.Mutex
	applied   map[types.NamespacedName]appliedAt
}

type appliedAt struct {
	uid        types.UID
	generation int64
	// daemonSet is the DaemonSet's generation the apply answered with: a cached copy older than that is not
	// yet the applied DaemonSet, and its status says nothing about the rollout of this spec.
	daemonSet int64
}

// The operator's RBAC for the agents' objects: cluster-wide only what pools in any namespace need (their Role
// and RoleBinding, which grant heartbeat Leases and reading the pool, so the operator holds those verbs
// itself), and the agents' ClusterRoleBinding, which may name only the installed agent ClusterRole (bind on
// that name, no escalate, no ClusterRole writes). DaemonSets, ServiceAccounts and Secrets only in the agents'
// namespace (a Role there; the chart renders it into agent.namespace).
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fabricxfer.io,resources=transferpools/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=roles;rolebindings;clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,verbs=bind,resourceNames=fabricxfer-agent
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=apps,namespace=fabricxfer-system,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=fabricxfer-system,resources=serviceaccounts;secrets,verbs=get;list;watch;create;update;patch;delete

// agentsPass is what one reconcile concluded: the AgentsReady condition (no reason: nothing concluded, the
// condition stays as it was), the Events of what it did, and how far the rollout got, for the Events of its
// transitions.
type agentsPass struct {
	cond     metav1.Condition
	did      []pendingEvent
	progress string
}

// Reconcile applies one pool's agent objects, or removes them, and writes its AgentsReady condition.
func (r *PoolAgentsReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	pool := &fxv1.TransferPool{}
	if err := r.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetApplied(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, pool)
	}
	if !controllerutil.ContainsFinalizer(pool, poolFinalizer) {
		// Before the first object: a pool being deleted takes no new finalizer, so nothing is made for it.
		if _, err := setPoolFinalizer(ctx, r.Client, r.apiReader(), pool, poolFinalizer, true); err != nil {
			return ctrl.Result{}, err
		}
		if !controllerutil.ContainsFinalizer(pool, poolFinalizer) {
			return ctrl.Result{}, nil // gone, replaced or being deleted: its own event brings the next reconcile
		}
	}

	pass := agentsPass{cond: metav1.Condition{Type: fxv1.ConditionAgentsReady, ObservedGeneration: pool.Generation}}
	defer func() { retErr = errors.Join(retErr, r.report(ctx, pool, &pass)) }()
	return ctrl.Result{}, r.reconcileAgents(ctx, pool, &pass)
}

// reconcileAgents decides whether the pool runs agents and makes it so.
func (r *PoolAgentsReconciler) reconcileAgents(ctx context.Context, pool *fxv1.TransferPool, pass *agentsPass) error {
	// A pool the operator refuses gets nothing written for it (objects of an earlier, valid generation stay as
	// they are) and no retry: only a new generation can change the verdict.
	if invalid := ValidatePool(pool, r.Agent); invalid != nil {
		pass.cond.Status, pass.cond.Reason = metav1.ConditionFalse, fxv1.ReasonInvalidSpec
		if errors.Is(invalid, ErrImageNotAllowed) {
			pass.cond.Reason = fxv1.ReasonImageNotAllowed
		}
		pass.cond.Message = "the operator runs no agent for this generation of the pool: " + invalid.Error()
		return nil
	}
	conflicts, err := r.olderConflicts(ctx, pool)
	if err != nil {
		return err
	}
	if len(conflicts) > 0 {
		// The pool that selected these nodes first keeps them: a later pool runs no agent (two agents would
		// fight over each node's TransferNode and ports).
		removed, err := r.removeAgents(ctx, pool)
		if err != nil {
			pass.cond.Status, pass.cond.Reason, pass.cond.Message = metav1.ConditionFalse, fxv1.ReasonReconcileError, err.Error()
			return err
		}
		if removed > 0 {
			pass.did = append(pass.did, pendingEvent{corev1.EventTypeNormal, EventAgentsRemoved,
				fmt.Sprintf("deleted the agents' DaemonSet %s/%s: %s came first on some of this pool's nodes", r.Agent.namespace(), agentName(pool), strings.Join(conflicts, ", "))})
		}
		pass.cond.Status, pass.cond.Reason = metav1.ConditionFalse, fxv1.ReasonConflict
		pass.cond.Message = fmt.Sprintf("nodes selected by this pool are already served by %s, which came first; this pool runs no agent until a nodeSelector is narrowed",
			strings.Join(conflicts, ", "))
		return nil
	}
	ds, err := r.ensureObjects(ctx, pool, pass)
	if err != nil {
		pass.cond.Status, pass.cond.Reason, pass.cond.Message = metav1.ConditionFalse, fxv1.ReasonReconcileError, err.Error()
		return err
	}
	pass.cond.Status = metav1.ConditionTrue
	pass.cond.Reason, pass.cond.Message, pass.progress = rollout(pool, r.Agent, ds)
	return nil
}

// report writes the pass's condition, if it concluded one, and records its Events: what it did, whatever
// became of the condition (the objects are written), and the condition's transitions, once, when the write
// that makes them lands.
func (r *PoolAgentsReconciler) report(ctx context.Context, pool *fxv1.TransferPool, pass *agentsPass) error {
	record(r.Recorder, pool, "ApplyAgents", pass.did)
	if pass.cond.Reason == "" {
		return nil
	}
	was, wrote, err := setPoolCondition(ctx, r.Client, r.apiReader(), pool, pass.cond)
	if err != nil {
		return fmt.Errorf("writing the AgentsReady condition: %w", err)
	}
	if wrote {
		record(r.Recorder, pool, "RollOutAgents", agentsEvents(was, meta.FindStatusCondition(pool.Status.Conditions, fxv1.ConditionAgentsReady), pass.progress))
	}
	return nil
}

// olderConflicts names the pools that came before this one and select some of its nodes. Nodes are read only
// when another pool came first: most clusters have one pool per node group.
func (r *PoolAgentsReconciler) olderConflicts(ctx context.Context, pool *fxv1.TransferPool) ([]string, error) {
	pools := &fxv1.TransferPoolList{}
	if err := r.List(ctx, pools); err != nil {
		return nil, fmt.Errorf("listing pools to find conflicts with %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs := PoolObservation{}
	for i := range pools.Items {
		p := &pools.Items[i]
		if p.UID != pool.UID && p.DeletionTimestamp.IsZero() && precedes(p, pool) {
			obs.OtherPools = append(obs.OtherPools, *p)
		}
	}
	if len(obs.OtherPools) == 0 {
		return nil, nil
	}
	nodes := &corev1.NodeList{}
	if err := r.List(ctx, nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing nodes for pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	obs.Nodes = nodes.Items
	return OlderConflicts(pool, obs), nil
}

// ensureObjects applies the pool's objects when this generation's were not applied yet or one of them changed
// since, and returns the DaemonSet as last seen: the apply's answer, or the cache's copy (nil when the cache
// does not show it yet).
func (r *PoolAgentsReconciler) ensureObjects(ctx context.Context, pool *fxv1.TransferPool, pass *agentsPass) (*appsv1.DaemonSet, error) {
	cached := &appsv1.DaemonSet{}
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Agent.namespace(), Name: agentName(pool)}, cached)
	if client.IgnoreNotFound(err) != nil {
		return nil, fmt.Errorf("reading the agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	existed := err == nil
	if at, ok := r.appliedNow(pool); ok {
		if !existed || cached.Generation < at.daemonSet {
			// Applied for this generation and not in the cache yet; or deleted, and the deletion's event makes
			// the next pass apply again.
			return nil, nil
		}
		return cached, nil
	}
	applied, err := r.applyOwned(ctx, pool)
	if err != nil {
		return nil, err
	}
	r.markApplied(pool, applied.Generation)
	var prior *appsv1.DaemonSet
	if existed {
		prior = cached
	}
	pass.did = append(pass.did, applyEvents(pool, r.Agent, meta.FindStatusCondition(pool.Status.Conditions, fxv1.ConditionAgentsReady), prior, applied)...)
	return applied, nil
}

// applyOwned applies every object of the pool's agents, the DaemonSet last (it runs as the ServiceAccount
// with the rights the others grant), and returns the DaemonSet as the API server answered.
func (r *PoolAgentsReconciler) applyOwned(ctx context.Context, pool *fxv1.TransferPool) (*appsv1.DaemonSet, error) {
	ds, err := DesiredDaemonSet(pool, r.Agent)
	if err != nil {
		return nil, fmt.Errorf("building the agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
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
			return nil, fmt.Errorf("applying %s for pool %s/%s: %w", kindOf(obj), pool.Namespace, pool.Name, err)
		}
	}
	// The apply answered with the whole object (its generation and status among it).
	raw, err := json.Marshal(ds)
	if err != nil {
		return nil, fmt.Errorf("reading the applied agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	out := &appsv1.DaemonSet{}
	if err := json.Unmarshal(raw, out); err != nil {
		return nil, fmt.Errorf("reading the applied agent DaemonSet of pool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	return out, nil
}

// kindOf names an apply configuration's kind for an error message ("DaemonSet", not its Go type).
func kindOf(obj runtime.ApplyConfiguration) string {
	if k, ok := obj.(interface{ GetKind() *string }); ok && k.GetKind() != nil {
		return *k.GetKind()
	}
	return fmt.Sprintf("%T", obj)
}

// removeAgents deletes the pool's DaemonSet, if it has one (a pool that lost its nodes to an earlier pool),
// and says how many it deleted.
func (r *PoolAgentsReconciler) removeAgents(ctx context.Context, pool *fxv1.TransferPool) (int, error) {
	r.forgetApplied(client.ObjectKeyFromObject(pool))
	return deleteOwned(ctx, r.Client, pool, &appsv1.DaemonSetList{}, client.InNamespace(r.Agent.namespace()))
}

// finalize deletes the agents and their rights, found by the pool's owner labels: outside its namespace
// nothing else would (no owner reference can cross namespaces), and in it the garbage collector would, later.
// The certificate Secrets are the certificate controller's (its own finalizer), deleted once the agents are.
func (r *PoolAgentsReconciler) finalize(ctx context.Context, pool *fxv1.TransferPool) error {
	if !controllerutil.ContainsFinalizer(pool, poolFinalizer) {
		return nil
	}
	ns := client.InNamespace(r.Agent.namespace())
	deleted := 0
	// The DaemonSet first: agents stop before their identity and rights go.
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
		n, err := deleteOwned(ctx, r.Client, pool, step.list, step.opts...)
		if err != nil {
			return err
		}
		deleted += n
	}
	r.forgetApplied(client.ObjectKeyFromObject(pool))
	wrote, err := setPoolFinalizer(ctx, r.Client, r.apiReader(), pool, poolFinalizer, false)
	if err != nil {
		return err
	}
	if wrote {
		// Once, with the finalizer's removal (a pass that failed to remove it deleted objects all the same, so
		// the count is of this pass only).
		record(r.Recorder, pool, "DeleteAgents", []pendingEvent{{corev1.EventTypeNormal, EventAgentsCleanedUp,
			fmt.Sprintf("the pool is being deleted: its agents' DaemonSet, ServiceAccount and RBAC are gone (%d objects deleted in the last pass)", deleted)}})
	}
	return nil
}

// deleteOwned deletes every object of the list's kind that carries the pool's owner labels, and nothing else,
// and says how many it deleted.
func deleteOwned(ctx context.Context, c client.Client, pool *fxv1.TransferPool, list client.ObjectList, opts ...client.ListOption) (int, error) {
	if err := c.List(ctx, list, append(opts, ownerLabels(pool))...); err != nil {
		return 0, fmt.Errorf("listing %T of pool %s/%s: %w", list, pool.Namespace, pool.Name, err)
	}
	deleted := 0
	err := meta.EachListItem(list, func(o runtime.Object) error {
		obj, ok := o.(client.Object)
		if !ok {
			return fmt.Errorf("%T is not an object", o)
		}
		// The precondition makes sure the object deleted is the one whose labels were read.
		uid := obj.GetUID()
		err := c.Delete(ctx, obj, client.Preconditions{UID: &uid})
		if client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %T %s/%s of pool %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), pool.Namespace, pool.Name, err)
		}
		if err == nil {
			deleted++
		}
		return nil
	})
	return deleted, err
}

func (r *PoolAgentsReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// appliedNow returns the last apply of the pool's objects when it was of this pool and generation and nothing
// changed since (false: apply them).
func (r *PoolAgentsReconciler) appliedNow(pool *fxv1.TransferPool) (appliedAt, bool) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	at, ok := r.applied[client.ObjectKeyFromObject(pool)]
	return at, ok && at.uid == pool.UID && at.generation == pool.Generation
}

func (r *PoolAgentsReconciler) markApplied(pool *fxv1.TransferPool, daemonSetGeneration int64) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	if r.applied == nil {
		r.applied = map[types.NamespacedName]appliedAt{}
	}
	r.applied[client.ObjectKeyFromObject(pool)] = appliedAt{uid: pool.UID, generation: pool.Generation, daemonSet: daemonSetGeneration}
}

// forgetApplied makes the next reconcile of the pool apply its objects again.
func (r *PoolAgentsReconciler) forgetApplied(key types.NamespacedName) {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	delete(r.applied, key)
}

// rolledOut reports whether the DaemonSet controller finished rolling out the DaemonSet's current spec: it saw
// this generation, and every node it schedules to runs an updated, available agent.
func rolledOut(ds *appsv1.DaemonSet) bool {
	st := ds.Status
	return st.ObservedGeneration >= ds.Generation && st.UpdatedNumberScheduled >= st.DesiredNumberScheduled &&
		st.NumberAvailable >= st.DesiredNumberScheduled
}

// rollout is the reason and message of a True AgentsReady condition for the DaemonSet as last seen (nil: not
// in the cache yet), and its progress for Events. The message of a rollout in progress carries no counts: they
// change with every agent that starts, and each change would be one more write of the pool.
func rollout(pool *fxv1.TransferPool, settings AgentSettings, ds *appsv1.DaemonSet) (reason, message, progress string) {
	ns, name := settings.namespace(), agentName(pool)
	if ds == nil {
		return fxv1.ReasonAgentsRollingOut, fmt.Sprintf("DaemonSet %s/%s, its ServiceAccount and RBAC are applied for generation %d; waiting for the DaemonSet controller",
			ns, name, pool.Generation), "the DaemonSet controller has not reported yet"
	}
	st := ds.Status
	progress = fmt.Sprintf("%d/%d agents updated, %d/%d available", st.UpdatedNumberScheduled, st.DesiredNumberScheduled, st.NumberAvailable, st.DesiredNumberScheduled)
	if rolledOut(ds) {
		return fxv1.ReasonAgentsRolledOut, fmt.Sprintf("DaemonSet %s/%s runs generation %d's agents, updated and available, on every node it schedules to (%d)",
			ns, name, pool.Generation, st.DesiredNumberScheduled), progress
	}
	return fxv1.ReasonAgentsRollingOut, fmt.Sprintf("DaemonSet %s/%s, its ServiceAccount and RBAC are applied for generation %d; the agents are rolling out (kubectl -n %s rollout status daemonset/%s)",
		ns, name, pool.Generation, ns, name), progress
}

// applyEvents are the Events of one apply: the DaemonSet created, created again after someone deleted it,
// updated to a new generation of the pool, or restored after someone changed it. Deleted and changed are two
// reasons: the API server's Event series joins Events of one reason about one pool version, keeping the
// first note. was is the AgentsReady
// condition before, prior the DaemonSet before the apply (nil: there was none), applied the apply's answer.
// An answer of another UID than prior's was created by the apply: prior is the cache's copy of a DaemonSet
// deleted since, whose deletion had not reached the cache (a reconcile that another object's change started).
func applyEvents(pool *fxv1.TransferPool, settings AgentSettings, was *metav1.Condition, prior, applied *appsv1.DaemonSet) []pendingEvent {
	ds := settings.namespace() + "/" + agentName(pool)
	if prior != nil && applied != nil && applied.UID != prior.UID {
		prior = nil
	}
	switch {
	case prior == nil && was != nil && was.Status == metav1.ConditionTrue:
		return []pendingEvent{{corev1.EventTypeWarning, EventAgentsRecreated,
			fmt.Sprintf("DaemonSet %s was deleted outside the operator; created it again", ds)}}
	case prior == nil:
		return []pendingEvent{{corev1.EventTypeNormal, EventAgentsCreated,
			fmt.Sprintf("created DaemonSet %s, its ServiceAccount and RBAC for generation %d of the pool", ds, pool.Generation)}}
	case applied == nil || applied.Generation == prior.Generation:
		return nil // nothing of the DaemonSet's spec changed
	case was == nil || was.ObservedGeneration != pool.Generation:
		return []pendingEvent{{corev1.EventTypeNormal, EventAgentsUpdated,
			fmt.Sprintf("applied generation %d of the pool to DaemonSet %s", pool.Generation, ds)}}
	default:
		return []pendingEvent{{corev1.EventTypeWarning, EventAgentsRestored,
			fmt.Sprintf("DaemonSet %s differed from what generation %d of the pool asks for (changed outside the operator, or by an operator upgrade); applied it again", ds, pool.Generation)}}
	}
}

// agentsEvents are the rollout's transitions between two AgentsReady conditions: rolled out, and no longer
// rolled out while the pool's generation stayed (an agent stopped being available, or a node was added). A
// new generation's rollout is announced by AgentsUpdated.
func agentsEvents(was, now *metav1.Condition, progress string) []pendingEvent {
	if now == nil {
		return nil
	}
	wasRolledOut := was != nil && was.Status == metav1.ConditionTrue && was.Reason == fxv1.ReasonAgentsRolledOut
	switch {
	case now.Reason == fxv1.ReasonAgentsRolledOut && !wasRolledOut:
		return []pendingEvent{{corev1.EventTypeNormal, EventAgentsRolledOut, now.Message}}
	case wasRolledOut && now.Reason == fxv1.ReasonAgentsRollingOut && was.ObservedGeneration == now.ObservedGeneration:
		return []pendingEvent{{corev1.EventTypeWarning, EventAgentsUnavailable, "the agents' DaemonSet is no longer rolled out: " + progress}}
	}
	return nil
}

// SetupWithManager watches pools (spec changes and deletion), the agents' objects (an edit or a deletion is
// undone; the DaemonSet's status is the rollout), and what decides conflicts between pools (node labels,
// other pools' selectors).
func (r *PoolAgentsReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Recorder != nil {
		r.Recorder = newEventBudget(r.Recorder, agentEventsPerSecond, agentEventBurst, r.Clock, AgentEventsDropped(ctrlmetrics.Registry))
	}
	allPools := enqueueAllPools(mgr)
	// Objects outside the pool's namespace carry no owner reference: the owner labels name the pool. Any
	// event on them but their creation (the operator's own apply, or the cache filling at start) means they
	// may differ from what the pool asks for.
	changedOrDeleted := handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			changed := objectChanged(e.ObjectOld, e.ObjectNew)
			// The old object's labels too: an edit that removed them still names the pool there.
			r.enqueueOwner(ctx, e.ObjectOld, q, changed)
			r.enqueueOwner(ctx, e.ObjectNew, q, changed)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueOwner(ctx, e.Object, q, true)
		},
		// A DaemonSet's creation is looked at (the rollout starts there); the apply is not repeated for it.
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.enqueueOwner(ctx, e.Object, q, false)
		},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("poolagents").
		For(&fxv1.TransferPool{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, beingDeleted()))).
		Watches(&appsv1.DaemonSet{}, changedOrDeleted).
		Watches(&corev1.ServiceAccount{}, changedOrDeleted).
		Watches(&rbacv1.Role{}, changedOrDeleted).
		Watches(&rbacv1.RoleBinding{}, changedOrDeleted).
		Watches(&rbacv1.ClusterRoleBinding{}, changedOrDeleted).
		// Node labels decide selection, and another pool's selector decides conflicts.
		Watches(&corev1.Node{}, allPools, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&fxv1.TransferPool{}, allPools, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
}

// enqueueOwner queues the pool an object was made for, first forgetting its last apply when the object may
// differ from it.
func (r *PoolAgentsReconciler) enqueueOwner(ctx context.Context, obj client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request], reapply bool) {
	for _, req := range poolOfOwned(ctx, obj) {
		if reapply {
			r.forgetApplied(req.NamespacedName)
		}
		q.Add(req)
	}
}

// objectChanged reports whether an update changed more than an object's status: its spec (the generation of
// kinds that have one), labels, annotations, or the content of kinds without a generation (RBAC objects,
// ServiceAccounts), which have no status.
func objectChanged(old, new client.Object) bool {
	if new.GetGeneration() == 0 {
		return old.GetResourceVersion() != new.GetResourceVersion()
	}
	return old.GetGeneration() != new.GetGeneration() ||
		!maps.Equal(old.GetLabels(), new.GetLabels()) || !maps.Equal(old.GetAnnotations(), new.GetAnnotations())
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
