// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/connectivity"
)

var peersDesc = prometheus.NewDesc("fabricxfer_agent_peers",
	"Connections to other agents of the pool, by connection state (idle, connecting, ready, transient_failure, shutdown).",
	[]string{"state"}, nil)

var peerStates = []connectivity.State{connectivity.Idle, connectivity.Connecting, connectivity.Ready,
	connectivity.TransientFailure, connectivity.Shutdown}

// Collector returns a collector of fabricxfer_agent_peers, read from the channel's connections at scrape time.
func (p *Peers) Collector() prometheus.Collector { return peersCollector{p} }

type peersCollector struct{ p *Peers }

func (c peersCollector) Describe(ch chan<- *prometheus.Desc) { ch <- peersDesc }

func (c peersCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[connectivity.State]int{}
	c.p.mu.Lock()
	for _, pc := range c.p.conns {
		counts[pc.conn.GetState()]++
	}
	c.p.mu.Unlock()
	for _, s := range peerStates {
		ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(counts[s]), strings.ToLower(s.String()))
	}
}
