// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

// The VPodTopology reconciler's work item is one scale-up domain: the request's Name is the domain key. A
// domain is a function of the reports that name it, so a report touches only its own domains, each domain is
// computed from its members' reports alone (cache indexes below), and writes of different domains run side by
// side, whatever the order and pace of reports. The empty key is a pass over every domain, for callers without
// the manager's indexes (a plain client).
const (
	// indexTransferNodeDomains indexes TransferNodes by every domain key their GPUs report.
	indexTransferNodeDomains = "status.gpus.fabric.domain"
	// indexVPodDomain indexes VPodTopologies by spec.domain.
	indexVPodDomain = "spec.domain"
	// indexLeaseHeartbeat indexes agents' Leases by heartbeat.Key (pool namespace/pool/node).
	indexLeaseHeartbeat = "fabricxfer.io/heartbeat"
)

// VPodTopologyReconciler keeps VPodTopology objects equal to what TransferNodes report.
type VPodTopologyReconciler struct {
	client.Client
	// APIReader reads a domain object the cache may not have seen yet; the Client when nil.
	APIReader client.Reader
	Clock     clock.PassiveClock
	// Recorder records Events on domains (created, emptied, members joining and leaving); nil records none.
	// SetupWithManager bounds the rate of its Events (eventBudget).
	Recorder events.EventRecorder

	// indexed is set by SetupWithManager: the cache has the field indexes a single domain's reconcile reads.
	indexed bool

	// written remembers each domain as this reconciler's last create or status patch returned it. A reconcile
	// that starts before the cache has seen those writes would otherwise create them again and rewrite their
	// status.
	writtenMu sync.Mutex
	written   map[string]writtenDomain
	// statusWritten is when this reconciler last patched each domain's status (assemblyHoldLeft).
	statusWritten map[string]time.Time
}

// writtenDomain is a domain as a write of this reconciler returned it, and when.
type writtenDomain struct {
	vp *fxv1.VPodTopology
	at time.Time
}

// trustUncached is how long a domain this reconciler created counts as existing while the cache has not
// shown it yet; the domain is looked at again within it, so a domain deleted meanwhile is created again.
const trustUncached = 10 * time.Second

// vpodBatchWindow is how long a domain's event waits before its reconcile: the members of one domain report
// close together (a rack's nodes start together), so their reports coalesce into one write of the domain.
const vpodBatchWindow = 200 * time.Millisecond

// vpodAssemblyHold is how long the status of a domain still short of the size its members report waits after
// its create or its last write before the members that joined are written; the member that completes it is
// written at once.
// Why: while a cluster's agents start, the members of a domain report seconds apart, and each used to cost the
// domain a status patch of its own (make scale N=1000: 1,577 patches for 798 domains, all of them members added).
const vpodAssemblyHold = 5 * time.Second

// vpodWriters bounds the domains reconciled (and written) at a time.
const vpodWriters = 64

