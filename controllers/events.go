// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Event reasons the operator records (events.k8s.io/v1, reporting controller fabricxfer-operator), for the
// transitions an admin looks for with kubectl describe or kubectl events. docs/observability.md lists them.
const (
	// On TransferPools.
	EventPoolReady     = "PoolReady"     // every selected node reports (Ready turned True)
	EventNodesReady    = "NodesReady"    // more selected nodes report than before (joined, or back)
	EventNodesNotReady = "NodesNotReady" // fewer selected nodes report than before, or new ones wait for agents
	EventConflict      = "Conflict"      // another pool came first on some of these nodes
	EventInvalidSpec   = "InvalidSpec"   // the operator refuses the spec (also ImageNotAllowed)
	EventNoNodes       = "NoMatchingNodes"
	EventApplyFailed   = "ReconcileError"
	EventPoolNotReady  = "PoolNotReady"           // Ready turned False after it was True (names the reason)
	EventAgentsMissing = "AgentsMissing"          // agents that reported went quiet (Degraded turned True for it)
	EventCertsIssued   = "CertificatesIssued"     // the pool's first CA and trust bundle
	EventCertsRotated  = "CertificatesRotated"    // the CA renewed, or an earlier version's pool-wide key removed
	EventCertsFailed   = "CertificateIssueFailed" // issuing or renewing failed (CertificatesReady turned False for it)
	// The agents controller's, on TransferPools.
	EventAgentsCreated     = "AgentsCreated"     // the agents' DaemonSet, ServiceAccount and RBAC were created
	EventAgentsUpdated     = "AgentsUpdated"     // a new generation of the pool was applied to the DaemonSet
	EventAgentsRestored    = "AgentsRestored"    // the DaemonSet was changed outside the operator and applied again
	EventAgentsRecreated   = "AgentsRecreated"   // the DaemonSet was deleted outside the operator and created again
	EventAgentsRolledOut   = "AgentsRolledOut"   // the DaemonSet's rollout completed (AgentsReady turned AgentsRolledOut)
	EventAgentsUnavailable = "AgentsUnavailable" // the DaemonSet left rolled out with no new generation (agents not available)
	EventAgentsRemoved     = "AgentsRemoved"     // the DaemonSet was deleted: another pool came first on its nodes
	EventAgentsCleanedUp   = "AgentsCleanedUp"   // the pool is being deleted and its agents' objects are gone

	// On VPodTopologies.
	EventDomainCreated    = "DomainCreated"  // a scale-up domain was discovered from agents' reports
	EventDomainEmptied    = "DomainEmptied"  // no reporting node is in the domain any more; the operator deleted it
	EventDomainReplaced   = "DomainReplaced" // an admin declared the domain; the operator deleted its discovered twin
	EventMembersChanged   = "MembersChanged" // nodes joined or left the domain
	EventMembersMissing   = "MembersMissing" // declared or known members stopped reporting
	EventDuplicate        = "DuplicateDomain"
	EventDomainNameTaken  = "DomainNameTaken"  // a discovered domain's object name is another domain's object's
	EventDomainComplete   = "DomainComplete"   // every member reports (Ready turned True)
	EventDomainIncomplete = "DomainIncomplete" // Ready left True: members missing, or none left
)

// EventRecorderName is the reporting controller of the operator's Events.
const EventRecorderName = "fabricxfer-operator"

// pendingEvent is one Event to record: its type, reason and note.
type pendingEvent struct{ typ, reason, note string }

func record(rec events.EventRecorder, obj runtime.Object, action string, evs []pendingEvent) {
	if rec == nil {
		return
	}
	for _, e := range evs {
		rec.Eventf(obj, nil, e.typ, e.reason, action, "%s", e.note)
	}
}

