// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// A burst of Events passes, the rest beyond the rate is dropped and counted by type, Normal and Warning Events
// have budgets of their own, and a budget refills with time.
func TestEventBudgetBoundsEachType(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC))
	rec := events.NewFakeRecorder(100)
	dropped := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_dropped_total", Help: "test"}, []string{"type"})
	b := newEventBudget(rec, 1, 3, clk, dropped)
	vp := &fxv1.VPodTopology{ObjectMeta: metav1.ObjectMeta{Name: "vp"}}
	recorded := func() int {
		n := 0
		for {
			select {
			case <-rec.Events:
				n++
			default:
				return n
			}
		}
	}
	droppedOf := func(typ string) float64 { return counterValue(t, dropped.WithLabelValues(typ)) }

	for range 5 {
		b.Eventf(vp, nil, corev1.EventTypeNormal, EventMembersChanged, "Reconcile", "joined")
	}
	if got := recorded(); got != 3 {
		t.Errorf("5 Normal Events at once with a burst of 3: %d recorded", got)
	}
	if got := droppedOf(corev1.EventTypeNormal); got != 2 {
		t.Errorf("dropped Normal %g, want 2", got)
	}
	// The Normal budget is spent; Warnings have their own.
	for range 4 {
		b.Eventf(vp, nil, corev1.EventTypeWarning, EventMembersMissing, "Reconcile", "stopped reporting")
	}
	if got := recorded(); got != 3 {
		t.Errorf("4 Warnings at once with a burst of 3: %d recorded", got)
	}
	if got := droppedOf(corev1.EventTypeWarning); got != 1 {
		t.Errorf("dropped Warning %g, want 1", got)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	b.Eventf(vp, nil, corev1.EventTypeNormal, EventDomainComplete, "Reconcile", "complete")
	b.Eventf(vp, nil, corev1.EventTypeNormal, EventDomainComplete, "Reconcile", "complete")
	if got := recorded(); got != 1 {
		t.Errorf("one second later at 1 a second: %d recorded, want 1", got)
	}
	if got := droppedOf(corev1.EventTypeNormal); got != 3 {
		t.Errorf("dropped Normal %g, want 3", got)
	}
}

// The counter is registered once; a second reconciler in the process shares it, and both types are served
// before anything was dropped.
func TestDomainEventsDroppedRegistersOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := DomainEventsDropped(reg), DomainEventsDropped(reg)
	a.WithLabelValues(corev1.EventTypeWarning).Inc()
	if got := counterValue(t, b.WithLabelValues(corev1.EventTypeWarning)); got != 1 {
		t.Errorf("second counter reads %g, want the first's 1", got)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(families) != 1 || len(families[0].GetMetric()) != 2 {
		t.Errorf("gathered %v, want one family with a Normal and a Warning series", families)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
