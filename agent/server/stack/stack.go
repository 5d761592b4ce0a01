// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package stack

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodecert"
	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// EnvPodIP names the pod IP (downward API); advertised addresses default to it.
const EnvPodIP = "POD_IP"

// Config is the transfer side's configuration.
type Config struct {
	SocketDir     string
	PoolNamespace string
	PoolName      string
	NodeName      string
	// HostRoot is where the host's / is mounted; callers' cgroups are read from HostRoot/proc.
	HostRoot   string
	AllowLocal bool
	SocketGID  int

	// PeerListen and DataListen are the agent-to-agent (gRPC) and tcp-engine (bulk bytes) listen addresses;
	// the Advertise forms are what peers dial (default: $POD_IP with the listen port).
	PeerListen, PeerAdvertise string
	DataListen, DataAdvertise string
	// TLSDir holds the pool's tls.crt, tls.key and ca.crt. Empty: single-node mode, no peers, no tcp engine.
	TLSDir string
	// NodeCert: TLSDir holds only the pool's ca.crt and this node's own certificate is obtained through
	// Deps.NodeCertificate (the operator signs it) and renewed before it expires. While the pool moves from
	// the pool-wide certificate of earlier versions, the operator says in TLSDir until when peers on it pass.
	NodeCert bool
	// StaticPeers is "node=host:port,..." for running outside Kubernetes; otherwise TransferNodes are read.
	StaticPeers string
	// DisableTCP keeps the tcp engine off (a pool that disallows it).
	DisableTCP bool
	// TCPStagingBytes bounds the pinned host memory the tcp engine stages GPU memory through, per peer and side
	// (0: the engine's default, 64 MiB).
	TCPStagingBytes int64
	// TCPConnsPerPeer is the number of tcp data connections to each peer (0: the engine's default, 4); each
	// encrypts and decrypts on its own goroutines, so more of them use more cores for one peer.
	TCPConnsPerPeer int
	// PreconnectPeers bounds how many peers get tcp data connections before first use (0: the default, 64;
	// negative: none).
	PreconnectPeers int

	// FastSpin is how long the fast socket polls for a caller's next request before sleeping.
	FastSpin time.Duration
	// FastSpinners bounds the fast connections polling at once.
	FastSpinners int

	PoolHostBytes uint64
	// PoolGPUBytes is device memory allocated on each NVIDIA GPU and lent to callers; on a node where it
	// cannot be (no GPUs, no driver) PoolHostBytes is lent instead.
	PoolGPUBytes uint64
	// PoolSlabBytes is the GPU pool's slab: the unit of device memory lent to one caller at a time (0: an
	// eighth of PoolGPUBytes).
	PoolSlabBytes      uint64
	MaxRegions         int
	MaxRegisteredBytes uint64
	MaxInFlight        int
}

