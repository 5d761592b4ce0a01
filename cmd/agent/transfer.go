// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodecert"
	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/rdmanics"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/node"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hip"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hipcopy"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/topology"
)

// transferFlags configure the agent's transfer side: the socket server, the engines and the agent-to-agent
// channel (node.Config), plus the health endpoint and the kernel cache.
type transferFlags struct {
	stack       node.Config
	healthAddr  string
	kernelCache string
	noTransfer  bool
	// callerRoot is where callers' /proc is read from; it differs from --host-root only when detection reads a
	// fixture tree while callers are real local processes (demo, tests).
	callerRoot string
	// libibverbs is the verbs library the rdma engine loads ("": libibverbs.so.1 from the loader's path).
	libibverbs string
	// libamdhip64 is the HIP runtime the AMD GPU backend loads ("": the usual sonames from the loader's path).
	libamdhip64 string
	// sysRoot is where the verbs binding reads port GID types (the detection host root's /sys).
	sysRoot string
	// fabricDomainOf is each GPU's fabric domain as the latest detection has it (declarations change).
	fabricDomainOf func(gpu int) (string, bool)
}

func (t *transferFlags) register(fs *flag.FlagSet) {
	t.stack.RegisterFlags(fs)
	fs.StringVar(&t.healthAddr, "health-addr", ":7472", "address of /healthz and /readyz (empty: none)")
	fs.StringVar(&t.kernelCache, "kernel-cache", "", "directory caching compiled copy kernels between restarts (empty: no cache)")
	fs.BoolVar(&t.noTransfer, "report-only", false, "only detect and report; serve no socket and move no bytes")
	fs.StringVar(&t.callerRoot, "caller-host-root", "", "root whose /proc identifies socket callers (default: --host-root)")
	fs.StringVar(&t.libibverbs, "libibverbs", "", "verbs library the rdma engine loads (default libibverbs.so.1 from the loader's search path)")
	fs.StringVar(&t.libamdhip64, "libamdhip64", "", "HIP runtime the AMD GPU copy backend loads (default libamdhip64.so from the loader's search path)")
}

// transferSide runs the socket server and the engines next to the reporter.
type transferSide struct {
	cfg    transferFlags
	log    logr.Logger
	report topology.Report
	deps   node.Deps
	ready  atomic.Bool
	// cudaDriver is the loaded CUDA driver (nil when none loaded): the rdma engine exports GPU memory through it.
	cudaDriver *cuda.Driver
	// fabric is the fabric engine when it runs: the rdma engine yields its pairs.
	fabric engines.Engine
	// rdmaRunning says the rdma engine is built with the peer channel; rdmaWhyNot says why not.
	rdmaRunning bool
	rdmaWhyNot  string
	// gpuCopyWhyNot says why the same-node engine runs without the AMD GPU backend on a node with AMD GPUs.
	gpuCopyWhyNot string
	// notifier carries the fabric engine's notifications once the agent-to-agent channel exists.
	notifier lateNotifier
	// registry is what /metrics serves.
	registry *prometheus.Registry
}

// lateNotifier sends notifications through the agent-to-agent channel, which is created after the engines that
// need it (the stack builds it once the pool's certificates are loaded).
type lateNotifier struct {
	mu sync.Mutex
	ch engines.NotifySender
}

func (l *lateNotifier) set(ch engines.NotifySender) {
	l.mu.Lock()
	l.ch = ch
	l.mu.Unlock()
}

// SendNotification implements engines.NotifySender.
func (l *lateNotifier) SendNotification(ctx context.Context, node string, n engines.Notification) error {
	l.mu.Lock()
	ch := l.ch
	l.mu.Unlock()
	if ch == nil {
		return fmt.Errorf("no agent-to-agent channel to notify node %s (the pool's certificates are not mounted: --tls-dir)", node)
	}
	return ch.SendNotification(ctx, node, n)
}

