// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package refusals

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Limits a caller can run into, the values of fabricxfer_agent_limit_refusals_total's limit label.
const (
	LimitRegions         = "regions"
	LimitRegisteredBytes = "registered_bytes"
	LimitInFlight        = "in_flight"
	LimitInFlightBytes   = "in_flight_bytes"
	LimitItems           = "items_per_transfer"
	LimitFastTokens      = "fast_tokens"
	LimitLayouts         = "layouts"
	LimitPoolMemory      = "pool_memory"
)

var limitNames = []string{LimitRegions, LimitRegisteredBytes, LimitInFlight, LimitInFlightBytes, LimitItems,
	LimitFastTokens, LimitLayouts, LimitPoolMemory}

// Edge counts what the pod-facing sockets refused or closed before serving it, by socket and reason.
type Edge struct{ vec *prometheus.CounterVec }

// NewEdge makes the edge_refusals_total counter.
func NewEdge() Edge {
	return Edge{prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "agent",
		Name: "edge_refusals_total",
		Help: "Connections and requests the pod-facing sockets refused or closed unserved, by socket and reason " +
			"(busy: a connection limit; deadline: idle past the connection's deadline; unidentified; malformed; tokens: " +
			"descriptors already waiting; unsealed: shared memory not sealed against shrinking; revoked)."},
		[]string{"socket", "reason"})}
}

// Refused charges one refusal; refusals are rare, so the label lookup is fine here. A zero Edge (an fd socket
// built by a test) counts nothing.
func (c Edge) Refused(socket, reason string) {
	if c.vec != nil {
		c.vec.WithLabelValues(socket, reason).Inc()
	}
}

// Value reads the count of one socket and reason (-1 when it cannot be read), for tests and diagnostics.
func (c Edge) Value(socket, reason string) float64 {
	var m dto.Metric
	if err := c.vec.WithLabelValues(socket, reason).Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// Counters are the edge and limit refusal counters of one agent server.
type Counters struct {
	Edge   Edge
	limits *prometheus.CounterVec
	limit  map[string]prometheus.Counter // pre-resolved, read-only after New
}

// New makes the counters, every limit's series present from the start.
func New() *Counters {
	c := &Counters{Edge: NewEdge(),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "fabricxfer", Subsystem: "agent",
			Name: "limit_refusals_total",
			Help: "Requests refused because the caller was at one of its limits, by limit."}, []string{"limit"}),
		limit: map[string]prometheus.Counter{},
	}
	for _, l := range limitNames {
		c.limit[l] = c.limits.WithLabelValues(l)
	}
	return c
}

// LimitHit charges one refusal at limit (one of the Limit constants).
func (c *Counters) LimitHit(limit string) { c.limit[limit].Inc() }

// Describe implements prometheus.Collector.
func (c *Counters) Describe(ch chan<- *prometheus.Desc) {
	c.Edge.vec.Describe(ch)
	c.limits.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Counters) Collect(ch chan<- prometheus.Metric) {
	c.Edge.vec.Collect(ch)
	c.limits.Collect(ch)
}
