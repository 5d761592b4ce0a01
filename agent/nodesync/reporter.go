// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/go-logr/logr"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// FieldManager is the server-side apply field manager of every write the agent makes.
const FieldManager = "fabricxfer-agent"

// LeaseTimeoutPeriods is how many periods a heartbeat Lease stays valid (its leaseDurationSeconds): the
// operator's heartbeat timeout, three periods, so one lost or late renewal does not flap the node.
const LeaseTimeoutPeriods = 3

// Config says what to report, where, and how often.
type Config struct {
	NodeName      string
	PoolNamespace string
	PoolName      string
	// Period is both the heartbeat and the re-detection interval.
	Period   time.Duration
	Identity nodestatus.Identity
	// Detect reads the node; it is called once per period.
	Detect func(ctx context.Context) (topology.Report, error)
	Client client.Client
	Log    logr.Logger
	// Now returns the heartbeat time; time.Now when nil.
	Now func() time.Time
	// AfterRound, when set, is called after every round of Run with its error (nil when it succeeded).
	AfterRound func(error)
	// Decorate, when set, adds what other parts of the agent know (registered bytes) to each status before
	// it is compared and applied. Every status field goes through this one apply: a second apply by the same
	// field manager that left out the detected fields would remove them.
	Decorate func(*v1alpha1.TransferNodeStatus)
	// Kick, when set, makes Run report at once when it receives (another part of the agent changed what
	// Decorate adds: the engines it runs, once assembled); the next round follows a period later. After a
	// failed round the scheduled retry reports it instead, keeping the backoff.
	Kick <-chan struct{}
	// RecordEvents records Events on the TransferNode when engine availability changes (and once at start).
	RecordEvents bool
	// Watch, when set, is used by Run to watch the agent's own TransferNode (and only it): a status someone
	// else changed, or a deleted object, is written again as soon as it is seen. Without it such a change
	// lasts until the report itself changes.
	Watch client.WithWatch
}

// Reporter writes one node's TransferNode and renews its heartbeat Lease.
type Reporter struct {
	cfg Config
	// nodeUID is the Node's UID for the TransferNode's owner reference, read once (and again when the
	// TransferNode went missing, since its Node may have been recreated): never a GET per round.
	nodeUID types.UID
	// objectApplied is true once metadata and spec were applied; they are applied again only when the object
	// is missing, so thousands of agents do not rewrite unchanged specs every period.
	objectApplied bool
	// reportUID is the TransferNode's UID as last written; the Lease is owned by it and goes with it.
	reportUID types.UID
	// applied is the status (without lastHeartbeat) last applied successfully; nil means it must be applied.
	applied *v1alpha1.TransferNodeStatus
	// lease is the heartbeat Lease as last read or written, so a renewal is one small update.
	lease *coordinationv1.Lease
	// engines are the engines of the last status applied (nil before the first), for Events on changes.
	engines []v1alpha1.EngineAvailability
	// reported is true once a status was applied since the agent started.
	reported bool
	// settled is true once a whole round succeeded: until then a round may take the heartbeat timeout.
	settled bool
	// written is the status (with its heartbeat) as the API server stored it after the agent's last write:
	// what the watch of the own object is compared with.
	written *v1alpha1.TransferNodeStatus
	// awaitVersion is the resourceVersion of the agent's last write (or last read of its object), and caughtUp
	// is true once the watch delivered it: only then is what the watch shows newer.
	awaitVersion string
	caughtUp     bool
	// seenVersion is the resourceVersion of the last object the watch delivered.
	seenVersion string
	// Counters, read by tests and for the log while Run is running.
	rewrites, statusWrites, watchEvents atomic.Int64
	// watching is true while the watch of the own TransferNode is established.
	watching atomic.Bool
}

// Rewrites counts the times the agent wrote its TransferNode again because someone else changed its status or
// deleted it.
func (r *Reporter) Rewrites() int64 { return r.rewrites.Load() }

// StatusWrites counts successful status writes.
func (r *Reporter) StatusWrites() int64 { return r.statusWrites.Load() }

// Watching reports whether the watch of the own TransferNode is established: changes from then on are seen.
func (r *Reporter) Watching() bool { return r.watching.Load() }

// WatchEvents counts the events the watch of the own TransferNode received.
func (r *Reporter) WatchEvents() int64 { return r.watchEvents.Load() }