// Reconcile creates the VPodTopology of one reported domain, keeps its members and status equal to the
// reports, and deletes a discovered one nobody reports any more. Declared domains are never deleted.
func (r *VPodTopologyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	if req.Name == "" || !r.indexed {
		return r.reconcileAll(ctx)
	}
	key := req.Name
	// reports reads the domain's TransferNodes and their members' heartbeats. Reports and Leases are only read
	// here, so the cache's own objects are used without copies.
	reports := func() ([]fxv1.TransferNode, heartbeat.Beats, error) {
		tns := &fxv1.TransferNodeList{}
		if err := r.List(ctx, tns, client.MatchingFields{indexTransferNodeDomains: key}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, nil, fmt.Errorf("listing transfer nodes of domain %s: %w", key, err)
		}
		beats, err := r.memberHeartbeats(ctx, tns.Items)
		return tns.Items, beats, err
	}
	tns, beats, err := reports()
	if err != nil {
		return ctrl.Result{}, err
	}
	vps := &fxv1.VPodTopologyList{}
	if err := r.List(ctx, vps, client.MatchingFields{indexVPodDomain: key}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing vpod topologies of domain %s: %w", key, err)
	}
	timeouts, err := r.heartbeatTimeouts(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.Clock.Now()
	exp := expiryTracker{now: now}
	names := []string{fxv1.DomainObjectName(key)}
	for i := range vps.Items {
		names = append(names, vps.Items[i].Name)
	}
	items, uncached := r.overlayOwnWrites(vps.Items, names, now)
	if uncached {
		exp.add(trustUncached)
	}
	// Own writes are found by name, and the name may be another domain's object's (a name keeps 32 bits of the
	// key's hash): that object is not this domain's, whose reconcile found no owner in it and panicked.
	items = slices.DeleteFunc(items, func(vp fxv1.VPodTopology) bool { return vp.Spec.Domain != key })
	obs := AggregateDomains(tns, freshness(now, timeouts, beats, &exp))[key]
	// observe reads the domain's reports again, for the first status of a domain just created.
	observe := func() (*DomainObservation, error) {
		tns, beats, err := reports()
		if err != nil {
			return nil, err
		}
		return AggregateDomains(tns, freshness(now, timeouts, beats, &exp))[key], nil
	}
	w, err := r.syncDomain(ctx, key, obs, observe, items, reportsByNode(tns), now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if w.held > 0 {
		exp.add(w.held) // the held write is due then, whether or not another member reports
	}
	// Heartbeats expire without events (renewals that change nothing are filtered out): look again when the
	// first fresh one of a member expires.
	return ctrl.Result{RequeueAfter: exp.after()}, nil
}

// freshness says whether a report's heartbeat is fresh at now, recording in exp when that can change.
func freshness(now time.Time, timeouts func(*fxv1.TransferNode) time.Duration, beats heartbeat.Beats, exp *expiryTracker) func(*fxv1.TransferNode) bool {
	return func(tn *fxv1.TransferNode) bool {
		timeout := timeouts(tn)
		at := beats.LastAt(tn, now, timeout)
		if at.IsZero() {
			return false
		}
		if now.Sub(at) < timeout {
			exp.fresh(at, timeout)
			return true
		}
		exp.stale(timeout)
		return false
	}
}

// domainWrites counts what reconciles wrote; held is how soon a status write held back is due (0: none held).
type domainWrites struct {
	created, existed, patched, deleted int64
	held                               time.Duration
}

// assemblyHoldLeft is how long a domain's status write waits yet (0: write now): only while members join a
// discovered domain still short of the size they report, with nobody stale or missing, within vpodAssemblyHold
// of this reconciler's last write of it. A domain never written since the operator started is written at once.
func assemblyHoldLeft(cur, want fxv1.VPodTopologyStatus, obs *DomainObservation, declared bool, lastWrite, now time.Time) time.Duration {
	if declared || obs == nil || obs.Size == 0 || want.GPUs >= obs.Size || len(obs.Stale) > 0 || lastWrite.IsZero() ||
		len(want.MissingMembers) > 0 || len(cur.MissingMembers) > 0 || want.Nodes <= cur.Nodes || want.GPUs <= cur.GPUs {
		return 0
	}
	return max(vpodAssemblyHold-now.Sub(lastWrite), 0)
}

func (w *domainWrites) any() bool { return w.created+w.existed+w.patched+w.deleted > 0 }

// syncDomain writes one domain: deletes discovered VPodTopologies of it that nobody reports or that duplicate
// the owner, patches the status of the others where it differs from the reports, and creates the discovered
// one when the domain is reported and no VPodTopology describes it. vps are the VPodTopologies of the domain.
// reports are the TransferNodes that report or were declared in the domain, by node, for the Declared
// condition. A declared domain also gets its member labels (fabricxfer.io MemberLabel), which its agents
// select by. observe, when set, reads the domain's reports again for the first status of a domain created here.
func (r *VPodTopologyReconciler) syncDomain(ctx context.Context, key string, obs *DomainObservation, observe func() (*DomainObservation, error),
	vps []fxv1.VPodTopology, reports map[string]*fxv1.TransferNode, now time.Time) (domainWrites, error) {
	var w domainWrites
	var errs []error
	owners := DomainOwners(vps)
	for i := range vps {
		vp := &vps[i]
		owner := owners[key]
		// A domain described twice: the operator's own duplicate goes, an admin's shows whose it is.
		duplicate := owner.Name != vp.Name
		if (obs == nil || duplicate) && vp.Labels[fxv1.LabelDiscovered] == "true" {
			if err := r.Delete(ctx, vp); client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("deleting empty discovered domain %s: %w", vp.Name, err))
				continue
			}
			r.forget(vp.Name)
			w.deleted++
			ev := pendingEvent{corev1.EventTypeNormal, EventDomainEmptied, fmt.Sprintf("no reporting node is in domain %s any more; deleted", vp.Spec.Domain)}
			if duplicate {
				ev = pendingEvent{corev1.EventTypeNormal, EventDomainReplaced, fmt.Sprintf("VPodTopology %s describes domain %s; this discovered twin was deleted", owner.Name, vp.Spec.Domain)}
			}
			record(r.Recorder, vp, "Delete", []pendingEvent{ev})
			continue
		}
		if vp.Labels[fxv1.LabelDiscovered] != "true" {
			var members []fxv1.VPodMember
			if !duplicate {
				members = vp.Spec.Members
			}
			if err := r.syncMemberLabels(ctx, vp, members); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		want := ComputeVPodStatus(vp, obs)
		if duplicate {
			want = DuplicateVPodStatus(vp, owner)
		}
		if !duplicate && len(vp.Spec.Members) > 0 {
			declared := DeclaredCondition(vp, reports, func(node string) bool {
				return r.Get(ctx, client.ObjectKey{Name: node}, &fxv1.TransferNode{}) == nil
			})
			declared.Message = boundedMessage(declared.Message) // members write what it quotes
			meta.SetStatusCondition(&want.Conditions, declared)
		} else {
			meta.RemoveStatusCondition(&want.Conditions, fxv1.ConditionDeclared)
		}
		if equality.Semantic.DeepEqual(vp.Status, want) {
			continue
		}
		if left := assemblyHoldLeft(vp.Status, want, obs, duplicate || len(vp.Spec.Members) > 0, r.lastStatusWrite(vp.Name), now); left > 0 {
			if w.held == 0 || left < w.held {
				w.held = left
			}
			continue
		}
		w.patched++
		if err := r.patchStatus(ctx, vp, want); err != nil {
			errs = append(errs, err)
		}
	}
	if len(vps) > 0 || obs == nil {
		return w, errors.Join(errs...)
	}
	vp := &fxv1.VPodTopology{
		ObjectMeta: metav1.ObjectMeta{
			Name:   fxv1.DomainObjectName(key),
			Labels: map[string]string{fxv1.LabelDiscovered: "true", fxv1.LabelFabricKind: string(obs.Kind)},
		},
		Spec: fxv1.VPodTopologySpec{Kind: obs.Kind, Domain: key},
	}
	switch err := r.Create(ctx, vp); {
	case apierrors.IsAlreadyExists(err):
		// Created before the cache could show it: its status is patched all the same (the patch carries no
		// resourceVersion), and its event brings it into this domain's next reconcile. Unless the object of that
		// name is another domain's: a name keeps 32 bits of the key's hash, and a node's report can choose its
		// key to meet another domain's name. That object is left alone, and an Event on it says why.
		existing := &fxv1.VPodTopology{}
		if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(vp), existing); err != nil {
			return w, fmt.Errorf("reading domain object %s, which exists already, for %s: %w", vp.Name, key, err)
		}
		if existing.Spec.Domain != key {
			record(r.Recorder, existing, "Create", []pendingEvent{{corev1.EventTypeWarning, EventDomainNameTaken,
				fmt.Sprintf("domain %s, reported by %s, has this object's name: it is not written", key, namedAtMost(memberNames(obs.Members), ", "))}})
			return w, nil
		}
		w.existed++
	case err != nil:
		return w, fmt.Errorf("creating domain %s for %s: %w", vp.Name, key, err)
	default:
		w.created++
		r.remember(vp, now)
		record(r.Recorder, vp, "Create", []pendingEvent{{corev1.EventTypeNormal, EventDomainCreated,
			fmt.Sprintf("%s domain %s discovered from %d reporting nodes", obs.Kind, key, len(obs.Members))}})
	}
	if observe != nil {
		// Members whose reports the cache received while the create was on its way go into the first status:
		// while a thousand agents start, each would otherwise cost a status patch of its own (4-6 ms of the API
		// server's CPU each, 248-826 such patches per make scale N=1000 run). A read that fails or finds the
		// domain gone keeps what the create was made from; the next reconcile corrects either.
		switch again, err := observe(); {
		case err != nil:
			ctrl.LoggerFrom(ctx).V(1).Info("first status of a new domain from the reports read before its create", "domain", key, "error", err.Error())
		case again != nil:
			obs = again
		}
	}
	first := ComputeVPodStatus(vp, obs)
	if left := assemblyHoldLeft(fxv1.VPodTopologyStatus{}, first, obs, false, now, now); left > 0 {
		// Still assembling: the first status waits like any other write, from the create on.
		r.markStatusWritten(vp.Name, now)
		w.held = left
		return w, nil
	}
	w.patched++
	return w, r.patchStatus(ctx, vp, first)
}

