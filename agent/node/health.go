// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveHealth answers /healthz while the process runs, /readyz once the sockets are open, and /metrics.
func (t *transferSide) serveHealth(ctx context.Context, ln net.Listener) error {
	if ln == nil {
		return nil
	}
	mux := http.NewServeMux()
	reg := t.registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	// The fabric engine's import cache (0 until, or where, it does not run).
	_ = reg.Register(fabricMappedGauge(fabricMapped{t}))
	// The GPU copiers (none until, or where, a GPU backend runs).
	_ = reg.Register(newGPUCopierCollector(func() []gpuCopier { return gpuCopiersOf(t.cudaCopiers.Load(), t.hipCopiers.Load()) }))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 5 * time.Second}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !t.ready.Load() {
			http.Error(w, "sockets not open yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: t.opts.HealthAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving health on %s: %w", t.opts.HealthAddr, err)
	}
	return nil
}

// fabricMapped reads the fabric engine's import cache once the engine runs.
type fabricMapped struct{ t *transferSide }

func (f fabricMapped) MappedRegions() int {
	if fe := f.t.fabric.Load(); fe != nil {
		return fe.MappedRegions()
	}
	return 0
}

// fabricMappedGauge is fabricxfer_agent_fabric_mapped_regions, read from the fabric engine (nil: 0).
func fabricMappedGauge(mapped interface{ MappedRegions() int }) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "fabricxfer", Subsystem: "agent",
		Name: "fabric_mapped_regions", Help: "Remote GPU regions the fabric engine has mapped through their fabric handles and keeps for reuse."},
		func() float64 {
			if mapped == nil {
				return 0
			}
			return float64(mapped.MappedRegions())
		})
}

// listenHealth opens the health endpoint's listener (nil without HealthAddr).
func (t *transferSide) listenHealth() (net.Listener, error) {
	if t.opts.HealthAddr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", t.opts.HealthAddr)
	if err != nil {
		return nil, fmt.Errorf("listening for health checks on %s (--health-addr): %w", t.opts.HealthAddr, err)
	}
	return ln, nil
}