// New checks the configuration.
func New(cfg Config) (*Reporter, error) {
	switch {
	case cfg.NodeName == "":
		return nil, errors.New("reporter: node name is empty (set --node-name or NODE_NAME)")
	case cfg.Period <= 0:
		return nil, fmt.Errorf("reporter: period %s must be positive", cfg.Period)
	case cfg.Detect == nil:
		return nil, errors.New("reporter: no detector")
	case cfg.Client == nil:
		return nil, errors.New("reporter: no Kubernetes client")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reporter{cfg: cfg}, nil
}

// Run reports at once and then every period until ctx ends; Run returns nil when ctx is cancelled, once the
// watch of the own TransferNode (Config.Watch) has stopped too. A failed round is logged and retried after a
// backoff that grows with consecutive failures, with jitter: retrying every agent at its next tick turned an
// overloaded API server's slowness into collapse. A status changed by someone else, seen by the watch, is
// written back at once by an extra round that leaves the schedule as it is.
func (r *Reporter) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var seen chan observation
	if r.cfg.Watch != nil {
		seen = make(chan observation)
		wg.Go(func() { r.watchOwn(ctx, seen) })
	}
	failures := 0
	var lastRewrite time.Time
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case o := <-seen:
			if !r.observe(ctx, o) {
				continue
			}
			if since := time.Since(lastRewrite); since < r.cfg.Period/2 {
				// Another writer fighting the agent (or a write-back that keeps failing to take) must not
				// turn into writes at watch speed: within half a period of the last write-back, the next
				// periodic round, which observe has told to write, does it.
				r.cfg.Log.V(1).Info("deferring write-back of own TransferNode to the next round", "node", r.cfg.NodeName,
					"sinceLast", since.Round(time.Millisecond))
				continue
			}
			lastRewrite = time.Now()
			if err := r.ReportOnce(ctx); err != nil && ctx.Err() == nil {
				// The periodic round retries; its schedule and backoff are not disturbed.
				r.cfg.Log.Error(err, "writing back own TransferNode", "node", r.cfg.NodeName)
			}
			continue
		case <-r.cfg.Kick:
			if failures == 0 {
				t.Reset(0) // this round now, on the schedule's path
			} // else the retry already scheduled reads the new state: a kick must not undo the backoff
			continue
		case <-t.C:
		}
		start := time.Now()
		err := r.ReportOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if r.cfg.AfterRound != nil {
			r.cfg.AfterRound(err)
		}
		delay := r.cfg.Period
		if err != nil {
			failures++
			delay = RetryDelay(r.cfg.Period, failures, rand.Float64())
			r.cfg.Log.Error(err, "reporting node", "node", r.cfg.NodeName, "failures", failures, "retryIn", delay.Round(time.Millisecond))
		} else {
			failures = 0
		}
		t.Reset(max(0, delay-time.Since(start)))
	}
}

// RetryDelay is the wait after the given number of consecutive failed rounds: 1, 2, then 4 periods, times a
// jitter factor between 0.5 and 1.5 (jitter in [0, 1)). The first retry still comes within the heartbeat
// timeout (three periods), so one lost round does not make the node stale.
func RetryDelay(period time.Duration, failures int, jitter float64) time.Duration {
	periods := 1 << min(max(failures-1, 0), 2)
	return time.Duration(float64(period) * float64(periods) * (0.5 + jitter))
}

// usesLease reports whether the heartbeat is a Lease: it lives in the pool's namespace, so an agent run
// without a pool heartbeats through the TransferNode status every period, as agents did before Leases.
func (r *Reporter) usesLease() bool { return r.cfg.PoolNamespace != "" && r.cfg.PoolName != "" }