// newTransferSide prepares the transfer side from the first detection: which engines this node offers, its GPUs,
// and the GPU runtime when one loads.
func newTransferSide(cfg transferFlags, rep topology.Report, deps node.Deps, log logr.Logger) *transferSide {
	t := &transferSide{cfg: cfg, log: log, report: rep, deps: deps}
	t.deps.FabricDomainOf = cfg.fabricDomainOf
	for _, e := range rep.Engines {
		t.deps.Engines = append(t.deps.Engines, server.EngineStatus{Name: e.Name, Available: e.Available, Reason: e.Reason})
	}
	for _, g := range rep.GPUs {
		info := server.GPUInfo{Index: g.Index, UUID: g.UUID, Vendor: engines.Vendor(g.Vendor), BusID: g.PCIBusID}
		if g.Fabric != nil {
			info.FabricDomain = g.Fabric.Domain
		}
		t.deps.GPUs = append(t.deps.GPUs, info)
	}
	t.deps.Ready = func(peer string) {
		t.ready.Store(true)
		log.Info("transfer side ready", "socketDir", cfg.stack.SocketDir, "peerEndpoint", peer)
	}
	return t
}

// gpuEngines builds the GPU backends of the same-node engine for the node's GPUs: HIP for AMD GPUs, CUDA (and
// the fabric engine) for NVIDIA GPUs. A node whose GPU runtime does not load keeps the host engines and says why.
func (t *transferSide) gpuEngines() (backends []xgmi.Backend, extra []engines.Engine, closers []func() error) {
	if slices.ContainsFunc(t.report.GPUs, func(g topology.GPU) bool { return g.Vendor == topology.VendorAMD }) {
		if be := t.hipBackend(); be != nil {
			backends = append(backends, be)
			closers = append(closers, be.Close)
		}
	}
	cb, extra, cc := t.cudaEngines()
	return append(backends, cb...), extra, append(closers, cc...)
}

// hipBackend loads the HIP runtime and hipRTC and builds the AMD GPU backend, or logs and records why not. The
// kernels are compiled for each GPU's gfx target as KFD reports it (the topology's model).
func (t *transferSide) hipBackend() *hipcopy.Backend {
	var paths []string
	if t.cfg.libamdhip64 != "" {
		paths = []string{t.cfg.libamdhip64}
	}
	rt, err := hip.Load(paths...)
	if err != nil {
		t.gpuCopyWhyNot = err.Error()
		t.log.Info("AMD GPU copy backend unavailable: same-node copies use the host backend only", "reason", err.Error())
		return nil
	}
	rtc, err := hip.LoadRTC()
	if err != nil {
		t.log.Info("hipRTC unavailable: AMD GPU copies use one hipMemcpyAsync per item", "reason", err.Error())
		rtc = nil
	}
	archs := map[string]string{}
	for _, g := range t.report.GPUs {
		if g.Vendor == topology.VendorAMD && g.Model != "" && g.PCIBusID != "" {
			archs[strings.ToLower(g.PCIBusID)] = g.Model
		}
	}
	be, err := hipcopy.NewBackend(rt, hipcopy.Options{RTC: rtc, CacheDir: t.cfg.kernelCache, Archs: archs})
	if err != nil {
		t.gpuCopyWhyNot = "HIP copy backend: " + err.Error()
		t.log.Info("AMD GPU copy backend unavailable: same-node copies use the host backend only", "reason", t.gpuCopyWhyNot)
		return nil
	}
	t.log.Info("AMD GPU copy backend running", "hip", rt.Path(), "hipRTC", rtc != nil)
	return be
}

