// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/internal/promtest"
	"github.com/fabricxfer/fabricxfer/topology"
)

// The copiers' gauges count copiers by mode and by feature off, every mode and feature exported (0 where none
// has it), and the replay counters sum the copiers'.
func TestGPUCopierMetricsCountModesFeaturesAndReplays(t *testing.T) {
	copiers := []gpuCopier{
		{mode: "kernel", replayed: 7, captured: 2},
		{mode: "kernel", off: []string{"copy_replay"}, replayed: 1, captured: 1},
		{mode: "driver-batch", off: []string{"kernels", "done_word"}},
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newGPUCopierCollector(func() []gpuCopier { return copiers }))
	got := promtest.Gather(t, reg)
	want := map[string]float64{
		`fabricxfer_agent_gpu_copiers{mode=kernel}`: 2, `fabricxfer_agent_gpu_copiers{mode=driver-batch}`: 1,
		`fabricxfer_agent_gpu_copiers{mode=driver-per-item}`: 0, `fabricxfer_agent_gpu_copiers{mode=runtime-per-item}`: 0,
		`fabricxfer_agent_gpu_copiers_feature_off{feature=kernels}`: 1, `fabricxfer_agent_gpu_copiers_feature_off{feature=done_word}`: 1,
		`fabricxfer_agent_gpu_copiers_feature_off{feature=copy_replay}`: 1,
		`fabricxfer_agent_gpu_copy_replays_total{}`:                     8, `fabricxfer_agent_gpu_copy_captures_total{}`: 3,
	}
	if len(got) != len(want) {
		t.Errorf("%d series, want %d: %v", len(got), len(want), got)
	}
	for series, v := range want {
		if g, ok := got[series]; !ok || g != v {
			t.Errorf("%s = %v (exported: %v), want %v", series, g, ok, v)
		}
	}
	// The copiers as the agent first reads them: none set up yet, every series at 0.
	copiers = nil
	for series, v := range promtest.Gather(t, reg) {
		if v != 0 {
			t.Errorf("without copiers %s = %v, want 0", series, v)
		}
	}
}

// An agent's /metrics serves the GPU copiers' series from the start, before (and where) no GPU backend runs.
func TestAgentServesGPUCopierMetricsWithoutAGPU(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts := newTransferSide(TransferOptions{Config: Config{NodeName: "node-a"}, HealthAddr: ln.Addr().String(), NoGPU: true},
		topology.Report{}, Deps{AgentVersion: "test", Registry: prometheus.NewRegistry()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ts.serveHealth(ctx, ln) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the health server did not stop")
		}
	}()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{`fabricxfer_agent_gpu_copiers{mode="kernel"} 0`, `fabricxfer_agent_gpu_copiers_feature_off{feature="copy_replay"} 0`,
		"fabricxfer_agent_gpu_copy_replays_total 0", "fabricxfer_agent_gpu_copy_captures_total 0"} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %q:\n%s", line, body)
		}
	}
}
