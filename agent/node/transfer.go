// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodecert"
	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cuda"
	"github.com/fabricxfer/fabricxfer/engines/gpu/cudacopy"
	"github.com/fabricxfer/fabricxfer/engines/gpu/hipcopy"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/topology"
)

// Deps are what the caller already has when the transfer side starts.
type Deps struct {
	// Kube reads pods, the TransferPool and TransferNodes (nil outside Kubernetes: needs AllowLocal and
	// StaticPeers for peers).
	Kube         client.Reader
	AgentVersion string
	// FabricDomainOf, when set, is a GPU's fabric domain now (server.Options.FabricDomainOf).
	FabricDomainOf func(gpu int) (string, bool)
	// Metrics, when set, is charged by the composite with every plan and rejected item.
	Metrics *engines.Metrics
	// Registry, when set, gets the server's and the peer channel's collectors while they run.
	Registry prometheus.Registerer
	Logger   *slog.Logger
	// Ready, when set, is called once the sockets are open, with the advertised peer endpoint.
	Ready func(peerEndpoint string)
	// NodeCertificate obtains this node's certificate for a new key (with Config.NodeCert).
	NodeCertificate func(ctx context.Context) (tls.Certificate, error)
	// DataListener, when set, serves the tcp engine instead of a listener on Config.DataListen (a socket
	// handed over by the caller); Serve closes it.
	DataListener net.Listener
	// EnginesAssembled, when set, is told the engine statuses GetInfo serves (what runs) once the sockets
	// serve, with the detection the engines were assembled from and which of them move GPU memory.
	EnginesAssembled func(running []server.EngineStatus, detected []topology.Engine, gpuMemory map[string]bool)
	// Policy, when set, is the pool's allowedNamespaces as the caller already reads them (with Kube; shared with
	// the DRA driver, so one cache serves both).
	Policy identity.NamespacePolicy
	// RDMAProvider, when set, opens the RDMA devices instead of libibverbs (a fake RDMA network in tests); the
	// rdma engine still runs only where the report finds it available and the pool's certificates are mounted.
	RDMAProvider rdma.Provider
}

// Serve assembles the transfer side of a node from its detection report and serves until ctx ends: the GPU
// runtimes the report's GPUs need, the agent-to-agent channel with the tcp engine, the engines that work
// through the channel (fabric, rdma), the same-node engine, the composite over all of them, pool memory and
// the socket server.
func Serve(ctx context.Context, opts TransferOptions, rep topology.Report, deps Deps) error {
	return newTransferSide(opts, rep, deps).Run(ctx)
}

// transferSide runs the socket server and the engines, and the health endpoint beside them.
type transferSide struct {
	opts   TransferOptions
	report topology.Report
	deps   Deps
	log    *slog.Logger
	ready  atomic.Bool
	// registry is what /metrics serves.
	registry *prometheus.Registry

	// What Run found while assembling, for GetInfo's engine statuses, /metrics and the log.
	statuses []server.EngineStatus
	gpus     []server.GPUInfo
	// xgmiBackends are the same-node engine's GPU backends, tried before the host backend.
	xgmiBackends []xgmi.Backend
	// tcpStager lets the tcp engine stage GPU memory through pinned host memory (nil: it refuses GPU regions,
	// saying tcpNoStageReason).
	tcpStager tcp.Stager
	// tcpWire says how the running tcp engine carries data (empty when it does not run).
	tcpWire          string
	tcpNoStageReason string
	// cudaDriver is the loaded CUDA driver (nil when none loaded): the fabric engine, the rdma engine's GPU
	// memory and GPU pool memory need it; cudaCopy is how its kernels are compiled.
	cudaDriver *cuda.Driver
	cudaCopy   cudacopy.Options
	// cudaCopyRunning says the CUDA copy backend started (the fabric engine runs on the same runtime).
	cudaCopyRunning bool
	// cudaCopiers and hipCopiers are the GPU backends once they run: /metrics reads their copiers.
	cudaCopiers atomic.Pointer[cudacopy.Backend]
	hipCopiers  atomic.Pointer[hipcopy.Backend]
	// fabric is the fabric engine once it runs: the rdma engine yields its pairs, /metrics reads its cache.
	fabric atomic.Pointer[fabric.Engine]
	// composite is the assembled composite engine once it runs.
	composite atomic.Pointer[engines.Composite]
	// rdmaRunning says the rdma engine runs; rdmaWhyNot says why not.
	rdmaRunning bool
	rdmaWhyNot  string
	// gpuCopyWhyNot says why the same-node engine runs without a GPU backend on a node with GPUs.
	gpuCopyWhyNot string
	// gpuSharing says how this agent's GPU work shares the NVIDIA GPUs with other processes (gpuSharing()).
	gpuSharing string
}

