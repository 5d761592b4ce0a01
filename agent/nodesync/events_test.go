// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodesync_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// An agent records one Event on its TransferNode when it first reports, and one per engine whose
// availability changes after that; rounds that change nothing record none.
func TestReporterRecordsEngineAvailabilityEvents(t *testing.T) {
	c := startAPIServer(t, transferNodeCRD)
	ctx := t.Context()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "events-node"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	createNamespace(t, c, "inference")
	var mu sync.Mutex
	rdma := topology.Engine{Name: topology.EngineRDMA, Available: true, Reason: "mlx5_0 ACTIVE"}
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, PoolNamespace: "inference", PoolName: "kv", Period: 10 * time.Second,
		Identity: nodestatus.Identity{AgentVersion: "test"},
		Detect: func(context.Context) (topology.Report, error) {
			mu.Lock()
			defer mu.Unlock()
			return topology.Report{Engines: []topology.Engine{{Name: topology.EngineTCP, Available: true, Reason: "host memory"}, rdma}}, nil
		},
		Client: c, Log: testr.New(t), RecordEvents: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	events := func() []string {
		t.Helper()
		var out []string
		for _, e := range agentEvents(t, c, node.Name) {
			out = append(out, e.Type+" "+e.Reason+": "+e.Note)
		}
		return out
	}

	round := func() {
		t.Helper()
		if err := r.ReportOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	round()
	round()
	got := events()
	if len(got) != 1 || !strings.Contains(got[0], "Normal EnginesReported") || !strings.Contains(got[0], "available: tcp, rdma") {
		t.Fatalf("after two unchanged rounds: %q", got)
	}
	mu.Lock()
	rdma = topology.Engine{Name: topology.EngineRDMA, Available: false, Reason: "mlx5_0 DOWN"}
	mu.Unlock()
	round()
	round()
	got = events()
	if len(got) != 2 || !strings.Contains(strings.Join(got, "\n"), "Warning EngineUnavailable: engine rdma is unavailable: mlx5_0 DOWN") {
		t.Fatalf("after rdma went down: %q", got)
	}
	mu.Lock()
	rdma = topology.Engine{Name: topology.EngineRDMA, Available: true, Reason: "mlx5_0 ACTIVE"}
	mu.Unlock()
	round()
	if got = events(); len(got) != 3 || !strings.Contains(strings.Join(got, "\n"), "Normal EngineAvailable: engine rdma is available") {
		t.Fatalf("after rdma came back: %q", got)
	}
}

// An engine detection allows but the agent does not run (no libibverbs) is a Warning once per reason; an agent
// still assembling its engines, or one that only reports, raises none.
func TestReporterWarnsOfEnginesItDoesNotRun(t *testing.T) {
	c := startAPIServer(t, transferNodeCRD)
	ctx := t.Context()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "not-running-node"}}
	if err := c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	runs, why := false, nodesync.RunningReasonStarting
	r, err := nodesync.New(nodesync.Config{
		NodeName: node.Name, Period: 10 * time.Second, Identity: nodestatus.Identity{AgentVersion: "test"},
		Detect: func(context.Context) (topology.Report, error) {
			return topology.Report{Engines: []topology.Engine{{Name: topology.EngineRDMA, Available: true, Reason: "mlx5_0 ACTIVE"}}}, nil
		},
		Decorate: func(st *v1alpha1.TransferNodeStatus) {
			mu.Lock()
			defer mu.Unlock()
			st.Engines[0].Running, st.Engines[0].RunningReason = &runs, why
		},
		Client: c, Log: testr.New(t), RecordEvents: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	warnings := func() []string {
		t.Helper()
		var out []string
		for _, e := range agentEvents(t, c, node.Name) {
			if e.Reason == nodesync.EventEngineNotRunning {
				out = append(out, e.Note)
			}
		}
		return out
	}

	set := func(r bool, w string) {
		mu.Lock()
		runs, why = r, w
		mu.Unlock()
	}
	round := func() {
		t.Helper()
		if err := r.ReportOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	round()
	if got := warnings(); len(got) != 0 {
		t.Fatalf("an agent assembling its engines warned: %q", got)
	}
	set(false, "hardware: mlx5_0 ACTIVE; not running: libibverbs did not load")
	round()
	round()
	if got := warnings(); len(got) != 1 || !strings.Contains(got[0], "engine rdma is available on this node but its agent does not run it: hardware: mlx5_0 ACTIVE; not running: libibverbs did not load") {
		t.Fatalf("after rdma did not run, two rounds: %q", got)
	}
	set(false, nodesync.RunningReasonReportOnly)
	round()
	set(true, "")
	round()
	if got := warnings(); len(got) != 1 {
		t.Fatalf("a report-only agent, then rdma running, warned again: %q", got)
	}
}

// agentEvents are the Events agents recorded about node's TransferNode.
func agentEvents(t *testing.T, c client.Client, node string) []eventsv1.Event {
	t.Helper()
	var list eventsv1.EventList
	if err := c.List(t.Context(), &list, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Kind == "TransferNode" && e.Regarding.Name == node && e.ReportingController == nodesync.ReportingController {
			out = append(out, e)
		}
	}
	return out
}
