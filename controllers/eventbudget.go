// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// The domains' Events (DomainCreated, MembersChanged, DomainComplete, MembersMissing, ...) are one Event per
// status write or more: while a cluster's agents start, at 1,000 nodes about 2,400 Events, more than the
// operator's vPOD creates and status patches together, each one more write on the API server those writes wait
// for (every Event is its own POST, sent at once; client-go's events broadcaster neither limits nor merges Events
// whose notes differ). Agents whose rounds time out on such an API server go stale and come back, and each time
// every domain of the node records a Warning. Past a burst, each type is recorded at a bounded rate and the
// rest dropped and counted; the status says the same as the dropped Events.
const (
	domainEventsPerSecond = 5
	domainEventBurst      = 100
)

// eventBudget records Events through next at most perSecond a second after a burst, Normal and Warning Events
// each with their own budget, so a flood of one type leaves the other's room.
type eventBudget struct {
	next            events.EventRecorder
	normal, warning flowcontrol.PassiveRateLimiter
	dropped         *prometheus.CounterVec
}

// newEventBudget wraps rec; dropped counts the Events left out by type.
func newEventBudget(rec events.EventRecorder, perSecond float32, burst int, clk clock.PassiveClock, dropped *prometheus.CounterVec) *eventBudget {
	return &eventBudget{next: rec, dropped: dropped,
		normal:  flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(perSecond, burst, clk),
		warning: flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(perSecond, burst, clk)}
}

// Eventf implements events.EventRecorder.
func (b *eventBudget) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	budget := b.normal
	if eventtype == corev1.EventTypeWarning {
		budget = b.warning
	}
	if !budget.TryAccept() {
		b.dropped.WithLabelValues(eventtype).Inc()
		return
	}
	b.next.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// DomainEventsDropped is the counter of the domains' Events left out, by type (Normal, Warning), registered
// once with reg (a second reconciler in one process shares it). Both series exist from the start.
func DomainEventsDropped(reg prometheus.Registerer) *prometheus.CounterVec {
	return droppedCounter(reg, prometheus.CounterOpts{
		Name: "fabricxfer_operator_domain_events_dropped_total",
		Help: "Events on VPodTopologies not recorded because more than the operator's budget for them came at once " +
			"(agents starting or going stale together), by type; the status says the same.",
	})
}

// AgentEventsDropped is the counter of the agents controller's Events on pools left out, by type, registered
// once with reg. Both series exist from the start.
func AgentEventsDropped(reg prometheus.Registerer) *prometheus.CounterVec {
	return droppedCounter(reg, prometheus.CounterOpts{
		Name: "fabricxfer_operator_agent_events_dropped_total",
		Help: "Events of the pools' agent DaemonSets (created, restored, rolled out, unavailable, ...) not recorded because " +
			"more than the operator's budget for them came at once, by type; the pools' AgentsReady condition says the same.",
	})
}

func droppedCounter(reg prometheus.Registerer, opts prometheus.CounterOpts) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(opts, []string{"type"})
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(*prometheus.CounterVec); ok {
				c = existing
			}
		}
	}
	for _, t := range []string{corev1.EventTypeNormal, corev1.EventTypeWarning} {
		c.WithLabelValues(t)
	}
	return c
}
