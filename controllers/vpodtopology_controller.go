// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// vpodKey is the one work item of the VPodTopology reconciler: domains are a function of all reports together,
// so every event coalesces into one pass, which keeps a thousand heartbeating nodes to one list per period.
var vpodKey = reconcile.Request{NamespacedName: client.ObjectKey{Name: "vpodtopologies"}}

// VPodTopologyReconciler keeps VPodTopology objects equal to what TransferNodes report.
type VPodTopologyReconciler struct {
	client.Client
	Clock clock.PassiveClock
	// Recorder records Events on domains (created, emptied, members joining and leaving); nil records none.
	Recorder events.EventRecorder

	// written remembers each domain as this reconciler's last create or status patch returned it. A pass that
	// starts before the cache has seen those writes (a busy start-up: hundreds of domains per pass) would
	// otherwise create them again and rewrite their status.
	writtenMu sync.Mutex
	written   map[string]writtenDomain
}

// writtenDomain is a domain as a write of this reconciler returned it, and when.
type writtenDomain struct {
	vp *fxv1.VPodTopology
	at time.Time
}

// trustUncached is how long a domain this reconciler created counts as existing while the cache has not
// shown it yet; passes look again within it, so a domain deleted meanwhile is created again.
const trustUncached = 10 * time.Second

