// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package engines

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the transfer layer's Prometheus collectors, charged by the composite (engines add none):
//
//	fabricxfer_transfer_ops_total{engine,direction,status}         plans finished, or items rejected at planning
//	fabricxfer_transfer_bytes_total{engine,direction,status}       their bytes
//	fabricxfer_transfer_seconds_total{engine,direction,status}     submission-to-end time of finished plans
//	fabricxfer_transfer_duration_seconds{engine,direction,status}  the same time as a histogram (native, with
//	                                                               classic buckets for servers without them)
//
// status is ok, failed or rejected; rejected items carry engine="none". engine is one of the four engines (or
// none), direction local, write or read: at most 5×3×3 series per name. The children of every known label set
// are resolved once, at first use, so charging a plan is a few atomic adds and one histogram observation.
// The caller registers Metrics (it is a prometheus.Collector) with the registry it serves.
type Metrics struct {
	ops, bytes, seconds *prometheus.CounterVec
	duration            *prometheus.HistogramVec
	// known[engine][direction][status] are the children of the known label sets, resolved at first use (so a
	// scrape shows only series that were charged) and read with one atomic load after that.
	known [len(metricEngines)][numDirections][numStatuses]atomic.Pointer[metricChild]
}

// metricChild is one label set's collectors.
type metricChild struct {
	ops, bytes, seconds prometheus.Counter
	duration            prometheus.Observer
}

var metricEngines = [...]string{EngineXGMI, EngineFabric, EngineRDMA, EngineTCP, "none"}

const (
	numDirections = 4 // unknown, local, write, read
	numStatuses   = 3
	statusOK      = 0
	statusFailed  = 1
	statusReject  = 2
)

var metricStatuses = [numStatuses]string{"ok", "failed", "rejected"}

// DurationBuckets are the classic buckets of fabricxfer_transfer_duration_seconds: 10 µs (a small transfer
// on one node) to about 40 s (a transfer near its deadline), four per decade.
var DurationBuckets = prometheus.ExponentialBucketsRange(10e-6, 40, 27)

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns unregistered collectors.
func NewMetrics() *Metrics {
	labels := []string{"engine", "direction", "status"}
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "ops_total", Help: "Transfer plans finished, and items rejected at planning."}, labels),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "bytes_total", Help: "Bytes of finished plans and rejected items."}, labels),
		seconds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "seconds_total", Help: "Seconds from submission to the end of each finished plan."}, labels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "fabricxfer", Subsystem: "transfer",
			Name: "duration_seconds", Help: "Seconds from submission to the end of each finished plan.",
			Buckets: DurationBuckets, NativeHistogramBucketFactor: 1.1,
			NativeHistogramMaxBucketNumber: 160, NativeHistogramMinResetDuration: time.Hour}, labels),
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.ops.Describe(ch)
	m.bytes.Describe(ch)
	m.seconds.Describe(ch)
	m.duration.Describe(ch)
}

// Collect implements prometheus.Collector. Series never charged are left out, so a scrape shows the engines
// and directions that ran.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.ops.Collect(ch)
	m.bytes.Collect(ch)
	m.seconds.Collect(ch)
	m.duration.Collect(ch)
}

func engineIndex(name string) int {
	switch name {
	case EngineXGMI:
		return 0
	case EngineFabric:
		return 1
	case EngineRDMA:
		return 2
	case EngineTCP:
		return 3
	case "none":
		return 4
	}
	return -1
}

// child returns the collectors of one label set; an engine or direction outside the known sets (an engine
// added without a metric slot) is looked up by its labels.
func (m *Metrics) child(engine string, d Direction, status int) *metricChild {
	e := engineIndex(engine)
	if e < 0 || d < DirLocal || d > DirRead {
		return m.resolve(engine, d, status)
	}
	slot := &m.known[e][d][status]
	if c := slot.Load(); c != nil {
		return c
	}
	c := m.resolve(engine, d, status)
	slot.Store(c) // a racing first use resolves the same children
	return c
}

func (m *Metrics) resolve(engine string, d Direction, status int) *metricChild {
	lv := []string{engine, d.String(), metricStatuses[status]}
	c := &metricChild{ops: m.ops.WithLabelValues(lv...), bytes: m.bytes.WithLabelValues(lv...)}
	if status != statusReject { // rejected items took no time
		c.seconds, c.duration = m.seconds.WithLabelValues(lv...), m.duration.WithLabelValues(lv...)
	}
	return c
}

func (m *Metrics) plan(p *Plan, o Outcome) {
	status := statusOK
	if o.Err != nil {
		status = statusFailed
	}
	c := m.child(p.Engine, p.Direction, status)
	c.ops.Inc()
	c.bytes.Add(float64(p.Bytes))
	s := o.Elapsed.Seconds()
	c.seconds.Add(s)
	c.duration.Observe(s)
}

func (m *Metrics) rejected(dir Direction, size uint64) {
	c := m.child("none", dir, statusReject)
	c.ops.Inc()
	c.bytes.Add(float64(size))
}
