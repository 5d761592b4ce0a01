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

// The domains' Normal Events (DomainCreated, MembersChanged, DomainComplete, ...) are one Event per status
// write while a cluster's agents start: at 1,000 nodes about 2,400 Events, more than the operator's vPOD
// creates and status patches together, each one more write on the API server those writes wait for (every
// Event is its own POST, sent at once; client-go's events broadcaster neither limits nor merges Events whose
// notes differ). Past a burst they are recorded at a bounded rate and the rest dropped and counted; Warnings
// (members missing, duplicates) are always recorded. The status says the same as the dropped Events.
const (
	domainEventsPerSecond = 5
	domainEventBurst      = 100
)

// eventBudget records Normal Events through next at most perSecond a second after a burst, Warnings always.
type eventBudget struct {
	next    events.EventRecorder
	normal  flowcontrol.PassiveRateLimiter
	dropped prometheus.Counter
}

// newEventBudget wraps rec; dropped counts the Normal Events left out.
func newEventBudget(rec events.EventRecorder, perSecond float32, burst int, clk clock.PassiveClock, dropped prometheus.Counter) *eventBudget {
	return &eventBudget{next: rec, normal: flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(perSecond, burst, clk), dropped: dropped}
}

// Eventf implements events.EventRecorder.
func (b *eventBudget) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...interface{}) {
	if eventtype != corev1.EventTypeWarning && !b.normal.TryAccept() {
		b.dropped.Inc()
		return
	}
	b.next.Eventf(regarding, related, eventtype, reason, action, note, args...)
}

// domainEventsDropped is the counter of the domains' Normal Events left out, registered once with reg (a
// second reconciler in one process shares it).
func domainEventsDropped(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fabricxfer_operator_domain_events_dropped_total",
		Help: "Normal Events on VPodTopologies not recorded because more than " +
			"the operator's budget for them came at once (agents starting together); the status says the same.",
	})
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(prometheus.Counter); ok {
				return existing
			}
		}
	}
	return c
}
