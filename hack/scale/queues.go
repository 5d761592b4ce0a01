// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
)

// queueSnapshot is what the operator's controller-runtime metrics say about its controllers at one moment:
// reconciles by result, reconcile errors, work queue retries (rate-limited re-adds and requeues after a delay)
// and depth, and its API client's requests by method and status code. Between two snapshots it shows whether
// the operator was writing, waiting out backoffs, or retrying conflicts.
type queueSnapshot struct {
	reconciles, errors, retries, depth, requests []sample
	// Sums and counts of the reconcile-time and time-in-queue histograms, for their means.
	reconcileSum, reconcileCount, queuedSum, queuedCount []sample
}

// scrapeQueues reads a queueSnapshot from the operator's metrics endpoint.
func scrapeQueues(ctx context.Context, url string) (queueSnapshot, error) {
	raw, err := scrape(ctx, url)
	if err != nil {
		return queueSnapshot{}, err
	}
	var s queueSnapshot
	for _, m := range []struct {
		name string
		into *[]sample
	}{
		{"controller_runtime_reconcile_total", &s.reconciles},
		{"controller_runtime_reconcile_errors_total", &s.errors},
		{"workqueue_retries_total", &s.retries},
		{"workqueue_depth", &s.depth},
		{"rest_client_requests_total", &s.requests},
		{"controller_runtime_reconcile_time_seconds_sum", &s.reconcileSum},
		{"controller_runtime_reconcile_time_seconds_count", &s.reconcileCount},
		{"workqueue_queue_duration_seconds_sum", &s.queuedSum},
		{"workqueue_queue_duration_seconds_count", &s.queuedCount},
	} {
		if *m.into, err = parseCounter(raw, m.name); err != nil {
			return queueSnapshot{}, fmt.Errorf("reading %s from the operator's metrics: %w", m.name, err)
		}
	}
	return s, nil
}

// queueReport describes the controllers' work between two snapshots, one line per kind of figure: reconciles
// by controller and result, errors and retries by controller, the API client's requests by method and code
// (codes other than 2xx are what make reconciles fail), and each queue's depth at the start.
func queueReport(before, after queueSnapshot) []string {
	line := func(title string, m map[string]float64) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%.0f", strings.ReplaceAll(strings.TrimSpace(k), " ", "/"), m[k]))
		}
		if len(parts) == 0 {
			parts = append(parts, "none")
		}
		return title + ": " + strings.Join(parts, " ")
	}
	depth := map[string]float64{}
	for _, s := range before.depth {
		depth[s.labels["name"]] += s.value
	}
	mean := func(sumBefore, sumAfter, countBefore, countAfter []sample, by string) map[string]float64 {
		sums, counts := delta(sumBefore, sumAfter, by), delta(countBefore, countAfter, by)
		out := map[string]float64{}
		for k, n := range counts {
			out[k+" ms"] = 1000 * sums[k] / n
		}
		return out
	}
	return []string{
		line("mean reconcile time (controller)", mean(before.reconcileSum, after.reconcileSum, before.reconcileCount, after.reconcileCount, "controller")),
		line("mean wait in queue once due (queue)", mean(before.queuedSum, after.queuedSum, before.queuedCount, after.queuedCount, "name")),
		line("reconciles (controller/result)", delta(before.reconciles, after.reconciles, "controller", "result")),
		line("reconcile errors (controller)", delta(before.errors, after.errors, "controller")),
		line("work queue retries (queue)", delta(before.retries, after.retries, "name")),
		line("API requests (method/code)", delta(before.requests, after.requests, "method", "code")),
		line("queue depth at the start (queue)", depth),
	}
}

// numbersAndNames are the parts of an error message that differ between objects of one kind of error: node
// and domain names, hashes, resource versions, durations.
var numbersAndNames = regexp.MustCompile(`scale-node-[0-9]+|[0-9a-f]{8,}(-[0-9a-f]{4,})*|[0-9]+(\.[0-9]+)?`)

