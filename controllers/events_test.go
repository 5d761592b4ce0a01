// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// waitEvent waits for an Event of the operator about the object kind/name with the reason, type and a note
// holding every part of want.
func waitEvent(t *testing.T, c client.Client, namespace, kind, name, typ, reason string, want ...string) {
	t.Helper()
	eventually(t, settle, fmt.Sprintf("%s Event %s on %s %s", typ, reason, kind, name), func() error {
		var list eventsv1.EventList
		if err := c.List(context.Background(), &list, client.InNamespace(namespace)); err != nil {
			return err
		}
		var seen []string
	next:
		for _, e := range list.Items {
			if e.Regarding.Kind != kind || e.Regarding.Name != name || e.ReportingController != EventRecorderName {
				continue
			}
			seen = append(seen, e.Reason+": "+e.Note)
			if e.Reason != reason || e.Type != typ {
				continue
			}
			for _, w := range want {
				if !strings.Contains(e.Note, w) {
					continue next
				}
			}
			return nil
		}
		return fmt.Errorf("events seen: %q", seen)
	})
}

// Pools record Events as nodes start and stop reporting, when they turn Ready, when a later pool conflicts,
// and when their agents' certificates are issued.
func TestPoolEventsForNodesConflictsAndCertificates(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	ns, other := newNamespace(t, c), newNamespace(t, c)
	nodes := newNodes(t, c, "events", 2)
	a := newPool(t, c, ns, "a", "events")
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeNormal, EventCertsIssued, "valid until")
	now := time.Now()
	report(t, c, a, nodes[0], now, nil)
	report(t, c, a, nodes[1], now, nil)
	waitPool(t, c, a, metav1.ConditionTrue, fxv1.ReasonAllNodesReady, "2/2")
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeNormal, EventPoolReady, "2/2")
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeNormal, EventNodesReady, "2/2 selected nodes report")

	renewLease(t, c, a, nodes[1], now.Add(-time.Hour))
	waitPool(t, c, a, metav1.ConditionFalse, fxv1.ReasonNodesNotReady, "1/2")
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeWarning, EventNodesNotReady, "1/2", "not reporting: "+nodes[1])
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeWarning, EventPoolNotReady, fxv1.ReasonNodesNotReady, nodes[1])
	waitEvent(t, c, ns, "TransferPool", "a", corev1.EventTypeWarning, EventAgentsMissing, "1 selected nodes stopped heartbeating")

	time.Sleep(1100 * time.Millisecond) // creation times have a resolution of one second
	b := newPool(t, c, other, "b", "events")
	t.Cleanup(func() { _ = c.Delete(context.Background(), b) })
	waitEvent(t, c, other, "TransferPool", "b", corev1.EventTypeWarning, EventConflict, ns+"/a")
	if err := c.Delete(ctx, b); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// Domains record Events when the operator discovers them, when members join or stop reporting, and when the