// ReportOnce detects the node, applies the TransferNode and its status when they need it, and renews the
// heartbeat Lease. The Lease is renewed only once the report is known current, so a node whose report cannot
// be written goes stale rather than claiming an old report. Each round is bounded by the period, so a slow
// API server cannot stack up rounds; until the first round succeeded, by the heartbeat timeout
// (LeaseTimeoutPeriods periods): the first round writes the most (Node read, object, status, Event, Lease),
// there is no heartbeat yet to keep, and abandoning a slow first round only to send it again is what kept a
// thousand agents starting at once from getting through an API server they had overloaded.
func (r *Reporter) ReportOnce(ctx context.Context) error {
	bound := r.cfg.Period
	if !r.settled {
		bound = LeaseTimeoutPeriods * r.cfg.Period
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	err := r.reportOnce(ctx)
	if err == nil {
		r.settled = true
	}
	return err
}

func (r *Reporter) reportOnce(ctx context.Context) error {
	rep, err := r.cfg.Detect(ctx)
	if err != nil {
		return fmt.Errorf("detecting node %s: %w", r.cfg.NodeName, err)
	}
	st := nodestatus.FromReport(rep, r.cfg.Identity)
	if r.cfg.Decorate != nil {
		r.cfg.Decorate(&st)
	}
	st.LastHeartbeat = nil
	now := r.cfg.Now()
	// A missing object is found by a write that needs it: the Lease (owned by the report, so garbage
	// collected with it), then the status; each discovery costs one more pass, within the same round.
	for pass := 1; ; pass++ {
		gone, err := r.write(ctx, st, now)
		if !gone || pass == 3 {
			return err
		}
	}
}

// write brings the TransferNode and the Lease up to date. gone reports a write that found its object
// missing, after which another pass writes what is now known to be needed.
func (r *Reporter) write(ctx context.Context, st v1alpha1.TransferNodeStatus, now time.Time) (gone bool, _ error) {
	if !r.objectApplied {
		if err := r.applyObject(ctx); err != nil {
			return false, err
		}
		r.objectApplied = true
	}
	if r.applied == nil || !r.usesLease() || !equality.Semantic.DeepEqual(*r.applied, st) {
		withBeat := *st.DeepCopy()
		beat := metav1.NewTime(now)
		withBeat.LastHeartbeat = &beat
		if err := r.applyStatus(ctx, withBeat); err != nil {
			// A failed write may or may not have landed: apply again next time. Only a missing object (deleted
			// with a recreated Node) needs the object, and the Node's UID, read again; re-applying it after
			// every failure tripled the requests of a struggling API server.
			r.applied = nil
			if apierrors.IsNotFound(err) {
				r.objectApplied = false
				r.nodeUID = ""
				return true, err
			}
			return false, err
		}
		r.applied = &st
		var before []v1alpha1.EngineAvailability
		if r.reported {
			before = r.engines
			if before == nil {
				before = []v1alpha1.EngineAvailability{}
			}
		}
		if !r.reported || !equality.Semantic.DeepEqual(before, st.Engines) {
			r.recordEngineEvents(ctx, before, st.Engines, now)
		}
		r.reported, r.engines = true, st.Engines
	}
	if !r.usesLease() {
		return false, nil
	}
	recreated, err := r.renewLease(ctx, now)
	if recreated {
		// The Lease was gone. Its owner, the report, may have gone with it (garbage collection): write the
		// status again to find out.
		r.applied = nil
		return true, err
	}
	return false, err
}

func (r *Reporter) applyObject(ctx context.Context) error {
	if r.nodeUID == "" {
		var node corev1.Node
		if err := r.cfg.Client.Get(ctx, client.ObjectKey{Name: r.cfg.NodeName}, &node); err != nil {
			return fmt.Errorf("reading Node %s to own its TransferNode: %w", r.cfg.NodeName, err)
		}
		r.nodeUID = node.UID
	}
	labels := map[string]any{}
	if r.cfg.PoolName != "" {
		labels[v1alpha1.LabelPoolName] = r.cfg.PoolName
	}
	if r.cfg.PoolNamespace != "" {
		labels[v1alpha1.LabelPoolNamespace] = r.cfg.PoolNamespace
	}
	spec := map[string]any{"nodeName": r.cfg.NodeName}
	if r.cfg.PoolNamespace != "" {
		spec["poolNamespace"] = r.cfg.PoolNamespace
	}
	if r.cfg.PoolName != "" {
		spec["poolName"] = r.cfg.PoolName
	}
	meta := map[string]any{
		"name": r.cfg.NodeName,
		"ownerReferences": []any{map[string]any{
			"apiVersion": "v1",
			"kind":       "Node",
			"name":       r.cfg.NodeName,
			"uid":        string(r.nodeUID),
		}},
	}
	if len(labels) > 0 {
		meta["labels"] = labels
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "TransferNode",
		"metadata":   meta,
		"spec":       spec,
	}}
	if err := r.cfg.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying TransferNode %s: %w", r.cfg.NodeName, err)
	}
	r.reportUID = obj.GetUID()
	r.awaitWrite(obj.GetResourceVersion())
	return nil
}

// statusApply is the apply configuration of the TransferNode's status: the typed status, encoded once. The API
// server gets the same server-side apply as from an unstructured object, but the agent does not turn the status
// into maps and back: make scale runs a thousand agents' clients on the machine of the API server they wait for.
type statusApply struct {
	APIVersion string                      `json:"apiVersion"`
	Kind       string                      `json:"kind"`
	Metadata   statusApplyMeta             `json:"metadata"`
	Status     v1alpha1.TransferNodeStatus `json:"status"`
}