// RegisterFlags adds the transfer side's own flags to fs. The pool, the node, the host root and the advertised
// peer endpoint are the agent's general flags; the caller copies them into Config.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.SocketDir, "socket-dir", fxv1.DefaultSocketDir, "host directory of the pool's sockets (the socket is <dir>/<pool>/agent.sock)")
	fs.BoolVar(&c.AllowLocal, "allow-local", false, "admit socket callers that are in no pod (demo, development); never on a shared cluster")
	fs.IntVar(&c.SocketGID, "socket-gid", -1, "group given the socket directory (mode 0750) and the sockets (mode 0660); -1 keeps the agent's group")
	fs.StringVar(&c.PeerListen, "peer-listen", ":7470", "listen address of the agent-to-agent channel (mTLS gRPC)")
	fs.StringVar(&c.DataListen, "data-listen", ":7471", "listen address of the tcp engine's data path")
	fs.StringVar(&c.DataAdvertise, "data-advertise", "", "address peers dial for the tcp engine (default $"+EnvPodIP+" with the listen port)")
	fs.StringVar(&c.TLSDir, "tls-dir", "/etc/fabricxfer/tls", "directory with the pool's tls.crt, tls.key and ca.crt; empty runs this node alone (no peers, no tcp engine)")
	fs.BoolVar(&c.NodeCert, "node-cert", false, "obtain this node's own agent-to-agent certificate from the operator (a CertificateSigningRequest); --tls-dir then holds only ca.crt")
	fs.StringVar(&c.StaticPeers, "peers", "", "static peer list node=host:port,... (outside Kubernetes; otherwise TransferNode endpoints are used)")
	fs.BoolVar(&c.DisableTCP, "disable-tcp", false, "keep the tcp engine off")
	fs.Int64Var(&c.TCPStagingBytes, "tcp-staging-bytes", 0, "pinned host memory the tcp engine stages GPU memory through, per peer node and side, in 4 MiB slots (0: 64 MiB; at least 8 MiB)")
	fs.IntVar(&c.TCPConnsPerPeer, "tcp-conns-per-peer", 0, "tcp data connections to each peer, 1 to 64 (0: 4)")
	fs.IntVar(&c.PreconnectPeers, "preconnect-peers", 64, "open tcp data connections ahead of use to at most this many peers (each agent picks its own subset; -1: none)")
	fs.DurationVar(&c.FastSpin, "fast-spin", server.DefaultFastSpin, "how long a fast-socket connection polls for its caller's next request before sleeping (0 never polls)")
	fs.IntVar(&c.FastSpinners, "fast-spinners", 0, "fast-socket connections that may poll at once, the cores kept busy for latency while callers are active (0: 2, or 1 below 16 cores)")
	fs.Uint64Var(&c.PoolHostBytes, "pool-host-bytes", 0, "host shared memory the agent lends to callers (AllocateFromPool); 0 lends none")
	fs.Uint64Var(&c.PoolGPUBytes, "pool-gpu-bytes", 0, "device memory per NVIDIA GPU the agent lends to callers (AllocateFromPool), fabric-exportable where the driver allows; 0 lends none")
	fs.Uint64Var(&c.PoolSlabBytes, "pool-slab-bytes", 0, "GPU pool memory is lent in slabs of this many bytes, each to one caller at a time (rounded up to the VMM granularity; 0: an eighth of --pool-gpu-bytes); it bounds one allocation")
	fs.IntVar(&c.MaxRegions, "max-regions", server.DefaultLimits.MaxRegions, "regions one caller (pod) may hold")
	fs.Uint64Var(&c.MaxRegisteredBytes, "max-registered-bytes", server.DefaultLimits.MaxRegisteredBytes, "bytes one caller may hold registered (spec.memory.maxRegisteredPerCaller)")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", server.DefaultLimits.MaxInFlight, "transfers one caller may have in flight")
}

// Deps are what the agent already has when it starts the stack.
type Deps struct {
	// Kube reads pods, the TransferPool and TransferNodes (nil outside Kubernetes: needs AllowLocal and
	// StaticPeers for peers).
	Kube         client.Reader
	AgentVersion string
	// Engines are the engine availabilities detection found (shown by GetInfo).
	Engines []server.EngineStatus
	// GPUs are the node's GPUs (from detection); GPU memory registrations name them.
	GPUs []server.GPUInfo
	// FabricDomainOf, when set, is a GPU's fabric domain now (server.Options.FabricDomainOf).
	FabricDomainOf func(gpu int) (string, bool)
	// ExtraEngines are engines built elsewhere (GPU engines) added to the composite.
	ExtraEngines []engines.Engine
	// PeerEngines, when set, builds the engines that work through the agent-to-agent channel (the rdma engine
	// exchanges its queue pairs and sends its notifications over it, and answers peers' exchanges as the
	// channel's QPAcceptor). It is called once the channel exists, so never without TLSDir; the engines it
	// returns join the composite, which closes them.
	PeerEngines func(ch *peers.Peers) ([]engines.Engine, error)
	// Metrics, when set, is charged by the composite with every plan and rejected item.
	Metrics *engines.Metrics
	// Registry, when set, gets the server's and the peer channel's collectors while they run.
	Registry prometheus.Registerer
	// XGMIBackends are GPU backends for the same-node engine, tried before the host backend.
	XGMIBackends []xgmi.Backend
	// TCPStager lets the tcp engine stage this node's GPU memory through pinned host memory (nil: it refuses GPU
	// regions, saying TCPNoStageReason).
	TCPStager        tcp.Stager
	TCPNoStageReason string
	// GPUDriver is the loaded CUDA driver (nil when none loaded); GPU pool memory needs it.
	GPUDriver poolmem.GPUDriver
	Logger    *slog.Logger
	// Ready, when set, is called once the sockets are open, with the advertised peer endpoint.
	Ready func(peerEndpoint string)
	// NodeCertificate obtains this node's certificate for a new key (with Config.NodeCert).
	NodeCertificate func(ctx context.Context) (tls.Certificate, error)
	// DataListener, when set, serves the tcp engine instead of a listener on Config.DataListen (a socket
	// handed over by the caller); Run closes it.
	DataListener net.Listener
}

