// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
)

// serverMetrics are the server's collectors. Counters are charged where things happen; gauges are read from
// the server's state at scrape time, so the transfer path pays nothing for them. No label names a pod, a
// region or a peer: cardinality is fixed by the label sets below.
type serverMetrics struct {
	*refusals.Counters

	regions, regionBytes, lent, capacity, inFlight, inFlightBytes, callers, sessions, imports, notifyQueued, usageRatio *prometheus.Desc
}

func newServerMetrics() *serverMetrics {
	m := &serverMetrics{Counters: refusals.New()}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("fabricxfer_agent_"+name, help, labels, nil)
	}
	m.regions = d("regions", "Memory regions the agent holds for callers, by origin (registered by a pod, or lent from the pool).", "origin")
	m.regionBytes = d("region_bytes", "Bytes of the regions the agent holds for callers, by origin.", "origin")
	m.lent = d("pool_lent_bytes", "Bytes of the pool's memory lent to callers.")
	m.capacity = d("pool_capacity_bytes", "Bytes of memory the pool allocated at start (0 without pool memory).")
	m.inFlight = d("transfers_in_flight", "Transfers submitted and not yet settled.")
	m.inFlightBytes = d("transfer_bytes_in_flight", "Bytes of the transfers in flight.")
	m.callers = d("callers", "Callers (pods) holding regions or transfers.")
	m.sessions = d("sessions", "Open caller connections to the sidecar socket.")
	m.imports = d("imported_regions", "Memory of other nodes (and of pods' GPU handles) imported into the engines and kept for reuse.")
	m.notifyQueued = d("notification_bytes_queued", "Bytes of notifications the agent holds for listeners that have not read them yet (at most 32 MiB a caller).")
	m.usageRatio = d("caller_usage_ratio_max", "The highest fraction of a limit any one caller uses, by limit (1: a caller is at its limit).", "limit")
	return m
}

// Collector returns the server's collectors (the edge and limit counters, and gauges of what it holds), for
// the agent to register with the registry it serves.
func (s *Server) Collector() prometheus.Collector { return serverCollector{s} }

type serverCollector struct{ s *Server }

func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	m := c.s.metrics
	m.Counters.Describe(ch)
	for _, d := range []*prometheus.Desc{m.regions, m.regionBytes, m.lent, m.capacity, m.inFlight, m.inFlightBytes,
		m.callers, m.sessions, m.imports, m.notifyQueued, m.usageRatio} {
		ch <- d
	}
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	s, m := c.s, c.s.metrics
	m.Counters.Collect(ch)

	var regs, lentRegs, regBytes, lentBytes uint64
	var inFlight, inFlightBytes uint64
	ratio := map[string]float64{refusals.LimitRegions: 0, refusals.LimitRegisteredBytes: 0, refusals.LimitInFlight: 0, refusals.LimitInFlightBytes: 0}
	lim := s.opts.Limits
	frac := func(limit string, v, max float64) {
		if max > 0 && v/max > ratio[limit] {
			ratio[limit] = v / max
		}
	}
	// Under the lock for as long as it takes to walk the callers and the pool slices they hold (never every
	// region: a node can hold hundreds of thousands, and transfers wait on this lock).
	s.table.Lock()
	for _, sess := range s.sessions {
		for _, a := range sess.allocs {
			lentRegs++
			lentBytes += a.Region().Length()
		}
	}
	callers := 0
	s.table.EachUsageLocked(func(u *regiontable.Usage) {
		regs += uint64(u.Regions)
		regBytes += u.Bytes
		if u.Regions == 0 && u.InFlight == 0 {
			return
		}
		callers++
		inFlight += uint64(u.InFlight)
		inFlightBytes += u.InFlightBytes
		frac(refusals.LimitRegions, float64(u.Regions), float64(lim.MaxRegions))
		frac(refusals.LimitRegisteredBytes, float64(u.Bytes), float64(lim.MaxRegisteredBytes))
		frac(refusals.LimitInFlight, float64(u.InFlight), float64(lim.MaxInFlight))
		frac(refusals.LimitInFlightBytes, float64(u.InFlightBytes), float64(lim.MaxInFlightBytes))
	})
	sessions, imports, notifyQueued := len(s.sessions), s.xfer.ImportedLocked(), s.xfer.QueuedNotificationBytesLocked()
	s.table.Unlock()
	// The callers' counts include their pool slices.
	regs, regBytes = regs-min(regs, lentRegs), regBytes-min(regBytes, lentBytes)

	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	g(m.regions, float64(regs), "registered")
	g(m.regions, float64(lentRegs), "pool")
	g(m.regionBytes, float64(regBytes), "registered")
	g(m.regionBytes, float64(lentBytes), "pool")
	var total, free uint64
	if s.opts.Pool != nil {
		total, free = s.opts.Pool.Usage()
	}
	g(m.capacity, float64(total))
	g(m.lent, float64(total-free))
	g(m.inFlight, float64(inFlight))
	g(m.inFlightBytes, float64(inFlightBytes))
	g(m.callers, float64(callers))
	g(m.sessions, float64(sessions))
	g(m.imports, float64(imports))
	g(m.notifyQueued, float64(notifyQueued))
	for _, l := range []string{refusals.LimitRegions, refusals.LimitRegisteredBytes, refusals.LimitInFlight, refusals.LimitInFlightBytes} {
		g(m.usageRatio, ratio[l], l)
	}
}