// cudaEngines loads the CUDA driver when the node has NVIDIA GPUs and builds the GPU backend of the same-node
// engine and the fabric engine. A node without the driver keeps the host engines and says why.
func (t *transferSide) cudaEngines() (backends []xgmi.Backend, extra []engines.Engine, closers []func() error) {
	if !slices.ContainsFunc(t.report.GPUs, func(g topology.GPU) bool { return g.Vendor == "nvidia" }) {
		t.deps.TCPNoStageReason = "no GPU on this node"
		if len(t.report.GPUs) > 0 {
			t.deps.TCPNoStageReason = "AMD GPU memory has no HIP staging"
		}
		return nil, nil, nil
	}
	drv, err := cuda.Load()
	if err != nil {
		t.log.Info("GPU engines unavailable: CUDA driver did not load", "reason", err.Error())
		t.deps.TCPNoStageReason = "the CUDA driver did not load: " + err.Error()
		return nil, nil, nil
	}
	t.deps.GPUDriver = drv
	t.cudaDriver = drv
	nvrtc, err := cuda.LoadNVRTC()
	if err != nil {
		t.log.Info("NVRTC unavailable: copies use driver batch copies", "reason", err.Error())
		nvrtc = nil
	}
	opts := cudacopy.Options{NVRTC: nvrtc, CacheDir: t.cfg.kernelCache}
	be, err := cudacopy.NewBackend(drv, opts)
	if err != nil {
		t.log.Info("GPU copy backend unavailable", "reason", err.Error())
		t.deps.TCPNoStageReason = "the CUDA copy backend did not start: " + err.Error()
		return nil, nil, nil
	}
	// The tcp engine stages GPU memory through the same backend: the same-node engine maps every region
	// first, and the stager holds the mapping while the tcp engine uses it.
	t.deps.TCPStager = be.Stager()
	backends = append(backends, be)
	closers = append(closers, be.Close)
	if t.engineAllowed("fabric") {
		rt := fabric.NewCUDARuntime(drv, opts)
		fe, err := fabric.New(fabric.Options{Node: t.cfg.stack.NodeName, Runtime: rt, Notifier: &t.notifier})
		if err != nil {
			t.log.Info("fabric engine unavailable", "reason", err.Error())
			_ = rt.Close()
		} else {
			extra = append(extra, fe)
			closers = append(closers, rt.Close)
			t.fabric = fe
		}
	}
	return backends, extra, closers
}

// engineAllowed reports whether detection (with the pool's engine list applied) left the engine available.
func (t *transferSide) engineAllowed(name string) bool {
	e, ok := t.report.Engine(name)
	return ok && e.Available
}

// Run serves the socket and the engines until ctx ends, and the health endpoint beside them.
func (t *transferSide) Run(ctx context.Context) error {
	if !t.engineAllowed("tcp") {
		t.cfg.stack.DisableTCP = true
	}
	backends, extra, closers := t.gpuEngines()
	defer func() {
		for _, c := range closers {
			_ = c()
		}
	}()
	t.deps.XGMIBackends = append(t.deps.XGMIBackends, backends...)
	t.deps.ExtraEngines = append(t.deps.ExtraEngines, extra...)
	t.prepareRDMA()
	t.markNotRunning(extra)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	healthErr := make(chan error, 1)
	go func() { healthErr <- t.serveHealth(ctx) }()
	err := node.Run(ctx, t.cfg.stack, t.deps)
	cancel()
	return errors.Join(err, <-healthErr)
}