// reconcileAll is one pass over every domain, writing up to vpodWriters domains at a time.
func (r *VPodTopologyReconciler) reconcileAll(ctx context.Context) (ctrl.Result, error) {
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
	beats, err := heartbeat.List(ctx, r.Client)
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
	domains := AggregateDomains(tns.Items, freshness(now, timeouts, beats, &exp))
	reports := reportsByNode(tns.Items)
	byDomain := map[string][]fxv1.VPodTopology{}
	for i := range vps.Items {
		byDomain[vps.Items[i].Spec.Domain] = append(byDomain[vps.Items[i].Spec.Domain], vps.Items[i])
	}
	for key := range domains {
		if _, ok := byDomain[key]; !ok {
			byDomain[key] = nil
		}
	}
	var (
		mu    sync.Mutex
		errs  []error
		total domainWrites
		sem   = make(chan struct{}, vpodWriters)
		wg    sync.WaitGroup
	)
	for key, items := range byDomain {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			w, err := r.syncDomain(ctx, key, domains[key], nil, items, reports, now)
			mu.Lock()
			defer mu.Unlock()
			total.created, total.existed = total.created+w.created, total.existed+w.existed
			total.patched, total.deleted = total.patched+w.patched, total.deleted+w.deleted
			if w.held > 0 {
				exp.add(w.held)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	if total.any() {
		ctrl.LoggerFrom(ctx).Info("vPOD pass wrote domains", "created", total.created, "alreadyExisted", total.existed,
			"statusPatched", total.patched, "deleted", total.deleted, "domains", len(domains), "reports", len(tns.Items))
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: exp.after()}, nil
}

func (r *VPodTopologyReconciler) patchStatus(ctx context.Context, vp *fxv1.VPodTopology, want fxv1.VPodTopologyStatus) error {
	before := vp.DeepCopy()
	vp.Status = want
	if equality.Semantic.DeepEqual(before.Status, vp.Status) {
		return nil
	}
	// A merge patch of the status carries only the fields that changed (no resourceVersion: the status is
	// the operator's alone, computed from the reports every time).
	if err := r.Status().Patch(ctx, vp, client.MergeFrom(before)); err != nil {
		r.forget(vp.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status of domain %s: %w", vp.Name, err)
	}
	r.remember(vp, r.Clock.Now())
	r.markStatusWritten(vp.Name, r.Clock.Now())
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
	delete(r.statusWritten, name)
}

// markStatusWritten records a status write of domain name at (or, for a domain just created and still
// assembling, the start of its first hold).
func (r *VPodTopologyReconciler) markStatusWritten(name string, at time.Time) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	if r.statusWritten == nil {
		r.statusWritten = map[string]time.Time{}
	}
	r.statusWritten[name] = at
}

// lastStatusWrite is when this reconciler last patched the status of domain name (zero: not since it started).
func (r *VPodTopologyReconciler) lastStatusWrite(name string) time.Time {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	return r.statusWritten[name]
}

// withOwnWrites is overlayOwnWrites for every domain this reconciler remembers writing.
func (r *VPodTopologyReconciler) withOwnWrites(items []fxv1.VPodTopology, now time.Time) (_ []fxv1.VPodTopology, uncached bool) {
	r.writtenMu.Lock()
	names := make([]string, 0, len(r.written))
	for name := range r.written {
		names = append(names, name)
	}
	r.writtenMu.Unlock()
	return r.overlayOwnWrites(items, names, now)
}

// overlayOwnWrites replaces each cached domain among names that this reconciler has written since with what
// the write returned, and adds domains among names it created recently that the cache does not show yet
// (uncached reports those). Entries the cache has caught up with are dropped.
func (r *VPodTopologyReconciler) overlayOwnWrites(items []fxv1.VPodTopology, names []string, now time.Time) (_ []fxv1.VPodTopology, uncached bool) {
	r.writtenMu.Lock()
	defer r.writtenMu.Unlock()
	byName := make(map[string]int, len(items))
	for i := range items {
		byName[items[i].Name] = i
	}
	for _, name := range names {
		w, ok := r.written[name]
		if !ok {
			continue
		}
		if i, ok := byName[name]; ok {
			if newerVersion(w.vp.ResourceVersion, items[i].ResourceVersion) {
				items[i] = *w.vp.DeepCopy()
			} else {
				delete(r.written, name)
			}
			continue
		}
		if now.Sub(w.at) < trustUncached {
			byName[name] = len(items)
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
		byPool[client.ObjectKeyFromObject(&pools.Items[i])] = heartbeat.PoolTimeout(&pools.Items[i])
	}
	return func(tn *fxv1.TransferNode) time.Duration {
		if d, ok := byPool[client.ObjectKey{Namespace: tn.Spec.PoolNamespace, Name: tn.Spec.PoolName}]; ok {
			return d
		}
		return heartbeat.Timeout(0)
	}, nil
}

// memberHeartbeats reads the heartbeat Leases of the given reports' agents only (through the Lease index).
func (r *VPodTopologyReconciler) memberHeartbeats(ctx context.Context, tns []fxv1.TransferNode) (heartbeat.Beats, error) {
	hb := make(heartbeat.Beats, len(tns))
	for i := range tns {
		key := heartbeat.KeyOf(&tns[i])
		leases := &coordinationv1.LeaseList{}
		if err := r.List(ctx, leases, client.InNamespace(key.PoolNamespace), client.MatchingFields{indexLeaseHeartbeat: key.String()},
			client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing the heartbeat lease of %s: %w", key.Node, err)
		}
		for j := range leases.Items {
			if k, renew, ok := heartbeat.FromLease(&leases.Items[j]); ok && k == key && renew.After(hb[key]) {
				hb[key] = renew
			}
		}
	}
	return hb, nil
}

// reportedDomains are the domain keys a TransferNode's GPUs report, and those of the declarations it
// reports (taken or refused, for the Declared condition), each once.
func reportedDomains(tn *fxv1.TransferNode) []string {
	var keys []string
	seen := map[string]bool{}
	add := func(k string) {
		if k != "" && !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	for _, g := range tn.Status.GPUs {
		if g.Fabric != nil {
			add(g.Fabric.Domain)
		}
	}
	for _, d := range tn.Status.Declarations {
		add(d.Domain)
	}
	return keys
}

// reportsByNode indexes reports by node name.
func reportsByNode(tns []fxv1.TransferNode) map[string]*fxv1.TransferNode {
	out := make(map[string]*fxv1.TransferNode, len(tns))
	for i := range tns {
		out[tns[i].Name] = &tns[i]
	}
	return out
}

// syncMemberLabels gives a declared VPodTopology one MemberLabel per member node and removes the others, with
// one merge patch when they differ: each agent watches only the VPodTopologies labelled for its node.
func (r *VPodTopologyReconciler) syncMemberLabels(ctx context.Context, vp *fxv1.VPodTopology, members []fxv1.VPodMember) error {
	want := map[string]bool{}
	for _, m := range members {
		want[fxv1.MemberLabel(m.Node)] = true
	}
	before := vp.DeepCopy()
	changed := false
	for k := range vp.Labels {
		if strings.HasPrefix(k, fxv1.MemberLabelPrefix) && !want[k] {
			delete(vp.Labels, k)
			changed = true
		}
	}
	for k := range want {
		if vp.Labels[k] != "true" {
			if vp.Labels == nil {
				vp.Labels = map[string]string{}
			}
			vp.Labels[k] = "true"
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := r.Patch(ctx, vp, client.MergeFrom(before)); err != nil {
		r.forget(vp.Name)
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("labelling the member nodes of domain %s: %w", vp.Name, err)
	}
	r.remember(vp, r.Clock.Now())
	return nil
}

// domainRequests are the work items of domain keys.
func domainRequests(keys []string) []reconcile.Request {
	reqs := make([]reconcile.Request, len(keys))
	for i, k := range keys {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKey{Name: k}}
	}
	return reqs
}

// batched enqueues the requests of an event's objects (both of an update, so a domain a report left is
// looked at too) after vpodBatchWindow; requests already waiting keep their earlier time, so a burst of one
// domain's reports is one reconcile.
func batched(toRequests func(context.Context, client.Object) []reconcile.Request) handler.EventHandler {
	add := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		for _, o := range objs {
			for _, req := range toRequests(ctx, o) {
				q.AddAfter(req, vpodBatchWindow)
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(ctx context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.ObjectOld, e.ObjectNew)
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(ctx, q, e.Object)
		},
	}
}

// SetupWithManager indexes reports by domain, VPodTopologies by domain and Leases by heartbeat key, and turns
// every TransferNode event into its domains (before and after), every VPodTopology event into its domain, and
// every heartbeat Lease event that changes freshness into the domains of that node's report.
func (r *VPodTopologyReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Recorder != nil {
		r.Recorder = newEventBudget(r.Recorder, domainEventsPerSecond, domainEventBurst, r.Clock, DomainEventsDropped(ctrlmetrics.Registry))
	}
	ctx := context.Background()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &fxv1.TransferNode{}, indexTransferNodeDomains, func(o client.Object) []string {
		return reportedDomains(o.(*fxv1.TransferNode))
	}); err != nil {
		return fmt.Errorf("indexing transfer nodes by domain: %w", err)
	}
	if err := idx.IndexField(ctx, &fxv1.VPodTopology{}, indexVPodDomain, func(o client.Object) []string {
		return []string{o.(*fxv1.VPodTopology).Spec.Domain}
	}); err != nil {
		return fmt.Errorf("indexing vpod topologies by domain: %w", err)
	}
	if err := idx.IndexField(ctx, &coordinationv1.Lease{}, indexLeaseHeartbeat, func(o client.Object) []string {
		if key, _, ok := heartbeat.FromLease(o.(*coordinationv1.Lease)); ok {
			return []string{key.String()}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing leases by heartbeat: %w", err)
	}
	r.indexed = true
	reader := mgr.GetCache()
	ofReport := func(_ context.Context, o client.Object) []reconcile.Request {
		tn, ok := o.(*fxv1.TransferNode)
		if !ok {
			return nil
		}
		return domainRequests(reportedDomains(tn))
	}
	ofDomain := func(_ context.Context, o client.Object) []reconcile.Request {
		vp, ok := o.(*fxv1.VPodTopology)
		if !ok || vp.Spec.Domain == "" {
			return nil
		}
		return domainRequests([]string{vp.Spec.Domain})
	}
	ofLease := func(ctx context.Context, o client.Object) []reconcile.Request {
		l, ok := o.(*coordinationv1.Lease)
		if !ok || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return nil
		}
		tn := &fxv1.TransferNode{}
		if err := reader.Get(ctx, client.ObjectKey{Name: *l.Spec.HolderIdentity}, tn); err != nil {
			return nil // no report yet: its first report brings its domains in
		}
		return domainRequests(reportedDomains(tn))
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("vpodtopology").
		WithOptions(controller.Options{MaxConcurrentReconciles: vpodWriters}).
		Watches(&fxv1.TransferNode{}, batched(ofReport)).
		Watches(&fxv1.VPodTopology{}, batched(ofDomain)).
		Watches(&coordinationv1.Lease{}, batched(ofLease), builder.WithPredicates(heartbeatPredicate(r.Clock))).
		Complete(r)
}

func (r *VPodTopologyReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// memberNames are the nodes of members.
func memberNames(members []fxv1.VPodMember) []string {
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.Node
	}
	return names
}
