// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

// selects reports whether a pool's node selector matches a node.
func selects(pool *fxv1.TransferPool, node *corev1.Node) bool {
	return labels.SelectorFromSet(pool.Spec.NodeSelector).Matches(labels.Set(node.Labels))
}

// allowedEngines is the pool's engine list, defaulted.
func allowedEngines(pool *fxv1.TransferPool) []fxv1.EngineName {
	if len(pool.Spec.Engines) == 0 {
		return fxv1.AllEngines
	}
	return pool.Spec.Engines
}

// PoolObservation is what the reconciler read from the API server for one pool.
type PoolObservation struct {
	// Nodes are every Node object (the pool's selector is applied here).
	Nodes []corev1.Node
	// TransferNodes are every TransferNode, keyed by node name.
	TransferNodes map[string]*fxv1.TransferNode
	// Heartbeats are the agents' Lease renewals; a node without one counts its report's lastHeartbeat.
	Heartbeats heartbeat.Beats
	// OtherPools are every other TransferPool in the cluster.
	OtherPools []fxv1.TransferPool
	// VPodNames name the VPodTopology of each domain key that has one (a declared one may have any name);
	// status.vpods names the others by DomainObjectName, the name the operator gives what it discovers.
	VPodNames map[string]string
	// ApplyError is set when the owned objects could not be applied.
	ApplyError error
	// Invalid is set when the operator refuses the pool's spec (ValidatePool); nothing was applied.
	Invalid error
	Now     time.Time
}

// ComputePoolStatus derives a pool's status from what was observed. It is pure: same inputs, same status.
func ComputePoolStatus(pool *fxv1.TransferPool, obs PoolObservation) fxv1.TransferPoolStatus {
	status := fxv1.TransferPoolStatus{ObservedGeneration: pool.Generation}
	status.Conditions = slices.Clone(pool.Status.Conditions)
	timeout := heartbeat.PoolTimeout(pool)
	allowed := allowedEngines(pool)
	engineNodes, engineAvailable := map[fxv1.EngineName]int32{}, map[fxv1.EngineName]int32{}
	vpods := map[string]bool{}
	var notReady, stale []string
	selected := map[string]bool{}

	for i := range obs.Nodes {
		node := &obs.Nodes[i]
		if !selects(pool, node) {
			continue
		}
		selected[node.Name] = true
		status.DesiredNodes++
		tn := obs.TransferNodes[node.Name]
		if tn != nil && !reportsFor(tn, pool) {
			tn = nil // another pool's agent (one this pool conflicts with, or a pool deleted meanwhile)
		}
		if tn == nil || !obs.Heartbeats.Fresh(tn, obs.Now, timeout) {
			notReady = append(notReady, node.Name)
			if tn != nil && !obs.Heartbeats.Last(tn).IsZero() {
				stale = append(stale, node.Name) // it beat once and stopped; a report not yet beating is starting
			}
			continue
		}
		status.ReadyNodes++
		for _, e := range tn.Status.Engines {
			if !slices.Contains(allowed, e.Name) {
				continue
			}
			if e.Runs() {
				engineNodes[e.Name]++
			}
			if e.Available {
				engineAvailable[e.Name]++
			}
		}
		for _, g := range tn.Status.GPUs {
			if g.Fabric != nil && g.Fabric.Domain != "" {
				vpods[g.Fabric.Domain] = true
			}
		}
	}

	var summary []string
	for _, e := range allowed {
		status.Engines = append(status.Engines, fxv1.EngineCount{Name: e, Nodes: engineNodes[e], Available: engineAvailable[e]})
		summary = append(summary, fmt.Sprintf("%s=%d", e, engineNodes[e]))
	}
	status.EngineSummary = strings.Join(summary, " ")
	status.Nodes = fmt.Sprintf("%d/%d", status.ReadyNodes, status.DesiredNodes)
	// Names are hashed once per domain, not once per GPU (16,000 SHA-256 per reconcile at 2,000 nodes).
	for key := range vpods {
		name := obs.VPodNames[key]
		if name == "" {
			name = fxv1.DomainObjectName(key)
		}
		status.VPods = append(status.VPods, name)
	}
	slices.Sort(status.VPods)
	status.VPodCount = int32(len(status.VPods))
	if len(status.VPods) > maxListedVPods {
		status.VPods = status.VPods[:maxListedVPods]
	}
	slices.Sort(notReady)
	if len(notReady) > 32 {
		notReady = notReady[:32]
	}
	status.NotReadyNodes = notReady

	status.ConflictingPools = OlderConflicts(pool, obs)
	slices.Sort(status.ConflictingPools)
	if len(status.ConflictingPools) > 32 {
		status.ConflictingPools = status.ConflictingPools[:32]
	}

	setPoolConditions(pool, &status, len(stale), obs.Invalid, obs.ApplyError)
	return status
}