// last member leaves and the operator deletes them.
func TestVPodEventsForDomainsAndMembers(t *testing.T) {
	c := apiClient(t)
	ctx := context.Background()
	pool := &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "no-such-pool"}}
	key := "ualink:9/4"
	name := fxv1.DomainObjectName(key)
	now := time.Now()
	report(t, c, pool, "ev-vp-0", now, gpusIn(key, 0, 1))
	report(t, c, pool, "ev-vp-1", now, gpusIn(key, 0, 1))
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeNormal, EventDomainCreated, key)
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeNormal, EventMembersChanged, "ev-vp-0")

	report(t, c, pool, "ev-vp-1", now.Add(-time.Hour), gpusIn(key, 0, 1))
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeWarning, EventMembersMissing, "ev-vp-1")
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeWarning, EventDomainIncomplete, fxv1.ReasonMembersMissing, "ev-vp-1")
	report(t, c, pool, "ev-vp-1", time.Now(), gpusIn(key, 0, 1))
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeNormal, EventDomainComplete, "2 nodes, 4 GPUs")

	for _, n := range []string{"ev-vp-0", "ev-vp-1"} {
		if err := c.Delete(ctx, &fxv1.TransferNode{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	waitEvent(t, c, "default", "VPodTopology", name, corev1.EventTypeNormal, EventDomainEmptied, key)
}

// poolEvents records a transition once: a status that did not change the Ready reason or the reporting
// nodes records nothing.
func TestPoolEventsOnlyOnTransitions(t *testing.T) {
	ready := func(reason string) []metav1.Condition {
		return []metav1.Condition{{Type: fxv1.ConditionReady, Status: metav1.ConditionFalse, Reason: reason, Message: reason}}
	}
	st := fxv1.TransferPoolStatus{DesiredNodes: 3, ReadyNodes: 2, NotReadyNodes: []string{"n2"}, Conditions: ready(fxv1.ReasonNodesNotReady)}
	changed := st
	changed.EngineSummary = "tcp=2"
	if evs := poolEvents(st, changed); len(evs) != 0 {
		t.Errorf("a status changed only in its engine summary recorded %v", evs)
	}
	worse := st
	worse.ReadyNodes, worse.NotReadyNodes = 1, []string{"n1", "n2"}
	if evs := poolEvents(st, worse); len(evs) != 1 || evs[0].reason != EventNodesNotReady || !strings.Contains(evs[0].note, "not reporting: n1") ||
		strings.Contains(evs[0].note, "n2") {
		t.Errorf("a node going quiet recorded %v", evs)
	}
	conflict := st
	conflict.Conditions = ready(fxv1.ReasonConflict)
	if evs := poolEvents(st, conflict); len(evs) != 1 || evs[0].reason != EventConflict || evs[0].typ != corev1.EventTypeWarning {
		t.Errorf("a conflict recorded %v", evs)
	}
	if evs := poolEvents(conflict, conflict); len(evs) != 0 {
		t.Errorf("an unchanged conflict recorded %v", evs)
	}
}

// The transitions a pool and a domain record, from statuses alone: Ready leaving True, Degraded turning True
// for agents that went quiet, a domain becoming complete or incomplete; a first status records none of the
// last two.
func TestReadinessTransitionEvents(t *testing.T) {
	cond := func(typ string, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: s, Reason: reason, Message: reason}
	}
	ready := fxv1.TransferPoolStatus{DesiredNodes: 2, ReadyNodes: 2, Conditions: []metav1.Condition{
		cond(fxv1.ConditionReady, metav1.ConditionTrue, fxv1.ReasonAllNodesReady), cond(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonAsExpected)}}
	quiet := fxv1.TransferPoolStatus{DesiredNodes: 2, ReadyNodes: 1, NotReadyNodes: []string{"n1"}, Conditions: []metav1.Condition{
		cond(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonNodesNotReady), cond(fxv1.ConditionDegraded, metav1.ConditionTrue, fxv1.ReasonNodesNotReady)}}
	reasons := func(evs []pendingEvent) []string {
		var out []string
		for _, e := range evs {
			out = append(out, e.reason)
		}
		return out
	}
	if got := reasons(poolEvents(ready, quiet)); !slices.Equal(got, []string{EventPoolNotReady, EventAgentsMissing, EventNodesNotReady}) {
		t.Errorf("a node going quiet in a Ready pool recorded %v", got)
	}
	if got := reasons(poolEvents(quiet, quiet)); len(got) != 0 {
		t.Errorf("an unchanged status recorded %v", got)
	}
	// Nodes still rolling out are not agents missing: Degraded stays False.
	rolling := quiet
	rolling.Conditions = []metav1.Condition{cond(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonNodesNotReady), cond(fxv1.ConditionDegraded, metav1.ConditionFalse, fxv1.ReasonAsExpected)}
	if got := reasons(poolEvents(fxv1.TransferPoolStatus{}, rolling)); slices.Contains(got, EventAgentsMissing) || slices.Contains(got, EventPoolNotReady) {
		t.Errorf("a pool rolling out recorded %v", got)
	}

	complete := fxv1.VPodTopologyStatus{Nodes: 2, GPUs: 4, Conditions: []metav1.Condition{cond(fxv1.ConditionReady, metav1.ConditionTrue, fxv1.ReasonMembersComplete)}}
	incomplete := fxv1.VPodTopologyStatus{Nodes: 1, GPUs: 2, MissingMembers: []string{"n1"}, Conditions: []metav1.Condition{cond(fxv1.ConditionReady, metav1.ConditionFalse, fxv1.ReasonMembersMissing)}}
	if got := reasons(vpodEvents(complete, incomplete)); !slices.Contains(got, EventDomainIncomplete) {
		t.Errorf("a domain losing a member recorded %v", got)
	}
	if got := reasons(vpodEvents(incomplete, complete)); !slices.Equal(got, []string{EventDomainComplete}) {
		t.Errorf("a domain completing recorded %v", got)
	}
	if got := reasons(vpodEvents(fxv1.VPodTopologyStatus{}, complete)); slices.Contains(got, EventDomainComplete) {
		t.Errorf("a domain's first status recorded %v", got)
	}
}

// Certificate Events: the first issue, a rotation, and a failure only when the condition turns to it.
func TestCertificateEvents(t *testing.T) {
	failed := &metav1.Condition{Type: fxv1.ConditionCertificatesReady, Status: metav1.ConditionFalse, Reason: fxv1.ReasonCertificatesFailed, Message: "boom"}
	issued := &metav1.Condition{Type: fxv1.ConditionCertificatesReady, Status: metav1.ConditionTrue, Reason: fxv1.ReasonCertificatesIssued}
	if evs := certEvents(nil, issued, PoolCertificates{Change: "issued", First: true}); len(evs) != 1 || evs[0].reason != EventCertsIssued {
		t.Errorf("a first issue recorded %v", evs)
	}
	if evs := certEvents(issued, issued, PoolCertificates{Change: "renewed"}); len(evs) != 1 || evs[0].reason != EventCertsRotated {
		t.Errorf("a renewal recorded %v", evs)
	}
	if evs := certEvents(issued, issued, PoolCertificates{}); len(evs) != 0 {
		t.Errorf("current certificates recorded %v", evs)
	}
	if evs := certEvents(issued, failed, PoolCertificates{}); len(evs) != 1 || evs[0].reason != EventCertsFailed || evs[0].typ != corev1.EventTypeWarning {
		t.Errorf("a failure recorded %v", evs)
	}
	if evs := certEvents(failed, failed, PoolCertificates{}); len(evs) != 0 {
		t.Errorf("a retried failure recorded %v", evs)
	}
}
