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

// A burst of Normal Events passes, the rest beyond the rate is dropped and counted, Warnings always pass, and
// the budget refills with time.
func TestEventBudgetBoundsNormalEventsOnly(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 2, 18, 0, 0, 0, time.UTC))
	rec := events.NewFakeRecorder(100)
	dropped := prometheus.NewCounter(prometheus.CounterOpts{Name: "test_dropped_total", Help: "test"})
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

	for range 5 {
		b.Eventf(vp, nil, corev1.EventTypeNormal, EventMembersChanged, "Reconcile", "joined")
	}
	if got := recorded(); got != 3 {
		t.Errorf("5 Normal Events at once with a burst of 3: %d recorded", got)
	}
	if got := counterValue(t, dropped); got != 2 {
		t.Errorf("dropped counter %g, want 2", got)
	}
	for range 4 {
		b.Eventf(vp, nil, corev1.EventTypeWarning, EventMembersMissing, "Reconcile", "stopped reporting")
	}
	if got := recorded(); got != 4 {
		t.Errorf("4 Warnings with the budget spent: %d recorded, want every one", got)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	b.Eventf(vp, nil, corev1.EventTypeNormal, EventDomainComplete, "Reconcile", "complete")
	b.Eventf(vp, nil, corev1.EventTypeNormal, EventDomainComplete, "Reconcile", "complete")
	if got := recorded(); got != 1 {
		t.Errorf("one second later at 1 a second: %d recorded, want 1", got)
	}
	if got := counterValue(t, dropped); got != 3 {
		t.Errorf("dropped counter %g, want 3", got)
	}
}

// The counter is registered once; a second reconciler in the process shares it.
func TestDomainEventsDroppedRegistersOnce(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, b := domainEventsDropped(reg), domainEventsDropped(reg)
	a.Inc()
	if got := counterValue(t, b); got != 1 {
		t.Errorf("second counter reads %g, want the first's 1", got)
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