// maxListedVPods bounds status.vpods: at 1,000 nodes the full list was 832 names, about 50 KB rewritten in
// every status patch while nodes reported; the count says how many there are.
const maxListedVPods = 64

// precedes reports whether pool a came first: created earlier, or at the same second and first by namespace/name.
// Creation times are the API server's, so no pool can claim to be older than one that exists.
func precedes(a, b *fxv1.TransferPool) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	return a.Name < b.Name
}

// OlderConflicts names (namespace/name) the pools that came before pool and select some of its nodes. The
// earliest pool keeps its nodes and its conditions; a later one shows Conflict and runs no agent, so a pool in
// another namespace with an empty nodeSelector cannot take a running pool's nodes or flip its Ready.
func OlderConflicts(pool *fxv1.TransferPool, obs PoolObservation) []string {
	var names []string
	for i := range obs.OtherPools {
		other := &obs.OtherPools[i]
		if other.UID == pool.UID || (other.Namespace == pool.Namespace && other.Name == pool.Name) || !precedes(other, pool) {
			continue
		}
		for j := range obs.Nodes {
			if selects(pool, &obs.Nodes[j]) && selects(other, &obs.Nodes[j]) {
				names = append(names, other.Namespace+"/"+other.Name)
				break
			}
		}
	}
	return names
}

// PoolRequeueAfter is how long until the pool's status can change without an event: the earliest expiry of a
// selected node's fresh heartbeat; at most one timeout while a node that reported is stale; zero when neither.
func PoolRequeueAfter(pool *fxv1.TransferPool, obs PoolObservation) time.Duration {
	timeout := heartbeat.PoolTimeout(pool)
	exp := expiryTracker{now: obs.Now}
	for i := range obs.Nodes {
		node := &obs.Nodes[i]
		tn := obs.TransferNodes[node.Name]
		if tn == nil || !selects(pool, node) {
			continue
		}
		if at := obs.Heartbeats.LastAt(tn, obs.Now, timeout); !at.IsZero() && obs.Now.Sub(at) < timeout {
			exp.fresh(at, timeout)
		} else {
			exp.stale(timeout)
		}
	}
	return exp.after()
}