// prepareRDMA decides whether this agent runs the rdma engine: detection must have found a usable RDMA port
// (and the pool allow rdma), the pool's certificates must be mounted (queue pairs are exchanged over the
// agent-to-agent channel, which needs them), and libibverbs must load and see a detected device. The engine
// itself is built once the channel exists (node.Deps.PeerEngines), with the channel as its Exchanger and
// Notifier and as the answerer of peers' exchanges; without it, peers that ask are told why.
func (t *transferSide) prepareRDMA() {
	lib, why := t.loadVerbs()
	if why != "" {
		t.rdmaWhyNot = why
		if t.engineAllowed(engines.EngineRDMA) {
			t.log.Info("rdma engine not running", "reason", why)
		}
		t.deps.PeerEngines = func(ch *peers.Peers) ([]engines.Engine, error) {
			t.notifier.set(ch)
			ch.SetQPAcceptor(nil, why)
			return nil, nil
		}
		return
	}
	t.rdmaRunning = true
	rep := t.report
	node := t.cfg.stack.NodeName
	t.deps.PeerEngines = func(ch *peers.Peers) ([]engines.Engine, error) {
		t.notifier.set(ch)
		opts := rdma.Options{Node: node, Provider: rdma.VerbsProvider(lib), NICs: rdmanics.FromReport(&rep), Exchanger: ch, Notifier: ch}
		if t.cudaDriver != nil {
			opts.DMABuf = rdma.CUDADMABuf{Driver: t.cudaDriver, PageSize: uint64(os.Getpagesize())}
		}
		if fe := t.fabric; fe != nil {
			// The fabric engine claims pairs whose remote side it can map; rdma leaves those to it.
			opts.Yield = func(src, dst *engines.MemoryDesc) bool { ok, _ := fe.CanHandle(src, dst); return ok }
		}
		e, err := rdma.New(opts)
		if err != nil {
			return nil, err
		}
		ch.SetQPAcceptor(e, "")
		t.log.Info("rdma engine running", "dmaBuf", opts.DMABuf != nil, "yieldsToFabric", opts.Yield != nil)
		return []engines.Engine{e}, nil
	}
}

// loadVerbs opens libibverbs when the rdma engine can run here, or says why it cannot.
func (t *transferSide) loadVerbs() (*verbs.Lib, string) {
	e, ok := t.report.Engine(engines.EngineRDMA)
	switch {
	case !ok:
		return nil, "detection reported no rdma engine"
	case !e.Available:
		return nil, e.Reason
	case t.cfg.stack.TLSDir == "":
		return nil, "needs the pool's agent certificates (--tls-dir): queue pairs are exchanged over the agent-to-agent channel"
	}
	lib, err := verbs.Open(t.cfg.libibverbs)
	if err != nil {
		return nil, "libibverbs did not load: " + err.Error()
	}
	if t.cfg.sysRoot != "" {
		lib.SysfsRoot = t.cfg.sysRoot
	}
	seen, err := lib.DeviceNames()
	if err != nil {
		return nil, "libibverbs lists no devices: " + err.Error()
	}
	var detected []string
	for _, n := range t.report.NICs {
		if n.Usable() && !slices.Contains(detected, n.Name) {
			detected = append(detected, n.Name)
		}
	}
	for _, d := range detected {
		if slices.Contains(seen, d) {
			return lib, ""
		}
	}
	return nil, fmt.Sprintf("libibverbs sees none of the detected RDMA devices (%s); it sees [%s]",
		strings.Join(detected, ", "), strings.Join(seen, ", "))
}

// serveHealth answers /healthz while the process runs and /readyz once the sockets are open.
func (t *transferSide) serveHealth(ctx context.Context) error {
	if t.cfg.healthAddr == "" {
		return nil
	}
	mux := http.NewServeMux()
	reg := t.registry
	// The fabric engine's import cache (0 where it does not run). gpuEngines ran before this goroutine started.
	mapped, _ := t.fabric.(interface{ MappedRegions() int })
	_ = reg.Register(fabricMappedGauge(mapped))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 5 * time.Second}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !t.ready.Load() {
			http.Error(w, "sockets not open yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	srv := &http.Server{Addr: t.cfg.healthAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving health on %s: %w", t.cfg.healthAddr, err)
	}
	return nil
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

// slogFrom routes the transfer side's slog output through the agent's logr logger.
func slogFrom(log logr.Logger) *slog.Logger { return slog.New(logr.ToSlogHandler(log)) }

