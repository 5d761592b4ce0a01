// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the transfer layer's Prometheus collectors, charged by the composite (engines add none):
//
//	fabricxfer_transfer_ops_total{engine,direction,status}      plans finished, or items rejected at planning
//	fabricxfer_transfer_bytes_total{engine,direction,status}    their bytes
//	fabricxfer_transfer_seconds_total{engine,direction,status}  submission-to-end time of finished plans
//
// status is ok, failed or rejected; rejected items carry engine="none". The caller registers Metrics (it is a
// prometheus.Collector) with the registry it serves.
type Metrics struct {
	ops, bytes, seconds *prometheus.CounterVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns unregistered collectors.
func NewMetrics() *Metrics {
	labels := []string{"engine", "direction", "status"}
	return &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "ops_total", Help: "Transfer plans finished, and items rejected at planning."}, labels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "bytes_total", Help: "Bytes of finished plans and rejected items."}, labels),
		seconds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "seconds_total", Help: "Seconds from submission to the end of each finished plan."}, labels),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.bytes.Describe(ch)
	m.seconds.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.bytes.Collect(ch)
	m.seconds.Collect(ch)
}

func (m *Metrics) plan(p *Plan, o Outcome) {
	status := "ok"
	if o.Err != nil {
		status = "failed"
	}
	dir := p.Direction.String()
	m.ops.WithLabelValues(p.Engine, dir, status).Inc()
	m.bytes.WithLabelValues(p.Engine, dir, status).Add(float64(p.Bytes))
	m.seconds.WithLabelValues(p.Engine, dir, status).Add(o.Elapsed.Seconds())
}

func (m *Metrics) rejected(dir string, size uint64) {
	m.ops.WithLabelValues("none", dir, "rejected").Inc()
	m.bytes.WithLabelValues("none", dir, "rejected").Add(float64(size))
}
