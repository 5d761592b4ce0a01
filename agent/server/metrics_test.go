// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// Every gauge and counter of the server is exported, moves with what the server holds, and carries only
// bounded labels (none names a pod, a region or a segment).
func TestServerMetricsMoveAndStayBounded(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	em := engines.NewMetrics()
	opts.Engine = hostCompositeWithMetrics(t, "node-a", em)
	opts.Limits = server.DefaultLimits
	opts.Limits.MaxRegions = 3
	opts.Pool = newHostPool(t, 4<<20)
	a := startAgent(t, opts)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.srv.Collector(), em)
	before := promtest.Gather(t, reg)
	for _, name := range []string{
		"fabricxfer_agent_regions{origin=registered}", "fabricxfer_agent_regions{origin=pool}",
		"fabricxfer_agent_region_bytes{origin=registered}", "fabricxfer_agent_region_bytes{origin=pool}",
		"fabricxfer_agent_pool_capacity_bytes{}", "fabricxfer_agent_pool_lent_bytes{}",
		"fabricxfer_agent_transfers_in_flight{}", "fabricxfer_agent_transfer_bytes_in_flight{}",
		"fabricxfer_agent_callers{}", "fabricxfer_agent_sessions{}", "fabricxfer_agent_imported_regions{}",
		"fabricxfer_agent_notification_bytes_queued{}",
		"fabricxfer_agent_caller_usage_ratio_max{limit=regions}", "fabricxfer_agent_limit_refusals_total{limit=regions}",
	} {
		if _, ok := before[name]; !ok {
			t.Errorf("%s missing from a fresh server's scrape", name)
		}
	}
	if before["fabricxfer_agent_pool_capacity_bytes{}"] != 4<<20 {
		t.Errorf("pool capacity %v, want 4 MiB", before["fabricxfer_agent_pool_capacity_bytes{}"])
	}

	c := dial(t, a)
	ctx := ctxT(t)
	src, dst := shm(t, 1<<20), shm(t, 1<<20)
	rs, err := c.RegisterHost(ctx, src.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, 1<<20, client.Segment("secret-segment-name"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocateFromPool(ctx, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, src.File, 0, 4096); err == nil {
		t.Fatal("a fourth region was accepted over MaxRegions=3")
	}
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096); err != nil {
		t.Fatal(err)
	}
	got := promtest.Gather(t, reg)
	for name, want := range map[string]float64{
		"fabricxfer_agent_regions{origin=registered}":                                 2,
		"fabricxfer_agent_region_bytes{origin=registered}":                            2 << 20,
		"fabricxfer_agent_regions{origin=pool}":                                       1,
		"fabricxfer_agent_pool_lent_bytes{}":                                          1 << 20,
		"fabricxfer_agent_callers{}":                                                  1,
		"fabricxfer_agent_sessions{}":                                                 1,
		"fabricxfer_agent_caller_usage_ratio_max{limit=regions}":                      1,
		"fabricxfer_agent_limit_refusals_total{limit=regions}":                        1,
		"fabricxfer_agent_transfers_in_flight{}":                                      0,
		"fabricxfer_transfer_ops_total{direction=local,engine=xgmi,status=ok}":        1,
		"fabricxfer_transfer_bytes_total{direction=local,engine=xgmi,status=ok}":      4096,
		"fabricxfer_transfer_duration_seconds{direction=local,engine=xgmi,status=ok}": 1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	allowed := map[string]bool{"origin": true, "limit": true, "socket": true, "reason": true, "engine": true,
		"direction": true, "status": true}
	for series := range got {
		if strings.Contains(series, "secret-segment-name") || strings.Contains(series, "local/") {
			t.Errorf("series %s names a segment or caller", series)
		}
		labels := series[strings.Index(series, "{")+1 : len(series)-1]
		for _, l := range strings.Split(labels, ",") {
			if l != "" && !allowed[l[:strings.Index(l, "=")]] {
				t.Errorf("series %s: label %s outside the bounded set", series, l)
			}
		}
	}
}