// Validate checks the configuration before anything starts.
func (c *Config) Validate() error {
	var errs []error
	if c.PoolNamespace == "" || c.PoolName == "" {
		errs = append(errs, errors.New("the pool's namespace and name are required"))
	}
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is required"))
	}
	if c.SocketDir == "" || !filepath.IsAbs(c.SocketDir) {
		errs = append(errs, fmt.Errorf("--socket-dir %q must be an absolute path", c.SocketDir))
	}
	// The operator writes 1..2147483647 (spec.socketGroup); 0 is allowed here for a hand-run agent. Above the
	// bound a chown would wrap or reach (gid_t)-1, which the kernel reads as "leave the group".
	if c.SocketGID < -1 || c.SocketGID > fxv1.MaxSocketGroup {
		errs = append(errs, fmt.Errorf("--socket-gid %d must be -1 (the agent's group) or a group ID from 0 to %d", c.SocketGID, fxv1.MaxSocketGroup))
	}
	if _, err := ParsePeers(c.StaticPeers); err != nil {
		errs = append(errs, err)
	}
	if c.TCPConnsPerPeer < 0 || c.TCPConnsPerPeer > 64 {
		errs = append(errs, fmt.Errorf("--tcp-conns-per-peer %d must be 0 (the default) or from 1 to 64", c.TCPConnsPerPeer))
	}
	if c.TCPStagingBytes != 0 && (c.TCPStagingBytes < 8<<20 || c.TCPStagingBytes > 64<<30) {
		errs = append(errs, fmt.Errorf("--tcp-staging-bytes %d must be 0 (the default) or from 8 MiB to 64 GiB", c.TCPStagingBytes))
	}
	return errors.Join(errs...)
}

// ParsePeers reads "node=host:port,...".
func ParsePeers(s string) (peers.StaticDirectory, error) {
	out := peers.StaticDirectory{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		node, addr, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || node == "" {
			return nil, fmt.Errorf("--peers: %q is not node=host:port", part)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("--peers: node %s: %w", node, err)
		}
		out[node] = addr
	}
	return out, nil
}

