// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// queueReport turns two scrapes of the operator's metrics into per-controller deltas and means.
func TestQueueReportFromTwoScrapes(t *testing.T) {
	parse := func(text string) queueSnapshot {
		t.Helper()
		var s queueSnapshot
		var err error
		for name, into := range map[string]*[]sample{
			"controller_runtime_reconcile_total":              &s.reconciles,
			"controller_runtime_reconcile_errors_total":       &s.errors,
			"workqueue_retries_total":                         &s.retries,
			"workqueue_depth":                                 &s.depth,
			"rest_client_requests_total":                      &s.requests,
			"controller_runtime_reconcile_time_seconds_sum":   &s.reconcileSum,
			"controller_runtime_reconcile_time_seconds_count": &s.reconcileCount,
			"workqueue_queue_duration_seconds_sum":            &s.queuedSum,
			"workqueue_queue_duration_seconds_count":          &s.queuedCount,
		} {
			if *into, err = parseCounter([]byte(text), name); err != nil {
				t.Fatal(err)
			}
		}
		return s
	}
	before := parse(`controller_runtime_reconcile_total{controller="transferpool",result="error"} 2
controller_runtime_reconcile_errors_total{controller="transferpool"} 2
controller_runtime_reconcile_time_seconds_sum{controller="vpodtopology"} 10
controller_runtime_reconcile_time_seconds_count{controller="vpodtopology"} 10
workqueue_depth{controller="vpodtopology",name="vpodtopology"} 192
rest_client_requests_total{code="409",host="x",method="PATCH"} 1
`)
	after := parse(`controller_runtime_reconcile_total{controller="transferpool",result="error"} 7
controller_runtime_reconcile_errors_total{controller="transferpool"} 7
controller_runtime_reconcile_time_seconds_sum{controller="vpodtopology"} 16
controller_runtime_reconcile_time_seconds_count{controller="vpodtopology"} 14
workqueue_depth{controller="vpodtopology",name="vpodtopology"} 0
rest_client_requests_total{code="409",host="x",method="PATCH"} 6
`)
	reportHas(t, queueReport(before, after),
		"mean reconcile time (controller): vpodtopology/ms=1500",
		"reconciles (controller/result): transferpool/error=5",
		"reconcile errors (controller): transferpool=5",
		"work queue retries (queue): none",
		"API requests (method/code): PATCH/409=5",
		"queue depth at the start (queue): vpodtopology=192",
	)
}

// failureKind names the step and the cause of a failed agent round from the reporter's wrapped error.
func TestFailureKindNamesStepAndCause(t *testing.T) {
	gr := schema.GroupResource{Group: "fabricxfer.io", Resource: "transfernodes"}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("applying TransferNode n1 status: %w", context.DeadlineExceeded), "applying_TransferNode_status:round_deadline"},
		{fmt.Errorf("applying TransferNode n1: %w", apierrors.NewTimeoutError("slow", 1)), "applying_TransferNode:Timeout"},
		{fmt.Errorf("renewing heartbeat Lease ns/n1: %w", apierrors.NewConflict(gr, "n1", fmt.Errorf("changed"))), "heartbeat_Lease:Conflict"},
		{fmt.Errorf("reading Node n1 to own its TransferNode: %w", apierrors.NewTooManyRequests("busy", 1)), "reading_Node:TooManyRequests"},
		{fmt.Errorf("detecting node n1: boom"), "other:other"},
	} {
		if got := failureKind(tc.err); got != tc.want {
			t.Errorf("failureKind(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
}

// errorKinds groups a zap JSON log's error lines by controller and message with names and numbers masked,
// most frequent first, and skips lines that are not JSON or not errors.
func TestErrorKindsGroupsAndMasks(t *testing.T) {
	log := `{"level":"error","msg":"Reconciler error","controller":"transferpool","error":"patching status of pool default/scale: conflict at 1234"}
{"level":"info","msg":"starting"}
not json at all
{"level":"error","msg":"Reconciler error","controller":"transferpool","error":"patching status of pool default/scale: conflict at 99"}
{"level":"error","msg":"Reconciler error","controller":"vpodtopology","error":"creating domain scale-node-00042 deadbeefcafe"}
`
	path := filepath.Join(t.TempDir(), "operator.log")
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := errorKinds(path, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"2× transferpool: Reconciler error: patching status of pool default/scale: conflict at #",
		"1× vpodtopology: Reconciler error: creating domain # #",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("errorKinds:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// reportHas fails t for each of wants that the report's lines, joined, do not contain.
func reportHas(t *testing.T, report []string, wants ...string) {
	t.Helper()
	got := strings.Join(report, "\n")
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
