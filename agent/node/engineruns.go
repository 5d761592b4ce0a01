// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"maps"
	"sync"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	"github.com/fabricxfer/fabricxfer/agent/server"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

const (
	reportOnlyReason = nodesync.RunningReasonReportOnly
	startingReason   = nodesync.RunningReasonStarting
	restartReason    = "detection found it possible after the agent started, and engines are assembled at start: restart the agent to run it"
)

// engineRuns is what the transfer side runs, for the report and the DRA devices: detection says what the
// hardware allows, and an admin, explain and the scheduler must also know what the agent moves bytes with
// (an RDMA node whose agent has no libibverbs offers no rdma).
type engineRuns struct {
	reportOnly bool
	// kicks are signalled (without blocking) when the engines are assembled, so the report and the DRA devices
	// say so at once.
	kicks []chan struct{}

	mu sync.Mutex
	// running is GetInfo's engine statuses once the transfer side assembled its engines (nil before);
	// detectedAtStart is which engines the detection they were assembled from found possible; gpuMemory which
	// running engines move this node's GPU memory.
	running         map[string]server.EngineStatus
	detectedAtStart map[string]bool
	gpuMemory       map[string]bool
}

func newEngineRuns(reportOnly bool) *engineRuns {
	return &engineRuns{reportOnly: reportOnly}
}

// kick is a channel signalled once the engines are assembled (one per reader).
func (r *engineRuns) kick() <-chan struct{} {
	ch := make(chan struct{}, 1)
	r.kicks = append(r.kicks, ch)
	return ch
}

// assembled records the engines the transfer side runs (its GetInfo statuses), the detection they were
// assembled from and which of them move GPU memory.
func (r *engineRuns) assembled(statuses []server.EngineStatus, detected []topology.Engine, gpuMemory map[string]bool) {
	running := make(map[string]server.EngineStatus, len(statuses))
	for _, s := range statuses {
		running[s.Name] = s
	}
	atStart := make(map[string]bool, len(detected))
	for _, e := range detected {
		atStart[e.Name] = e.Available
	}
	r.mu.Lock()
	r.running, r.detectedAtStart, r.gpuMemory = running, atStart, maps.Clone(gpuMemory)
	r.mu.Unlock()
	for _, ch := range r.kicks {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// engineRun is whether the agent runs an engine, why not (or how, where that is not detection's reason), and
// whether it moves GPU memory (nil: not said).
type engineRun struct {
	runs      bool
	why       string
	gpuMemory *bool
}

// of says how the agent runs an engine detection now reports as e.
func (r *engineRuns) of(e topology.Engine) engineRun {
	if r.reportOnly {
		return engineRun{why: reportOnlyReason}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		return engineRun{why: startingReason}
	}
	s, ok := r.running[e.Name]
	switch {
	case e.Available && (!ok || !r.detectedAtStart[e.Name]):
		return engineRun{why: restartReason}
	case !ok || (!e.Available && r.detectedAtStart[e.Name]):
		return engineRun{} // detection no longer finds it possible (a declaration deleted): its reason says why
	}
	run := engineRun{runs: s.Available, why: s.Reason}
	if run.why == e.Reason {
		run.why = "" // as detection says: its reason is beside it
	}
	if gpu, said := r.gpuMemory[e.Name]; said && run.runs {
		run.gpuMemory = &gpu
	}
	return run
}

// decorate adds whether each engine runs to a report's status (nodesync.Config.Decorate).
func (r *engineRuns) decorate(st *v1alpha1.TransferNodeStatus) {
	for i := range st.Engines {
		e := &st.Engines[i]
		run := r.of(topology.Engine{Name: string(e.Name), Available: e.Available, Reason: e.Reason})
		e.Running, e.RunningReason, e.GPUMemory = &run.runs, nodestatus.ClipReason(run.why), run.gpuMemory
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
			run := r.of(e)
			engines[i] = topology.Engine{Name: e.Name, Available: run.runs, Reason: run.why}
		}
		rep.Engines = engines
		return rep, nil
	}
}