// Reconcile creates a VPodTopology for every reported domain, updates members and status of every domain, and
// deletes discovered domains nobody reports any more. Declared domains are never deleted.
func (r *VPodTopologyReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	tns := &fxv1.TransferNodeList{}
	if err := r.List(ctx, tns); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing transfer nodes: %w", err)
	}
	vps := &fxv1.VPodTopologyList{}
	if err := r.List(ctx, vps); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing vpod topologies: %w", err)
	}
	timeouts, err := r.heartbeatTimeouts(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	beats, err := ListHeartbeats(ctx, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.Clock.Now()
	exp := expiryTracker{now: now}
	var uncached bool
	vps.Items, uncached = r.withOwnWrites(vps.Items, now)
	if uncached {
		exp.add(trustUncached)
	}
	domains := AggregateDomains(tns.Items, func(tn *fxv1.TransferNode) bool {
		timeout := timeouts(tn)
		at := beats.LastHeartbeat(tn)
		if at.IsZero() {
			return false
		}
		if now.Sub(at) < timeout {
			exp.fresh(at, timeout)
			return true
		}
		exp.stale(timeout)
		return false
	})

	// Domains are written independently, so a pass writes up to vpodWriters at a time: one after another,
	// 832 domains of a 1,000-node cluster took a round trip each, tens of seconds on a busy API server.
	var (
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, vpodWriters)
		wg   sync.WaitGroup
	)
	async := func(write func() error) {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := write(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	var created, existed, patched, deleted atomic.Int64
	passStart := time.Now()
	existing := map[string]bool{}
	owners := DomainOwners(vps.Items)
	for i := range vps.Items {
		vp := &vps.Items[i]
		existing[vp.Spec.Domain] = true
		obs := domains[vp.Spec.Domain]
		owner := owners[vp.Spec.Domain]
		// A domain described twice: the operator's own duplicate goes, an admin's shows whose it is.
		duplicate := owner.Name != vp.Name
		if (obs == nil || duplicate) && vp.Labels[fxv1.LabelDiscovered] == "true" {
			async(func() error {
				err := r.Delete(ctx, vp)
				if client.IgnoreNotFound(err) != nil {
					return fmt.Errorf("deleting empty discovered domain %s: %w", vp.Name, err)
				}
				r.forget(vp.Name)
				deleted.Add(1)
				if err == nil {
					ev := pendingEvent{corev1.EventTypeNormal, EventDomainEmptied, fmt.Sprintf("no reporting node is in domain %s any more; deleted", vp.Spec.Domain)}
					if duplicate {
						ev = pendingEvent{corev1.EventTypeNormal, EventDomainReplaced, fmt.Sprintf("VPodTopology %s describes domain %s; this discovered twin was deleted", owner.Name, vp.Spec.Domain)}
					}
					record(r.Recorder, vp, "Delete", []pendingEvent{ev})
				}
				return nil
			})
			continue
		}
		want := ComputeVPodStatus(vp, obs)
		if duplicate {
			want = DuplicateVPodStatus(vp, owner)
		}
		if equality.Semantic.DeepEqual(vp.Status, want) {
			continue
		}
		async(func() error { patched.Add(1); return r.patchStatus(ctx, vp, want) })
	}
	for key, obs := range domains {
		if existing[key] {
			continue
		}
		vp := &fxv1.VPodTopology{
			ObjectMeta: metav1.ObjectMeta{
				Name:   fxv1.DomainObjectName(key),
				Labels: map[string]string{fxv1.LabelDiscovered: "true", fxv1.LabelFabricKind: string(obs.Kind)},
			},
			Spec: fxv1.VPodTopologySpec{Kind: obs.Kind, Domain: key},
		}
		async(func() error {
			switch err := r.Create(ctx, vp); {
			case apierrors.IsAlreadyExists(err):
				existed.Add(1)
			case err != nil:
				return fmt.Errorf("creating domain %s for %s: %w", vp.Name, key, err)
			default:
				created.Add(1)
				r.remember(vp, now)
				record(r.Recorder, vp, "Create", []pendingEvent{{corev1.EventTypeNormal, EventDomainCreated,
					fmt.Sprintf("%s domain %s discovered from %d reporting nodes", obs.Kind, key, len(obs.Members))}})
			}
			patched.Add(1)
			return r.patchStatus(ctx, vp, ComputeVPodStatus(vp, obs))
		})
	}
	wg.Wait()
	if n := created.Load() + existed.Load() + patched.Load() + deleted.Load(); n > 0 {
		ctrl.LoggerFrom(ctx).Info("vPOD pass wrote domains", "created", created.Load(), "alreadyExisted", existed.Load(),
			"statusPatched", patched.Load(), "deleted", deleted.Load(), "domains", len(domains), "reports", len(tns.Items),
			"took", time.Since(passStart).Round(time.Millisecond).String())
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	// Heartbeats expire without events (renewals that change nothing are filtered out): look again when the
	// first fresh one expires.
	return ctrl.Result{RequeueAfter: exp.after()}, nil
}

// vpodWriters bounds the writes one reconcile pass has in flight.
const vpodWriters = 64

func (r *VPodTopologyReconciler) patchStatus(ctx context.Context, vp *fxv1.VPodTopology, want fxv1.VPodTopologyStatus) error {
	before := vp.DeepCopy()
	vp.Status = want
	if equality.Semantic.DeepEqual(before.Status, vp.Status) {
		return nil
	}
	if err := r.Status().Patch(ctx, vp, client.MergeFrom(before)); err != nil {
		r.forget(vp.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status of domain %s: %w", vp.Name, err)
	}
	r.remember(vp, r.Clock.Now())
	record(r.Recorder, vp, "Reconcile", vpodEvents(before.Status, vp.Status))
	return nil
}

func (r *VPodTopologyReconciler) remember(vp *fxv1.VPodTopology, at time.Time) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	if r.written == nil {
		r.written = map[string]writtenDomain{}
	}
	r.written[vp.Name] = writtenDomain{vp: vp.DeepCopy(), at: at}
}

func (r *VPodTopologyReconciler) forget(name string) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	delete(r.written, name)
}

// withOwnWrites replaces each cached domain that this reconciler has written since with what the write
// returned, and adds domains it created recently that the cache does not show yet (uncached reports those).
// Entries the cache has caught up with are dropped.
func (r *VPodTopologyReconciler) withOwnWrites(items []fxv1.VPodTopology, now time.Time) (_ []fxv1.VPodTopology, uncached bool) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	byName := make(map[string]int, len(items))
	for i := range items {
		byName[items[i].Name] = i
	}
	for name, w := range r.written {
		if i, ok := byName[name]; ok {
			if newerVersion(w.vp.ResourceVersion, items[i].ResourceVersion) {
				items[i] = *w.vp.DeepCopy()
			} else {
				delete(r.written, name)
			}
			continue
		}
		if now.Sub(w.at) < trustUncached {
			items = append(items, *w.vp.DeepCopy())
			uncached = true
		} else {
			delete(r.written, name)
		}
	}
	return items, uncached
}

// newerVersion reports whether resourceVersion a is later than b. Versions are opaque to clients, but this
// API server's are etcd revisions; anything that does not parse counts as not newer, so the cache wins.
func newerVersion(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	return errA == nil && errB == nil && x > y
}

// heartbeatTimeouts maps each report to the heartbeat timeout of the pool whose agent wrote it.
func (r *VPodTopologyReconciler) heartbeatTimeouts(ctx context.Context) (func(*fxv1.TransferNode) time.Duration, error) {
	pools := &fxv1.TransferPoolList{}
	if err := r.List(ctx, pools); err != nil {
		return nil, fmt.Errorf("listing pools for heartbeat periods: %w", err)
	}
	byPool := map[client.ObjectKey]time.Duration{}
	for i := range pools.Items {
		byPool[client.ObjectKeyFromObject(&pools.Items[i])] = poolHeartbeatTimeout(&pools.Items[i])
	}
	return func(tn *fxv1.TransferNode) time.Duration {
		if d, ok := byPool[client.ObjectKey{Namespace: tn.Spec.PoolNamespace, Name: tn.Spec.PoolName}]; ok {
			return d
		}
		return heartbeatTimeout(0)
	}, nil
}

// SetupWithManager funnels every TransferNode and VPodTopology event, and every heartbeat Lease event that
// changes freshness, into the single work item.
func (r *VPodTopologyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	one := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{vpodKey}
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("vpodtopology").
		Watches(&fxv1.TransferNode{}, one).
		Watches(&fxv1.VPodTopology{}, one).
		Watches(&coordinationv1.Lease{}, one, builder.WithPredicates(heartbeatPredicate(r.Clock))).
		Complete(r)
}
