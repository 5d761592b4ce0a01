// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Charging a finished plan costs no allocation once its label set was used, and every series carries one of
// the bounded label values.
func TestMetricsPlanAllocatesNothingAndLabelsAreBounded(t *testing.T) {
	m := NewMetrics()
	p := &Plan{Engine: EngineTCP, Direction: DirWrite, Bytes: 4096}
	o := Outcome{Elapsed: 30 * time.Microsecond}
	m.plan(p, o)
	if n := testing.AllocsPerRun(1000, func() { m.plan(p, o) }); n != 0 {
		t.Errorf("charging a plan allocates %v times", n)
	}
	// Every engine, direction and status, plus an engine with no slot and an unknown direction.
	for _, e := range append(metricEngines[:], "future") {
		for d := Direction(0); d <= DirRead+1; d++ {
			m.plan(&Plan{Engine: e, Direction: d, Bytes: 1}, Outcome{})
			m.plan(&Plan{Engine: e, Direction: d, Bytes: 1}, Outcome{Err: errors.New("x")})
			m.rejected(d, 1)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]map[string]bool{
		"engine":    {"xgmi": true, "fabric": true, "rdma": true, "tcp": true, "none": true, "future": true},
		"direction": {"local": true, "write": true, "read": true, "unknown": true},
		"status":    {"ok": true, "failed": true, "rejected": true},
	}
	for _, mf := range mfs {
		if len(mf.GetMetric()) > 6*4*3 {
			t.Errorf("%s has %d series", mf.GetName(), len(mf.GetMetric()))
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if !allowed[l.GetName()][l.GetValue()] {
					t.Errorf("%s: label %s=%q outside its set", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
		if mf.GetName() == "fabricxfer_transfer_duration_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			if len(h.GetBucket()) != len(DurationBuckets) || h.GetSchema() == 0 && h.GetZeroThreshold() == 0 {
				t.Errorf("duration histogram: %d classic buckets, schema %d: want both classic and native", len(h.GetBucket()), h.GetSchema())
			}
		}
	}
	var got dto.Metric
	if err := m.duration.WithLabelValues("tcp", "write", "ok").(prometheus.Histogram).Write(&got); err != nil {
		t.Fatal(err)
	}
	if c := got.GetHistogram().GetSampleCount(); c != 1003 { // AllocsPerRun runs once more to warm up
		t.Errorf("tcp/write/ok observed %d times, want 1003", c)
	}
}

// BenchmarkMetricsPlan is what charging one finished plan costs on the transfer path.
func BenchmarkMetricsPlan(b *testing.B) {
	m := NewMetrics()
	p := &Plan{Engine: EngineTCP, Direction: DirWrite, Bytes: 4096}
	o := Outcome{Elapsed: 30 * time.Microsecond}
	b.ReportAllocs()
	for b.Loop() {
		m.plan(p, o)
	}
}