func advertise(explicit string, ln net.Listener) string {
	if explicit != "" {
		return explicit
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if ip := os.Getenv(EnvPodIP); ip != "" {
		return net.JoinHostPort(ip, port)
	}
	return ln.Addr().String()
}

// Run builds the stack and serves until ctx ends.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	x, err := xgmi.New(xgmi.Options{Node: cfg.NodeName}, append(deps.XGMIBackends, xgmi.NewHostBackend())...)
	if err != nil {
		return err
	}
	engs := append([]engines.Engine{x}, deps.ExtraEngines...)
	// Until the composite owns the engines (and the server the peer listener), a setup error must close them:
	// the tcp engine holds a listener and goroutines.
	var peerLn net.Listener
	handedOver, dataLnOwned := false, false
	defer func() {
		if handedOver {
			return
		}
		for _, e := range engs {
			_ = e.Close()
		}
		if peerLn != nil {
			_ = peerLn.Close()
		}
		if deps.DataListener != nil && !dataLnOwned {
			_ = deps.DataListener.Close() // handed to Run, but no tcp engine took it
		}
	}()

	var (
		tlsFiles *peers.TLSFiles
		pc       *peers.Peers
		peerEP   string
		te       *tcp.Engine
		others   []engines.Engine // every engine but tcp, for its Yield
	)
	if cfg.TLSDir != "" {
		if tlsFiles, err = peers.NewTLSFilesWith(cfg.TLSDir, cfg.PoolNamespace, cfg.PoolName,
			peers.TLSOptions{NodeCert: cfg.NodeCert}); err != nil {
			return fmt.Errorf("agent-to-agent certificates: %w", err)
		}
		if cfg.NodeCert {
			if deps.NodeCertificate == nil {
				return errors.New("--node-cert needs the Kubernetes API to ask for the node's certificate")
			}
			c, err := deps.NodeCertificate(ctx)
			if err == nil {
				err = tlsFiles.SetLeaf(c)
			}
			if err != nil {
				return fmt.Errorf("obtaining this node's agent-to-agent certificate: %w", err)
			}
			keepCtx, stopKeep := context.WithCancel(ctx)
			defer stopKeep()
			go nodecert.Keep(keepCtx, tlsFiles, deps.NodeCertificate, log.With("part", "node-certificate"))
		}
		if !cfg.DisableTCP {
			dataLn := deps.DataListener
			if dataLn == nil {
				if dataLn, err = net.Listen("tcp", cfg.DataListen); err != nil {
					return fmt.Errorf("listening for the tcp engine on %s: %w", cfg.DataListen, err)
				}
			}
			te, err = tcp.New(tcp.Options{Node: cfg.NodeName, Listener: dataLn, Advertise: advertise(cfg.DataAdvertise, dataLn),
				TLS: tlsFiles.Config(), CheckPeer: tlsFiles.CheckPeer, Logf: func(f string, a ...any) { log.Info(fmt.Sprintf(f, a...), "engine", "tcp") },
				Stager: deps.TCPStager, NoStageReason: deps.TCPNoStageReason, StagingBytes: cfg.TCPStagingBytes,
				ConnsPerPeer: cfg.TCPConnsPerPeer,
				// GPU pairs another engine moves without staging are left to it; the engines are known once
				// all of them are built, before any pair is asked about.
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
			engs = append(engs, te)
			dataLnOwned = true // the tcp engine closes it
		}
		if peerLn, err = net.Listen("tcp", cfg.PeerListen); err != nil {
			return fmt.Errorf("listening for peers on %s: %w", cfg.PeerListen, err)
		}
		peerEP = advertise(cfg.PeerAdvertise, peerLn)
		var dir peers.Directory
		if cfg.StaticPeers != "" || deps.Kube == nil {
			dir, _ = ParsePeers(cfg.StaticPeers)
		} else {
			dir = &peers.APIDirectory{Reader: deps.Kube, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName}
		}
		popts := peers.Options{Node: cfg.NodeName, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName,
			AgentVersion: deps.AgentVersion, Listener: peerLn, TLS: tlsFiles, Directory: dir, Logger: log}
		if te != nil {
			// Peers learn the data address when they meet this agent and open their data connections then,
			// so the first transfer pays no handshake; this agent does the same towards them.
			popts.DataEndpoint, popts.Data, popts.MaxDataPeers = te.Addr(), te, cfg.PreconnectPeers
		}
		if pc, err = peers.New(popts); err != nil {
			peerLn.Close()
			return err
		}
		if deps.PeerEngines != nil {
			more, err := deps.PeerEngines(pc)
			if err != nil {
				return fmt.Errorf("building the engines that use the agent-to-agent channel: %w", err)
			}
			engs = append(engs, more...)
		}
	}
	for _, e := range engs {
		if e != engines.Engine(te) {
			others = append(others, e)
		}
	}
	if te != nil {
		ok, how := te.Staging()
		log.Info("tcp engine", "gpuStaging", ok, "detail", how)
	}
	comp, err := engines.NewComposite(engines.CompositeOptions{Node: cfg.NodeName, Metrics: deps.Metrics}, engs...)
	if err != nil {
		return err
	}
	engs = nil // the composite closes them now
	defer comp.Close()

	pool, err := newPool(cfg, deps, log)
	if err != nil {
		return err
	}
	if pool != nil {
		defer pool.Close()
	}
	id := identity.Identifier{ProcRoot: filepath.Join(hostRoot(cfg.HostRoot), "proc"), AllowLocal: cfg.AllowLocal}
	var policy identity.NamespacePolicy = identity.StaticPolicy(nil)
	if deps.Kube != nil {
		id.Pods = &identity.APIPodResolver{Reader: deps.Kube, NodeName: cfg.NodeName}
		policy = &identity.APIPoolPolicy{Reader: deps.Kube, Namespace: cfg.PoolNamespace, Name: cfg.PoolName}
	}
	opts := server.Options{SocketDir: cfg.SocketDir, PoolNamespace: cfg.PoolNamespace, PoolName: cfg.PoolName,
		NodeName: cfg.NodeName, AgentVersion: deps.AgentVersion, PeerEndpoint: peerEP, Engine: comp, Engines: deps.Engines, GPUs: deps.GPUs, FabricDomainOf: deps.FabricDomainOf,
		Identifier: id, Policy: policy, Pool: pool, SocketGID: cfg.SocketGID, Logger: log, FastSpin: fastSpin(cfg.FastSpin), FastSpinners: cfg.FastSpinners,
		Limits: server.Limits{MaxRegions: cfg.MaxRegions, MaxRegisteredBytes: cfg.MaxRegisteredBytes, MaxInFlight: cfg.MaxInFlight,
			MaxItemsPerTransfer: server.DefaultLimits.MaxItemsPerTransfer}}
	if pc != nil {
		opts.Peers = pc
	}
	srv, err := server.New(opts)
	if err != nil {
		return err
	}
	handedOver = true // pc.Serve closes the peer listener from here on
	if deps.Registry != nil {
		cs := []prometheus.Collector{srv.Collector()}
		if pc != nil {
			cs = append(cs, pc.Collector())
		}
		for _, c := range cs {
			if err := deps.Registry.Register(c); err != nil {
				return fmt.Errorf("registering metrics: %w", err)
			}
			defer deps.Registry.Unregister(c)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ctx) }()
	running := 1
	if pc != nil {
		running++
		go func() { errc <- pc.Serve(ctx, srv) }()
	}
	if deps.Ready != nil {
		go waitReady(ctx, srv.FDSocketPath(), func() { deps.Ready(peerEP) })
	}
	var first error
	for range running {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel() // one part failed: stop the other
		}
	}
	return first
}

// newPool creates the memory the agent lends: device memory on every NVIDIA GPU when the pool asks for it and
// the driver loaded, else host shared memory when the pool asks for that; nil when it asks for neither.
func newPool(cfg Config, deps Deps, log *slog.Logger) (poolmem.Allocator, error) {
	if cfg.PoolGPUBytes > 0 {
		var targets []poolmem.GPUTarget
		for _, g := range deps.GPUs {
			if g.Vendor == engines.VendorNVIDIA {
				targets = append(targets, poolmem.GPUTarget{Index: g.Index, BusID: g.BusID})
			}
		}
		switch {
		case len(targets) == 0:
			log.Info("no GPU pool memory: this node has no NVIDIA GPUs", "poolGPUBytes", cfg.PoolGPUBytes)
		case deps.GPUDriver == nil:
			log.Info("no GPU pool memory: the CUDA driver did not load", "poolGPUBytes", cfg.PoolGPUBytes)
		default:
			gp, err := poolmem.NewGPUWithOptions(deps.GPUDriver, targets, poolmem.GPUOptions{PerGPU: cfg.PoolGPUBytes, SlabBytes: cfg.PoolSlabBytes})
			if err != nil {
				return nil, fmt.Errorf("allocating the pool's GPU memory (--pool-gpu-bytes): %w", err)
			}
			for _, d := range gp.Devices() {
				log.Info("GPU pool memory allocated", "gpu", d.Index, "busID", d.BusID, "bytes", d.Total,
					"fabricExportable", d.FabricExportable, "notExportableBecause", d.FabricReason)
			}
			if cfg.PoolHostBytes > 0 {
				log.Info("host pool memory not allocated: this node lends GPU memory", "poolHostBytes", cfg.PoolHostBytes)
			}
			return gp, nil
		}
	}
	if cfg.PoolHostBytes > 0 {
		return poolmem.NewHost("fabricxfer-"+cfg.PoolName, cfg.PoolHostBytes)
	}
	return nil, nil
}

// fastSpin maps the flag's 0 ("never poll") to the server's negative value (its 0 means the default).
func fastSpin(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func hostRoot(r string) string {
	if r == "" {
		return "/"
	}
	return r
}