// errorKinds groups the error-level lines of a JSON (zap) log by controller and message, with names and
// numbers replaced by "#", and lists the n most frequent as "count× controller: message: error".
func errorKinds(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the operator log: %w", err)
	}
	defer f.Close()
	counts := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var l struct {
			Level, Controller, Msg, Error string
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Level != "error" {
			continue
		}
		msg := l.Controller + ": " + l.Msg
		if l.Error != "" {
			msg += ": " + numbersAndNames.ReplaceAllString(l.Error, "#")
		}
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		counts[msg]++
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the operator log: %w", err)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if counts[keys[i]] != counts[keys[j]] {
			return counts[keys[i]] > counts[keys[j]]
		}
		return keys[i] < keys[j]
	})
	out := make([]string, 0, min(n, len(keys)))
	for _, k := range keys[:min(n, len(keys))] {
		out = append(out, fmt.Sprintf("%d× %s", counts[k], k))
	}
	return out, nil
}

// failureCount counts the simulated agents' failed rounds by cause.
type failureCount struct {
	mu sync.Mutex
	by map[string]int
}

func (f *failureCount) add(kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[string]int{}
	}
	f.by[kind]++
}

func (f *failureCount) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.by))
	for k := range f.by {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, f.by[k])
	}
	return strings.Join(parts, " ")
}

// failureKind names why a round failed: the round's own deadline (the agent bounds a round by its period), the
// API server's answer (its status reason: Timeout, ServerTimeout, TooManyRequests, Conflict, ...), or a
// connection error; and which write it was, from the reporter's wrapped message.
func failureKind(err error) string {
	var cause string
	var status apierrors.APIStatus
	switch {
	case errors.As(err, &status) && status.Status().Reason != "":
		cause = string(status.Status().Reason)
	case errors.Is(err, context.DeadlineExceeded):
		cause = "round deadline"
	case errors.Is(err, context.Canceled):
		cause = "cancelled"
	default:
		cause = "other"
	}
	msg := err.Error()
	for _, step := range []string{"reading Node", "applying TransferNode", "heartbeat Lease"} {
		if strings.Contains(msg, step) {
			if step == "applying TransferNode" && strings.Contains(msg, "status") {
				step += " status"
			}
			return strings.ReplaceAll(step, " ", "_") + ":" + strings.ReplaceAll(cause, " ", "_")
		}
	}
	return "other:" + strings.ReplaceAll(cause, " ", "_")
}

// reportsSeen records when a watch first delivered each node's report with GPUs in it.
type reportsSeen struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (r *reportsSeen) handler() toolscache.ResourceEventHandler {
	saw := func(obj any) {
		tn, ok := obj.(*v1alpha1.TransferNode)
		if !ok || len(tn.Status.GPUs) == 0 {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.at == nil {
			r.at = map[string]time.Time{}
		}
		if _, ok := r.at[tn.Name]; !ok {
			r.at[tn.Name] = time.Now()
		}
	}
	return toolscache.ResourceEventHandlerFuncs{AddFunc: saw, UpdateFunc: func(_, obj any) { saw(obj) }}
}

// report says how many reports the watch had delivered when the last agent's first round succeeded, and how
// long after each agent's first successful round its report arrived (0 when it arrived before the round
// ended, as the round's last write is the Lease).
func (r *reportsSeen) report(sims []*agentSim, lastFirst time.Time) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	byThen := 0
	var lags []float64
	for i, s := range sims {
		at, ok := r.at[nodeName(i)]
		if ok && !at.After(lastFirst) {
			byThen++
		}
		if first := s.firstReportAt(); ok && !first.IsZero() {
			lags = append(lags, math.Max(0, at.Sub(first).Seconds()))
		}
	}
	sort.Float64s(lags)
	q := func(p float64) float64 {
		if len(lags) == 0 {
			return math.NaN()
		}
		return lags[min(len(lags)-1, int(p*float64(len(lags))))]
	}
	return fmt.Sprintf("%d of %d reports delivered by the last first report; delivered after the agent's first report p50 %.2f s, p90 %.2f s, max %.2f s",
		byThen, len(sims), q(0.5), q(0.9), q(1))
}
