// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"sync"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/server"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

const (
	reportOnlyReason = "this agent only reports (--report-only): it serves no socket and runs no engine"
	startingReason   = "starting: the agent has not assembled its engines yet"
	restartReason    = "detection found it possible after the agent started, and engines are assembled at start: restart the agent to run it"
)

// engineRuns is what the transfer side runs, for the report and the DRA devices: detection says what the
// hardware allows, and an admin, explain and the scheduler must also know what the agent moves bytes with
// (an RDMA node whose agent has no libibverbs offers no rdma).
type engineRuns struct {
	reportOnly bool
	// kick is signalled (without blocking) when the engines are assembled, so the report says so at once.
	kick chan struct{}

	mu sync.Mutex
	// running is GetInfo's engine statuses once the transfer side assembled its engines (nil before);
	// detectedAtStart is which engines the detection they were assembled from found possible.
	running         map[string]server.EngineStatus
	detectedAtStart map[string]bool
}

func newEngineRuns(reportOnly bool) *engineRuns {
	return &engineRuns{reportOnly: reportOnly, kick: make(chan struct{}, 1)}
}

// assembled records the engines the transfer side runs (its GetInfo statuses) and the detection they were
// assembled from.
func (r *engineRuns) assembled(statuses []server.EngineStatus, detected []topology.Engine) {
	running := make(map[string]server.EngineStatus, len(statuses))
	for _, s := range statuses {
		running[s.Name] = s
	}
	atStart := make(map[string]bool, len(detected))
	for _, e := range detected {
		atStart[e.Name] = e.Available
	}
	r.mu.Lock()
	r.running, r.detectedAtStart = running, atStart
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// of says whether the agent runs an engine detection now reports as e, and why not (or how, where that is not
// detection's reason).
func (r *engineRuns) of(e topology.Engine) (bool, string) {
	if r.reportOnly {
		return false, reportOnlyReason
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		return false, startingReason
	}
	s, ok := r.running[e.Name]
	switch {
	case e.Available && (!ok || !r.detectedAtStart[e.Name]):
		return false, restartReason
	case !ok || (!e.Available && r.detectedAtStart[e.Name]):
		return false, e.Reason // detection no longer finds it possible (a declaration deleted): it has no pair to move
	case s.Available && s.Reason == e.Reason:
		return true, "" // runs as detection says
	}
	return s.Available, s.Reason
}

// decorate adds whether each engine runs to a report's status (nodesync.Config.Decorate).
func (r *engineRuns) decorate(st *v1alpha1.TransferNodeStatus) {
	for i := range st.Engines {
		e := &st.Engines[i]
		runs, why := r.of(topology.Engine{Name: string(e.Name), Available: e.Available, Reason: e.Reason})
		e.Running, e.RunningReason = &runs, nodestatus.ClipReason(why)
	}
}

// overlay wraps a detector so that the engines it reports available are those the agent runs (for the DRA
// devices: a claim that selects on an engine must land where the agent moves bytes with it).
func (r *engineRuns) overlay(detect detectFunc) detectFunc {
	return func(ctx context.Context) (topology.Report, error) {
		rep, err := detect(ctx)
		if err != nil {
			return rep, err
		}
		engines := make([]topology.Engine, len(rep.Engines))
		for i, e := range rep.Engines {
			runs, why := r.of(e)
			engines[i] = topology.Engine{Name: e.Name, Available: runs, Reason: why}
		}
		rep.Engines = engines
		return rep, nil
	}
}