type statusApplyMeta struct {
	Name string `json:"name"`
}

func (r *Reporter) applyStatus(ctx context.Context, st v1alpha1.TransferNodeStatus) error {
	raw, err := json.Marshal(statusApply{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "TransferNode",
		Metadata: statusApplyMeta{Name: r.cfg.NodeName}, Status: st,
	})
	if err != nil {
		return fmt.Errorf("encoding TransferNode status: %w", err)
	}
	got := &v1alpha1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: r.cfg.NodeName}}
	if err := r.cfg.Client.Status().Patch(ctx, got, client.RawPatch(types.ApplyPatchType, raw), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying TransferNode %s status: %w", r.cfg.NodeName, err)
	}
	if got.UID != "" {
		r.reportUID = got.UID
	}
	if err := r.clearForeign(ctx, got, st); err != nil {
		return err
	}
	r.written = got.Status.DeepCopy()
	r.awaitWrite(got.ResourceVersion)
	r.statusWrites.Add(1)
	return nil
}

// LeaseName is the name of the heartbeat Lease of one (pool, node) in the pool's namespace: the node's name,
// readable, and a short hash of pool and node, so two pools in one namespace never share a Lease.
func LeaseName(pool, node string) string {
	sum := sha256.Sum256([]byte(pool + "/" + node))
	readable := node
	if len(readable) > 240 {
		readable = readable[:240]
	}
	readable = strings.TrimRight(readable, ".-")
	return readable + "-" + hex.EncodeToString(sum[:])[:8]
}

// renewLease moves the Lease's renewTime to now with one update of the copy kept from the last write. It
// creates the Lease when the agent has none yet or it is gone (an update of a missing Lease is refused as a
// conflict), and reads it again after a conflict. recreated reports a Lease that was expected and created
// again.
func (r *Reporter) renewLease(ctx context.Context, now time.Time) (recreated bool, _ error) {
	name := LeaseName(r.cfg.PoolName, r.cfg.NodeName)
	expected := r.lease != nil
	for attempt := 1; ; attempt++ {
		if r.lease == nil {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: r.cfg.PoolNamespace, Name: name}}
			r.fillLease(lease, now)
			lease.Spec.AcquireTime = lease.Spec.RenewTime
			err := r.cfg.Client.Create(ctx, lease)
			if err == nil {
				r.lease = lease
				return expected, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return false, fmt.Errorf("creating heartbeat Lease %s/%s: %w", r.cfg.PoolNamespace, name, err)
			}
			existing := &coordinationv1.Lease{}
			if err := r.cfg.Client.Get(ctx, client.ObjectKeyFromObject(lease), existing); err != nil {
				return false, fmt.Errorf("reading heartbeat Lease %s/%s: %w", r.cfg.PoolNamespace, name, err)
			}
			r.lease = existing
		}
		lease := r.lease.DeepCopy()
		r.fillLease(lease, now)
		err := r.cfg.Client.Update(ctx, lease)
		if err == nil {
			r.lease = lease
			return false, nil
		}
		r.lease = nil
		if attempt > 1 || (!apierrors.IsConflict(err) && !apierrors.IsNotFound(err)) {
			return false, fmt.Errorf("renewing heartbeat Lease %s/%s: %w", r.cfg.PoolNamespace, name, err)
		}
		// Gone, or written by someone else since: start again from what the API server has.
	}
}

// fillLease sets what the agent owns in its Lease: holder (the node), duration (the heartbeat timeout), the
// renew time, the pool labels the operator selects by, and the owner reference to the TransferNode.
func (r *Reporter) fillLease(lease *coordinationv1.Lease, now time.Time) {
	holder := r.cfg.NodeName
	duration := int32((LeaseTimeoutPeriods*r.cfg.Period + time.Second - 1) / time.Second)
	renew := metav1.NewMicroTime(now)
	lease.Spec.HolderIdentity = &holder
	lease.Spec.LeaseDurationSeconds = &duration
	lease.Spec.RenewTime = &renew
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[v1alpha1.LabelPoolName] = r.cfg.PoolName
	lease.Labels[v1alpha1.LabelPoolNamespace] = r.cfg.PoolNamespace
	if r.reportUID != "" {
		lease.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(), Kind: "TransferNode", Name: r.cfg.NodeName, UID: r.reportUID,
		}}
	}
}