// poolEvents are the transitions between two statuses of a pool worth an Event: the Ready condition's
// reason, and nodes that started or stopped reporting. A status that changed only in heartbeat-driven detail
// (engine counts, vPOD lists) records none.
func poolEvents(before, after fxv1.TransferPoolStatus) []pendingEvent {
	var evs []pendingEvent
	was, now := meta.FindStatusCondition(before.Conditions, fxv1.ConditionReady), meta.FindStatusCondition(after.Conditions, fxv1.ConditionReady)
	if now != nil && (was == nil || was.Reason != now.Reason || was.Status != now.Status) {
		switch now.Reason {
		case fxv1.ReasonAllNodesReady:
			evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventPoolReady, now.Message})
		case fxv1.ReasonConflict:
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventConflict, now.Message})
		case fxv1.ReasonInvalidSpec, fxv1.ReasonImageNotAllowed:
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, now.Reason, now.Message})
		case fxv1.ReasonNoMatchingNodes:
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventNoNodes, now.Message})
		case fxv1.ReasonReconcileError:
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventApplyFailed, now.Message})
		}
		if was != nil && was.Status == metav1.ConditionTrue && now.Status != metav1.ConditionTrue {
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventPoolNotReady, now.Reason + ": " + now.Message})
		}
	}
	// Degraded turns True for nodes whose agents reported and went quiet (not for nodes still rolling out).
	wasDeg, nowDeg := meta.FindStatusCondition(before.Conditions, fxv1.ConditionDegraded), meta.FindStatusCondition(after.Conditions, fxv1.ConditionDegraded)
	if nowDeg != nil && nowDeg.Status == metav1.ConditionTrue && nowDeg.Reason == fxv1.ReasonNodesNotReady &&
		(wasDeg == nil || wasDeg.Status != metav1.ConditionTrue || wasDeg.Reason != nowDeg.Reason) {
		evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventAgentsMissing, nowDeg.Message})
	}
	gone := without(after.NotReadyNodes, before.NotReadyNodes)
	back := without(before.NotReadyNodes, after.NotReadyNodes)
	switch {
	case after.ReadyNodes > before.ReadyNodes:
		note := fmt.Sprintf("%d/%d selected nodes report (was %d)", after.ReadyNodes, after.DesiredNodes, before.ReadyNodes)
		if len(back) > 0 {
			note += "; reporting now: " + strings.Join(back, ", ")
		}
		evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventNodesReady, note})
	case after.ReadyNodes < before.ReadyNodes || len(gone) > 0:
		note := fmt.Sprintf("%d/%d selected nodes report (was %d/%d)", after.ReadyNodes, after.DesiredNodes, before.ReadyNodes, before.DesiredNodes)
		if len(gone) > 0 {
			note += "; not reporting: " + strings.Join(gone, ", ")
		}
		evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventNodesNotReady, note})
	}
	return evs
}

// vpodEvents are the transitions between two statuses of a domain worth an Event.
func vpodEvents(before, after fxv1.VPodTopologyStatus) []pendingEvent {
	var evs []pendingEvent
	if dup := meta.FindStatusCondition(after.Conditions, fxv1.ConditionReady); dup != nil && dup.Reason == fxv1.ReasonDuplicateDomain {
		if was := meta.FindStatusCondition(before.Conditions, fxv1.ConditionReady); was == nil || was.Reason != dup.Reason {
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventDuplicate, dup.Message})
		}
		return evs
	}
	joined := without(memberNames(after.Members), memberNames(before.Members))
	left := without(memberNames(before.Members), memberNames(after.Members))
	if len(joined)+len(left) > 0 {
		note := fmt.Sprintf("%d nodes, %d GPUs", after.Nodes, after.GPUs)
		if len(joined) > 0 {
			note += "; joined: " + strings.Join(clip(joined), ", ")
		}
		if len(left) > 0 {
			note += "; left: " + strings.Join(clip(left), ", ")
		}
		evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventMembersChanged, note})
	}
	if missing := without(after.MissingMembers, before.MissingMembers); len(missing) > 0 {
		evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventMembersMissing, "members stopped reporting: " + strings.Join(clip(missing), ", ")})
	}
	// Complete and incomplete are transitions of Ready; a domain's first status is announced by DomainCreated.
	was, now := meta.FindStatusCondition(before.Conditions, fxv1.ConditionReady), meta.FindStatusCondition(after.Conditions, fxv1.ConditionReady)
	if was != nil && now != nil && was.Status != now.Status {
		if now.Status == metav1.ConditionTrue {
			evs = append(evs, pendingEvent{corev1.EventTypeNormal, EventDomainComplete, fmt.Sprintf("%d nodes, %d GPUs: %s", after.Nodes, after.GPUs, now.Message)})
		} else if was.Status == metav1.ConditionTrue {
			evs = append(evs, pendingEvent{corev1.EventTypeWarning, EventDomainIncomplete, now.Reason + ": " + now.Message})
		}
	}
	return evs
}

// without is a's elements that b lacks, in a's order.
func without(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// clip keeps an Event's note short: at most 16 names, then a count.
func clip(names []string) []string {
	if len(names) <= 16 {
		return names
	}
	return append(slices.Clone(names[:16]), fmt.Sprintf("and %d more", len(names)-16))
}