// newTransferSide prepares the transfer side from a detection: which engines this node offers and its GPUs.
func newTransferSide(opts TransferOptions, rep topology.Report, deps Deps) *transferSide {
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	t := &transferSide{opts: opts, report: rep, deps: deps, log: deps.Logger}
	for _, e := range rep.Engines {
		t.statuses = append(t.statuses, server.EngineStatus{Name: e.Name, Available: e.Available, Reason: e.Reason})
	}
	for _, g := range rep.GPUs {
		info := server.GPUInfo{Index: g.Index, UUID: g.UUID, Vendor: engines.Vendor(g.Vendor), BusID: g.PCIBusID}
		if g.Fabric != nil {
			info.FabricDomain = g.Fabric.Domain
		}
		t.gpus = append(t.gpus, info)
	}
	return t
}

// Run serves the socket and the engines until ctx ends, and the health endpoint beside them from the start
// (a slow node certificate or GPU runtime must not fail a liveness probe). A health address it cannot listen
// on fails it at once, as the peer and data ports do: served meanwhile, the agent would look healthy through
// whatever else answers there.
func (t *transferSide) Run(ctx context.Context) error {
	ln, err := t.listenHealth()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	healthErr := make(chan error, 1)
	go func() { healthErr <- t.serveHealth(ctx, ln) }()
	err = t.serve(ctx)
	cancel()
	return errors.Join(err, <-healthErr)
}