func setPoolConditions(pool *fxv1.TransferPool, status *fxv1.TransferPoolStatus, staleNodes int, invalid, applyErr error) {
	set := func(condType string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: condType, Status: s, Reason: reason, Message: boundedMessage(msg), ObservedGeneration: pool.Generation,
		})
	}
	ready, desired := status.ReadyNodes, status.DesiredNodes
	switch {
	case invalid != nil:
		reason := fxv1.ReasonInvalidSpec
		if errors.Is(invalid, ErrImageNotAllowed) {
			reason = fxv1.ReasonImageNotAllowed
		}
		msg := "the operator runs no agent for this pool: " + invalid.Error()
		set(fxv1.ConditionReady, metav1.ConditionFalse, reason, msg)
		set(fxv1.ConditionProgressing, metav1.ConditionFalse, reason, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionTrue, reason, msg)
	case applyErr != nil:
		msg := "applying the agent DaemonSet and RBAC failed: " + applyErr.Error()
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonReconcileError, msg)
		set(fxv1.ConditionProgressing, metav1.ConditionFalse, fxv1.ReasonReconcileError, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonReconcileError, msg)
	case len(status.ConflictingPools) > 0:
		msg := fmt.Sprintf("nodes selected by this pool are already served by %s, which came first; this pool runs no agent until a nodeSelector is narrowed",
			strings.Join(status.ConflictingPools, ", "))
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonConflict, msg)
		set(fxv1.ConditionProgressing, metav1.ConditionFalse, fxv1.ReasonConflict, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonConflict, msg)
	case desired == 0:
		msg := "no Node matches spec.nodeSelector; check the node labels"
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, msg)
		set(fxv1.ConditionProgressing, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, msg)
		set(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonNoMatchingNodes, msg)
	case ready == desired:
		msg := fmt.Sprintf("%d/%d selected nodes have a reporting agent", ready, desired)
		set(fxv1.ConditionReady, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, msg)
		// Every node reporting says nothing of a spec change whose agents are still replacing the old ones: the
		// agents controller's condition does (`kubectl wait --for=condition=Progressing=false` must wait for it).
		// A condition of an older generation is the agents controller's answer before this change: it is
		// applying it (both controllers see the change; this one usually writes first).
		if agents := meta.FindStatusCondition(status.Conditions, fxv1.ConditionAgentsReady); agents != nil &&
			(agents.Reason == fxv1.ReasonAgentsRollingOut || agents.ObservedGeneration != pool.Generation) {
			msg := agents.Message
			if agents.ObservedGeneration != pool.Generation {
				msg = fmt.Sprintf("the agents of generation %d are being applied", pool.Generation)
			}
			set(fxv1.ConditionProgressing, metav1.ConditionTrue, fxv1.ReasonAgentsRollingOut, msg)
		} else {
			set(fxv1.ConditionProgressing, metav1.ConditionFalse, fxv1.ReasonAgentsRolledOut, msg)
		}
		set(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonAsExpected, msg)
	default:
		msg := fmt.Sprintf("%d/%d selected nodes have a reporting agent; not reporting: %s",
			ready, desired, strings.Join(status.NotReadyNodes, ", "))
		set(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, msg)
		set(fxv1.ConditionProgressing, metav1.ConditionTrue, fxv1.ReasonWaitingForReports, msg)
		// Nodes that never reported are still rolling out; a node whose agent reported and went quiet is Degraded.
		if staleNodes > 0 {
			set(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonNodesNotReady,
				fmt.Sprintf("%d selected nodes stopped heartbeating; %s", staleNodes, msg))
		} else {
			set(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonAsExpected, msg)
		}
	}
}

// maxConditionMessage bounds what the operator writes into a condition's message. The API allows 32,768 bytes;
// a message past that (an error quoting a tenant's 40,000-character field) refused the whole status write, so the
// condition never said anything. Kept well below: a condition is read by people.
const maxConditionMessage = 4096

// boundedMessage cuts msg to maxConditionMessage bytes, at a character boundary, saying how much was cut.
func boundedMessage(msg string) string {
	if len(msg) <= maxConditionMessage {
		return msg
	}
	cut := maxConditionMessage - 64
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes more)", msg[:cut], len(msg)-cut)
}

// reportsFor says whether tn is written by pool's agent. A report that names no pool (an agent older than the
// field) counts for whichever pool selects its node, as before.
func reportsFor(tn *fxv1.TransferNode, pool *fxv1.TransferPool) bool {
	return tn.Spec.PoolName == "" || tn.Spec.PoolNamespace == pool.Namespace && tn.Spec.PoolName == pool.Name
}
