// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"strings"
	"testing"

	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// The report and the DRA devices say which engines the agent runs, from the statuses GetInfo serves: before
// the engines are assembled, an agent that only reports, an engine detection allows but the agent lacks a
// runtime for, the same-node engine on host memory, and an engine detection found after the start.
func TestReportSaysWhichEnginesRun(t *testing.T) {
	atStart := topology.Report{Engines: []topology.Engine{
		{Name: "xgmi", Available: false, Reason: "no GPUs"},
		{Name: "fabric", Available: false, Reason: "no fabric domain"},
		{Name: "rdma", Available: true, Reason: "2 RoCEv2 ports"},
		{Name: "tcp", Available: true, Reason: "always"},
	}}
	status := func(rep topology.Report) v1alpha1.TransferNodeStatus {
		var st v1alpha1.TransferNodeStatus
		for _, e := range rep.Engines {
			st.Engines = append(st.Engines, v1alpha1.EngineAvailability{Name: v1alpha1.EngineName(e.Name), Available: e.Available, Reason: e.Reason})
		}
		return st
	}
	type want struct {
		runs bool
		why  string
	}
	check := func(t *testing.T, r *engineRuns, rep topology.Report, wants map[string]want) {
		t.Helper()
		st := status(rep)
		r.decorate(&st)
		for _, e := range st.Engines {
			w := wants[string(e.Name)]
			if e.Running == nil || *e.Running != w.runs || !strings.Contains(e.RunningReason, w.why) || (w.why == "" && e.RunningReason != "") {
				t.Errorf("%s: running %v %q, want %v %q", e.Name, e.Running, e.RunningReason, w.runs, w.why)
			}
		}
		// The DRA devices' engines are the same answers.
		over, err := r.overlay(func(context.Context) (topology.Report, error) { return rep, nil })(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range over.Engines {
			if w := wants[e.Name]; e.Available != w.runs {
				t.Errorf("DRA %s available %v, want %v", e.Name, e.Available, w.runs)
			}
		}
	}

	t.Run("report only", func(t *testing.T) {
		r := newEngineRuns(true)
		check(t, r, atStart, map[string]want{"xgmi": {false, "--report-only"}, "fabric": {false, "--report-only"},
			"rdma": {false, "--report-only"}, "tcp": {false, "--report-only"}})
	})
	t.Run("starting", func(t *testing.T) {
		check(t, newEngineRuns(false), atStart, map[string]want{"xgmi": {false, "starting"}, "fabric": {false, "starting"},
			"rdma": {false, "starting"}, "tcp": {false, "starting"}})
	})

	// What the transfer side assembles on a node without GPUs, libibverbs or certificates.
	ts := newTransferSide(TransferOptions{}, atStart, Deps{})
	ts.rdmaWhyNot = "libibverbs did not load"
	ts.markNotRunning(Config{}, false)
	r := newEngineRuns(false)
	report, dra := r.kick(), r.kick()
	r.assembled(ts.statuses, atStart.Engines, map[string]bool{"xgmi": false, "tcp": false, "fabric": false})
	for _, kicked := range []<-chan struct{}{report, dra} {
		select {
		case <-kicked:
		default:
			t.Fatal("assembling the engines did not ask for a report and a DRA publication")
		}
	}
	t.Run("assembled", func(t *testing.T) {
		check(t, r, atStart, map[string]want{"xgmi": {true, "host memory only"}, "fabric": {false, ""},
			"rdma": {false, "not running: libibverbs did not load"}, "tcp": {false, "--tls-dir"}})
	})

	t.Run("found after the start", func(t *testing.T) {
		now := topology.Report{Engines: append([]topology.Engine(nil), atStart.Engines...)}
		now.Engines[1] = topology.Engine{Name: "fabric", Available: true, Reason: "declared by VPodTopology a"}
		check(t, r, now, map[string]want{"xgmi": {true, "host memory only"}, "fabric": {false, "restart the agent"},
			"rdma": {false, "libibverbs"}, "tcp": {false, "--tls-dir"}})
	})

	t.Run("running as detected", func(t *testing.T) {
		withTCP := newTransferSide(TransferOptions{}, atStart, Deps{})
		withTCP.rdmaRunning = true
		withTCP.markNotRunning(Config{TLSDir: "/certs"}, false)
		r := newEngineRuns(false)
		r.assembled(withTCP.statuses, atStart.Engines, map[string]bool{"xgmi": false, "tcp": true, "fabric": false})
		st := status(atStart)
		r.decorate(&st)
		if x, tc := st.Engines[0], st.Engines[3]; x.GPUMemory == nil || *x.GPUMemory || tc.GPUMemory == nil || !*tc.GPUMemory || st.Engines[1].GPUMemory != nil {
			t.Errorf("GPU memory: xgmi %v tcp %v fabric %v, want false (host memory only), true (staged), unsaid (not running)",
				x.GPUMemory, tc.GPUMemory, st.Engines[1].GPUMemory)
		}
		check(t, r, atStart, map[string]want{"xgmi": {true, "host memory only"}, "fabric": {false, ""},
			"rdma": {true, ""}, "tcp": {true, "GPU memory not staged"}})

		gone := topology.Report{Engines: append([]topology.Engine(nil), atStart.Engines...)}
		gone.Engines[2] = topology.Engine{Name: "rdma", Available: false, Reason: "no RDMA ports"}
		check(t, r, gone, map[string]want{"xgmi": {true, "host memory only"}, "fabric": {false, ""},
			"rdma": {false, ""}, "tcp": {true, "GPU memory not staged"}})
	})

	// A pool that disables the same-node engine on a GPU node: it is not offered, whatever runs underneath.
	t.Run("disabled on a GPU node", func(t *testing.T) {
		gpuNode := topology.Report{GPUs: []topology.GPU{{Index: 0, Vendor: topology.VendorAMD}}, Engines: append([]topology.Engine(nil), atStart.Engines...)}
		gpuNode.Engines[0] = topology.Engine{Name: "xgmi", Available: false, Reason: "disabled by the pool's engines (hardware: available: 1 GPU)"}
		ts := newTransferSide(TransferOptions{}, gpuNode, Deps{})
		ts.markNotRunning(Config{}, false)
		r := newEngineRuns(false)
		r.assembled(ts.statuses, gpuNode.Engines, map[string]bool{"xgmi": true})
		check(t, r, gpuNode, map[string]want{"xgmi": {false, ""}, "fabric": {false, ""}, "rdma": {false, "not running"}, "tcp": {false, "--tls-dir"}})
	})
}
