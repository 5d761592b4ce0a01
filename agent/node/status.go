// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import "fmt"

// markNotRunning keeps GetInfo and explain honest: an engine detection found possible but this agent does not
// run is reported unavailable, with both facts; the same-node and tcp engines say what they do with GPU memory.
func (t *transferSide) markNotRunning(cfg Config, fabricRunning bool) {
	running := map[string]bool{"xgmi": true, "tcp": !cfg.DisableTCP && cfg.TLSDir != "", "rdma": t.rdmaRunning, "fabric": fabricRunning}
	why := map[string]string{
		"fabric": "no GPU runtime for these GPUs in this agent (CUDA driver not loaded, or AMD GPUs: the fabric engine has no HIP runtime yet)",
		"rdma":   t.rdmaWhyNot,
		"tcp":    "needs the pool's agent certificates (--tls-dir) and tcp allowed by the pool",
	}
	for i, e := range t.statuses {
		if e.Name == "xgmi" && !e.Available && len(t.gpus) == 0 {
			// The same-node engine runs on every node: without GPUs it copies host memory, which a caller
			// checking availability before registering host regions must not be told it cannot do. (A pool
			// that disables it on a GPU node keeps it unavailable, as the pool asked.)
			t.statuses[i].Available = true
			t.statuses[i].Reason = "host memory only (" + e.Reason + ")"
			continue
		}
		if e.Name == "tcp" && e.Available && running["tcp"] {
			t.statuses[i].Reason = e.Reason + "; " + t.tcpStaging(cfg)
			if t.tcpWire != "" {
				t.statuses[i].Reason += "; " + t.tcpWire
			}
		}
		if e.Name == "xgmi" && e.Available && t.gpuCopyWhyNot != "" {
			// Host copies still run, so the engine stays available; GPU pairs are refused, and this says why.
			t.statuses[i].Reason = fmt.Sprintf("hardware: %s; host backend only: %s", e.Reason, t.gpuCopyWhyNot)
		}
		if e.Name == "xgmi" && e.Available && t.gpuSharing != "" {
			t.statuses[i].Reason += "; " + t.gpuSharing
		}
		if e.Available && !running[e.Name] {
			t.statuses[i].Available = false
			t.statuses[i].Reason = fmt.Sprintf("hardware: %s; not running: %s", e.Reason, why[e.Name])
		}
	}
}

// tcpStaging says what the tcp engine does with this node's GPU memory, as the engine itself reports it.
func (t *transferSide) tcpStaging(cfg Config) string {
	if t.tcpStager == nil {
		why := t.tcpNoStageReason
		if why == "" {
			why = "no GPU copy backend in this agent"
		}
		return "GPU memory not staged: " + why
	}
	mib := cfg.TCPStagingBytes >> 20
	if mib == 0 {
		mib = 64
	}
	return fmt.Sprintf("GPU memory staged through pinned host memory (up to %d MiB per peer and side)", mib)
}