// buildTransferSide detects once to learn the node's engines and GPUs, then prepares the socket server and
// engines for the pool this agent serves.
func buildTransferSide(cfg runConfig, c client.Client, detect func(context.Context) (topology.Report, error), log logr.Logger) (*transferSide, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := detect(ctx)
	if err != nil {
		return nil, fmt.Errorf("detecting the node before starting the transfer side: %w", err)
	}
	tf := cfg.transfer
	tf.stack.NodeName = cfg.detection.nodeName
	tf.stack.PoolNamespace = cfg.poolNamespace
	tf.stack.PoolName = cfg.poolName
	tf.stack.HostRoot = cfg.detection.hostRoot
	if tf.callerRoot != "" {
		tf.stack.HostRoot = tf.callerRoot
	}
	tf.stack.PeerAdvertise = cfg.endpoint
	tf.sysRoot = filepath.Join(cfg.detection.hostRoot, "sys")
	if err := tf.stack.Validate(); err != nil {
		return nil, err
	}
	// /metrics: the transfer layer's collectors and the server's (registered by the stack while it runs), with
	// the Go runtime's and the process's (goroutines, memory, open fds), so an admin, and the soak test, can
	// watch an agent for leaks.
	reg := prometheus.NewRegistry()
	deps := node.Deps{Kube: c, AgentVersion: version, Logger: slogFrom(log.WithName("transfer")), Metrics: engines.NewMetrics(),
		Registry: reg}
	if tf.stack.NodeCert && c != nil {
		deps.NodeCertificate = (&nodecert.Requester{Client: c, PoolNamespace: cfg.poolNamespace, PoolName: cfg.poolName,
			Node: tf.stack.NodeName}).Request
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), deps.Metrics)
	t := newTransferSide(tf, rep, deps, log.WithName("transfer"))
	t.registry = reg
	return t, nil
}

// markNotRunning keeps GetInfo and explain honest: an engine detection found possible but this agent does not
// run is reported unavailable, with both facts.
func (t *transferSide) markNotRunning(extra []engines.Engine) {
	running := map[string]bool{"xgmi": true, "tcp": !t.cfg.stack.DisableTCP && t.cfg.stack.TLSDir != "", "rdma": t.rdmaRunning}
	for _, e := range extra {
		running[e.Name()] = true
	}
	why := map[string]string{
		"fabric": "no GPU runtime for these GPUs in this agent (CUDA driver not loaded, or AMD GPUs: the fabric engine has no HIP runtime yet)",
		"rdma":   t.rdmaWhyNot,
		"tcp":    "needs the pool's agent certificates (--tls-dir) and tcp allowed by the pool",
	}
	for i, e := range t.deps.Engines {
		if e.Name == "tcp" && e.Available && running["tcp"] {
			t.deps.Engines[i].Reason = e.Reason + "; " + t.tcpStaging()
		}
		if e.Name == "xgmi" && e.Available && t.gpuCopyWhyNot != "" {
			// Host copies still run, so the engine stays available; GPU pairs are refused, and this says why.
			t.deps.Engines[i].Reason = fmt.Sprintf("hardware: %s; host backend only: %s", e.Reason, t.gpuCopyWhyNot)
		}
		if e.Available && !running[e.Name] {
			t.deps.Engines[i].Available = false
			t.deps.Engines[i].Reason = fmt.Sprintf("hardware: %s; not running: %s", e.Reason, why[e.Name])
		}
	}
}

// tcpStaging says what the tcp engine does with this node's GPU memory, as the engine itself reports it.
func (t *transferSide) tcpStaging() string {
	if t.deps.TCPStager == nil {
		why := t.deps.TCPNoStageReason
		if why == "" {
			why = "no GPU copy backend in this agent"
		}
		return "GPU memory not staged: " + why
	}
	mib := t.cfg.stack.TCPStagingBytes >> 20
	if mib == 0 {
		mib = 64
	}
	return fmt.Sprintf("GPU memory staged through pinned host memory (up to %d MiB per peer and side)", mib)
}