// serve assembles the transfer side in the order each part needs the one before, and serves it.
func (t *transferSide) serve(ctx context.Context) error {
	cfg := t.opts.Config
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := t.log

	// 1. The GPU runtimes: the same-node engine's GPU backends and the tcp engine's stager. They close after
	// the composite has closed the engines that use them (the defer runs last).
	var gpuClosers []func() error
	defer func() {
		for _, c := range gpuClosers {
			_ = c()
		}
	}()
	if !t.opts.NoGPU {
		gpuClosers = t.loadGPURuntimes()
	}

	// Until the composite owns the engines (and the server the peer listener), a setup error must close them:
	// the tcp engine holds a listener and goroutines.
	var (
		built      []engines.Engine
		peerLn     net.Listener
		handedOver bool
	)
	dataLnOwned := false
	defer func() {
		if handedOver {
			return
		}
		for _, e := range built {
			_ = e.Close()
		}
		if peerLn != nil {
			_ = peerLn.Close()
		}
		if t.deps.DataListener != nil && !dataLnOwned {
			_ = t.deps.DataListener.Close() // handed to Serve, but no tcp engine took it
		}
	}()

	// The node's one region table: every engine is built on it and the composite owns it, so a region is
	// kept once and a batch planned once (by the composite, for every engine).
	regions := engines.NewRegistry(cfg.NodeName, 0)

	// 2. The pool's certificates, then the tcp engine and the agent-to-agent channel that opens its data
	// connections ahead of use. Without certificates the node runs alone: no channel, no tcp.
	var (
		pc     *peers.Peers
		peerEP string
		te     *tcp.Engine
		// others are every engine but tcp, for its Yield. It is filled once every engine is built, before the
		// server asks about any pair; construction order cannot provide it earlier, because the channel needs
		// the tcp engine (preconnection) and the rdma engine, which tcp yields to, needs the channel.
		others []engines.Engine
	)
	if cfg.TLSDir != "" {
		tlsFiles, err := peers.NewTLSFilesWith(cfg.TLSDir, cfg.PoolNamespace, cfg.PoolName, peers.TLSOptions{NodeCert: cfg.NodeCert})
		if err != nil {
			return fmt.Errorf("agent-to-agent certificates: %w", err)
		}
		if cfg.NodeCert {
			if t.deps.NodeCertificate == nil {
				return errors.New("--node-cert needs the Kubernetes API to ask for the node's certificate")
			}
			c, err := t.deps.NodeCertificate(ctx)
			if err == nil {
				err = tlsFiles.SetLeaf(c)
			}
			if err != nil {
				return fmt.Errorf("obtaining this node's agent-to-agent certificate: %w", err)
			}
			keepCtx, stopKeep := context.WithCancel(ctx)
			defer stopKeep()
			go nodecert.Keep(keepCtx, tlsFiles, t.deps.NodeCertificate, log.With("part", "node-certificate"))
		}
		if !cfg.DisableTCP {
			dataLn := t.deps.DataListener
			if dataLn == nil {
				if dataLn, err = net.Listen("tcp", cfg.DataListen); err != nil {
					return fmt.Errorf("listening for the tcp engine on %s: %w", cfg.DataListen, err)
				}
			}
			te, err = tcp.New(tcp.Options{Node: cfg.NodeName, Listener: dataLn, Advertise: advertise(cfg.DataAdvertise, dataLn),
				TLS: tlsFiles.Config(), CheckPeer: tlsFiles.CheckPeer, Logf: func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...), "engine", "tcp") },
				Stager: t.tcpStager, NoStageReason: t.tcpNoStageReason, StagingBytes: cfg.TCPStagingBytes,
				ConnsPerPeer: cfg.TCPConnsPerPeer, Registry: regions,
				// GPU pairs another engine moves without staging are left to it.
				Yield: func(src, dst *engines.MemoryDesc) bool {
					for _, o := range others {
						if ok, _ := o.CanHandle(src, dst); ok {
							return true
						}
					}
					return false
				}})
			if err != nil {
				dataLn.Close()
				return err
			}
			built = append(built, te)
			dataLnOwned = true // the tcp engine closes it
		}
		if peerLn, err = net.Listen("tcp", cfg.PeerListen); err != nil {
			return fmt.Errorf("listening for peers on %s: %w", cfg.PeerListen, err)
		}
		peerEP = advertise(cfg.PeerAdvertise, peerLn)
		var dir peers.Directory
		if cfg.StaticPeers != "" || t.deps.Kube == nil {
			dir, _ = ParsePeers(cfg.StaticPeers)
		} else {
			dir = &peers.APIDirectory{Reader: t.deps.Kube, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName}
		}
		popts := peers.Options{Node: cfg.NodeName, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName,
			AgentVersion: t.deps.AgentVersion, Listener: peerLn, TLS: tlsFiles, Directory: dir, Logger: log}
		if te != nil {
			// Peers learn the data address when they meet this agent and open their data connections then,
			// so the first transfer pays no handshake; this agent does the same towards them.
			popts.DataEndpoint, popts.Data, popts.MaxDataPeers = te.Addr(), te, cfg.PreconnectPeers
		}
		if pc, err = peers.New(popts); err != nil {
			peerLn.Close()
			peerLn = nil
			return err
		}
	}

	// 3. The engines that work through the channel: fabric (its notifications travel over it) and rdma (its
	// queue pairs are exchanged and its notifications sent over it; it answers peers' exchanges).
	var notifier engines.NotifySender = noChannel{}
	if pc != nil {
		notifier = pc
	}
	fe, closeFabric := t.fabricEngine(cfg.NodeName, regions, notifier)
	if fe != nil {
		built = append(built, fe)
		gpuClosers = append(gpuClosers, closeFabric)
	}
	re, err := t.rdmaEngine(cfg, regions, pc, fe)
	if err != nil {
		return fmt.Errorf("building the engines that use the agent-to-agent channel: %w", err)
	}
	if re != nil {
		built = append(built, re)
	}

	// 4. The same-node engine over the GPU backends and the host's, then the composite in the order of the
	// design (xgmi, fabric, tcp, rdma here; the composite plans by its own fixed order).
	x, err := xgmi.New(xgmi.Options{Node: cfg.NodeName, Registry: regions}, append(t.xgmiBackends, xgmi.NewHostBackend())...)
	if err != nil {
		return err
	}
	built = append(built, x)
	engs := []engines.Engine{x}
	if fe != nil {
		engs = append(engs, fe)
	}
	if te != nil {
		engs = append(engs, te)
	}
	if re != nil {
		engs = append(engs, re)
	}
	for _, e := range engs {
		if e != engines.Engine(te) {
			others = append(others, e)
		}
	}
	if te != nil {
		ok, how := te.Staging()
		t.tcpWire = te.Wire()
		log.Info("tcp engine", "gpuStaging", ok, "detail", how, "wire", t.tcpWire)
	}
	// GetInfo and explain say what runs: an engine detection found possible but this agent does not run is
	// reported unavailable, with both facts.
	t.markNotRunning(cfg, fe != nil)
	statuses := slices.Clone(t.statuses)
	gpuMemory := map[string]bool{"xgmi": len(t.xgmiBackends) > 0, "tcp": te != nil && t.tcpStager != nil, "fabric": fe != nil}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: cfg.NodeName, Metrics: t.deps.Metrics, Registry: regions}, engs...)
	if err != nil {
		return err
	}
	built = nil // the composite closes them now
	defer comp.Close()
	t.composite.Store(comp)

	// 5. Pool memory and the socket server.
	pool, err := newPool(cfg, t.gpus, driverOrNil(t.cudaDriver), log)
	if err != nil {
		return err
	}
	if pool != nil {
		defer pool.Close()
	}
	id := identity.Identifier{ProcRoot: filepath.Join(hostRoot(cfg.HostRoot), "proc"), AllowLocal: cfg.AllowLocal}
	var policy identity.NamespacePolicy = identity.StaticPolicy(nil)
	if t.deps.Kube != nil {
		id.Pods = &identity.APIPodResolver{Reader: t.deps.Kube, NodeName: cfg.NodeName}
		policy = t.deps.Policy
		if policy == nil {
			policy = &identity.APIPoolPolicy{Reader: t.deps.Kube, Namespace: cfg.PoolNamespace, Name: cfg.PoolName}
		}
	}
	sopts := server.Options{SocketDir: cfg.SocketDir, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName,
		NodeName: cfg.NodeName, AgentVersion: t.deps.AgentVersion, PeerEndpoint: peerEP, Engine: comp, Engines: t.statuses, GPUs: t.gpus,
		FabricDomainOf: t.deps.FabricDomainOf, Identifier: id, Policy: policy, Pool: pool, SocketGID: cfg.SocketGID, Logger: log,
		FastSpin: fastSpin(cfg.FastSpin), FastSpinners: cfg.FastSpinners,
		Limits: server.Limits{MaxRegions: cfg.MaxRegions, MaxRegisteredBytes: cfg.MaxRegisteredBytes, MaxInFlight: cfg.MaxInFlight,
			MaxItemsPerTransfer: server.DefaultLimits.MaxItemsPerTransfer}}
	if pc != nil {
		sopts.Peers = pc
	}
	srv, err := server.New(sopts)
	if err != nil {
		return err
	}
	handedOver = true // pc.Serve closes the peer listener from here on
	if t.deps.Registry != nil {
		cs := []prometheus.Collector{srv.Collector()}
		if pc != nil {
			cs = append(cs, pc.Collector())
		}
		for _, c := range cs {
			if err := t.deps.Registry.Register(c); err != nil {
				return fmt.Errorf("registering metrics: %w", err)
			}
			defer t.deps.Registry.Unregister(c)
		}
	}

	// 6. Serve until ctx ends or one part fails.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ctx) }()
	running := 1
	if pc != nil {
		running++
		go func() { errc <- pc.Serve(ctx, srv) }()
	}
	go waitReady(ctx, srv.FDSocketPath(), func() {
		t.ready.Store(true)
		log.Info("transfer side ready", "socketDir", cfg.SocketDir, "peerEndpoint", peerEP)
		if t.deps.Ready != nil {
			t.deps.Ready(peerEP)
		}
		// Said once the socket serves: a report saying what runs must not come from an agent that then fails to
		// start its server.
		if t.deps.EnginesAssembled != nil {
			t.deps.EnginesAssembled(statuses, t.report.Engines, gpuMemory)
		}
	})
	var first error
	for range running {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel() // one part failed: stop the other
		}
	}
	return first
}

// noChannel answers the fabric engine's notifications on a node without the agent-to-agent channel.
type noChannel struct{}

// SendNotification implements engines.NotifySender.
func (noChannel) SendNotification(_ context.Context, node string, _ engines.Notification) error {
	return fmt.Errorf("no agent-to-agent channel to notify node %s (the pool's certificates are not mounted: --tls-dir)", node)
}

// engineAllowed reports whether detection (with the pool's engine list applied) left the engine available.
func engineAllowed(rep topology.Report, name string) bool {
	e, ok := rep.Engine(name)
	return ok && e.Available
}

// slogFrom routes the transfer side's slog output through the agent's logr logger.
func slogFrom(log logr.Logger) *slog.Logger { return slog.New(logr.ToSlogHandler(log)) }
