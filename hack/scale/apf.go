// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// apfSnapshot is what API Priority and Fairness did so far, from the API server's metrics: requests dispatched
// and rejected by priority level, the time requests waited in its queues, and each level's seats (its nominal
// share of the server's and what it holds now, after lending and borrowing).
type apfSnapshot struct {
	dispatched, rejected, wait []sample
	nominalSeats, currentSeats []sample
}

// scrapeAPF reads the API server's flow-control metrics.
func scrapeAPF(ctx context.Context, cs kubernetes.Interface) (apfSnapshot, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apfSnapshot{}, fmt.Errorf("reading the API server's metrics: %w", err)
	}
	return parseAPF(raw)
}

func parseAPF(raw []byte) (apfSnapshot, error) {
	var s apfSnapshot
	var err error
	if s.dispatched, err = parseCounter(raw, "apiserver_flowcontrol_dispatched_requests_total"); err != nil {
		return s, err
	}
	if s.rejected, err = parseCounter(raw, "apiserver_flowcontrol_rejected_requests_total"); err != nil {
		return s, err
	}
	if s.wait, err = parseCounter(raw, "apiserver_flowcontrol_request_wait_duration_seconds_bucket"); err != nil {
		return s, err
	}
	if s.nominalSeats, err = parseCounter(raw, "apiserver_flowcontrol_nominal_limit_seats"); err != nil {
		return s, err
	}
	s.currentSeats, err = parseCounter(raw, "apiserver_flowcontrol_current_limit_seats")
	return s, err
}

// apfReport says, between two snapshots, how many requests each priority level served, how many it rejected
// (answered 429, which client-go retries after the Retry-After) and how long the executed ones waited queued,
// by priority level and flow schema; and the seats of the levels that served requests, as of the later one.
func apfReport(before, after apfSnapshot) []string {
	counts := func(m map[string]float64) string {
		if len(m) == 0 {
			return "none"
		}
		keys := sortedKeys(m)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%.0f", strings.ReplaceAll(k, " ", "/"), m[k])
		}
		return strings.Join(parts, " ")
	}
	dispatched := delta(before.dispatched, after.dispatched, "priority_level")
	out := []string{
		"dispatched (priority level): " + counts(dispatched),
		"rejected (priority level/flow schema/reason): " + counts(delta(before.rejected, after.rejected, "priority_level", "flow_schema", "reason")),
	}
	// Seats are gauges: the later snapshot's values, for the levels that served something in between.
	nominal, current := delta(nil, after.nominalSeats, "priority_level"), delta(nil, after.currentSeats, "priority_level")
	var seats []string
	for _, pl := range sortedKeys(dispatched) {
		if dispatched[pl] > 0 {
			seats = append(seats, fmt.Sprintf("%s=%.0f/%.0f", pl, nominal[pl], current[pl]))
		}
	}
	out = append(out, "seats at the end (priority level=nominal/current): "+strings.Join(seats, " "))
	executed := func(l map[string]string) bool { return l["execute"] == "true" }
	for _, l := range histogramQuantiles(before.wait, after.wait, executed, "priority_level", "flow_schema") {
		out = append(out, fmt.Sprintf("queue wait of executed requests (priority level/flow schema): %s n=%.0f p50 %s p90 %s p99 %s",
			strings.ReplaceAll(l.kind, " ", "/"), l.count, ms(l.p50), ms(l.p90), ms(l.p99)))
	}
	return out
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
