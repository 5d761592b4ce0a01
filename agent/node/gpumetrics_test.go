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
	dto "github.com/prometheus/client_model/go"

	"github.com/fabricxfer/fabricxfer/topology"
)

// gathered is every sample of reg by metric name and its one label's value ("" without labels).
func gathered(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		out[mf.GetName()] = map[string]float64{}
		for _, m := range mf.GetMetric() {
			label := ""
			if len(m.GetLabel()) > 0 {
				label = m.GetLabel()[0].GetValue()
			}
			out[mf.GetName()][label] = value(m)
		}
	}
	return out
}

func value(m *dto.Metric) float64 {
	if m.GetGauge() != nil {
		return m.GetGauge().GetValue()
	}
	return m.GetCounter().GetValue()
}

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
	got := gathered(t, reg)
	want := map[string]map[string]float64{
		"fabricxfer_agent_gpu_copiers":             {"kernel": 2, "driver-batch": 1, "driver-per-item": 0, "runtime-per-item": 0},
		"fabricxfer_agent_gpu_copiers_feature_off": {"kernels": 1, "done_word": 1, "copy_replay": 1},
		"fabricxfer_agent_gpu_copy_replays_total":  {"": 8},
		"fabricxfer_agent_gpu_copy_captures_total": {"": 3},
	}
	for name, series := range want {
		if len(got[name]) != len(series) {
			t.Errorf("%s: %v, want %v", name, got[name], series)
			continue
		}
		for label, v := range series {
			if got[name][label] != v {
				t.Errorf("%s{%q} = %v, want %v", name, label, got[name][label], v)
			}
		}
	}
	// The copiers as the agent first reads them: none set up yet, every series at 0.
	copiers = nil
	for name, series := range gathered(t, reg) {
		for label, v := range series {
			if v != 0 {
				t.Errorf("without copiers %s{%q} = %v, want 0", name, label, v)
			}
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
