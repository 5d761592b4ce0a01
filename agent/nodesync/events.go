// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// Event reasons an agent records on its TransferNode (events.k8s.io/v1, reporting controller
// fabricxfer-agent, in the default namespace as Events of cluster-scoped objects are).
const (
	EventEnginesReported   = "EnginesReported"   // the agent's first report since it started
	EventEngineAvailable   = "EngineAvailable"   // an engine became available
	EventEngineUnavailable = "EngineUnavailable" // an engine stopped being available, with the reason
	EventEngineNotRunning  = "EngineNotRunning"  // an engine detection allows does not run, with the reason
)

// Reasons an agent gives for not running an engine that need no Warning: it has not assembled its engines
// yet, or it only reports by its configuration.
const (
	RunningReasonStarting   = "starting: the agent has not assembled its engines yet"
	RunningReasonReportOnly = "this agent only reports (--report-only): it serves no socket and runs no engine"
)

// notRunning says whether the agent does not run an engine detection allows, for a reason an admin must hear
// (a missing runtime, a restart needed).
func notRunning(e v1alpha1.EngineAvailability) bool {
	return e.Available && e.Running != nil && !*e.Running && e.RunningReason != RunningReasonStarting &&
		e.RunningReason != RunningReasonReportOnly
}

// ReportingController is the reporting controller of the agents' Events.
const ReportingController = "fabricxfer-agent"

// engineEvents are the Events of a change of engine availability from before (nil: the first report) to after.
func engineEvents(before, after []v1alpha1.EngineAvailability) []eventsv1.Event {
	mk := func(typ, reason, note string) eventsv1.Event {
		return eventsv1.Event{Type: typ, Reason: reason, Note: note}
	}
	if before == nil {
		var on, off []string
		for _, e := range after {
			if e.Available {
				on = append(on, string(e.Name))
			} else {
				off = append(off, fmt.Sprintf("%s (%s)", e.Name, e.Reason))
			}
		}
		evs := []eventsv1.Event{mk(corev1.EventTypeNormal, EventEnginesReported,
			fmt.Sprintf("agent started; available: %s; unavailable: %s", orNone(on), orNone(off)))}
		for _, e := range after {
			if notRunning(e) {
				evs = append(evs, notRunningEvent(e))
			}
		}
		return evs
	}
	was := map[v1alpha1.EngineName]v1alpha1.EngineAvailability{}
	for _, e := range before {
		was[e.Name] = e
	}
	var evs []eventsv1.Event
	for _, e := range after {
		old, known := was[e.Name]
		switch {
		case e.Available && (!known || !old.Available):
			evs = append(evs, mk(corev1.EventTypeNormal, EventEngineAvailable, fmt.Sprintf("engine %s is available: %s", e.Name, e.Reason)))
		case !e.Available && (!known || old.Available):
			evs = append(evs, mk(corev1.EventTypeWarning, EventEngineUnavailable, fmt.Sprintf("engine %s is unavailable: %s", e.Name, e.Reason)))
		}
		if notRunning(e) && (!known || !notRunning(old) || old.RunningReason != e.RunningReason) {
			evs = append(evs, notRunningEvent(e))
		}
	}
	return evs
}

// notRunningEvent is the Warning of an engine detection allows and the agent does not run.
func notRunningEvent(e v1alpha1.EngineAvailability) eventsv1.Event {
	return eventsv1.Event{Type: corev1.EventTypeWarning, Reason: EventEngineNotRunning,
		Note: fmt.Sprintf("engine %s is available on this node but its agent does not run it: %s", e.Name, e.RunningReason)}
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// recordEngineEvents creates the Events of an engine availability change on the node's TransferNode. Events
// are best effort: a refused one is logged at debug level and the round goes on.
func (r *Reporter) recordEngineEvents(ctx context.Context, before, after []v1alpha1.EngineAvailability, now time.Time) {
	if !r.cfg.RecordEvents {
		return
	}
	for i, ev := range engineEvents(before, after) {
		// Named as client-go's recorders name Events: the object's name and a unique suffix.
		prefix := r.cfg.NodeName
		if len(prefix) > 230 {
			prefix = strings.TrimRight(prefix[:230], ".-")
		}
		ev.ObjectMeta = metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", prefix, time.Now().UnixNano()+int64(i)),
			Namespace: metav1.NamespaceDefault}
		ev.EventTime = metav1.NewMicroTime(now)
		ev.ReportingController = ReportingController
		ev.ReportingInstance = ReportingController + "-" + r.cfg.NodeName
		ev.Action = "Detect"
		ev.Regarding = corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "TransferNode",
			Name: r.cfg.NodeName, UID: r.reportUID}
		if len(ev.Note) > 1024 {
			ev.Note = ev.Note[:1021] + "..."
		}
		if err := r.cfg.Client.Create(ctx, &ev); err != nil {
			r.cfg.Log.V(1).Info("recording an Event failed", "node", r.cfg.NodeName, "reason", ev.Reason, "error", err.Error())
		}
	}
}
