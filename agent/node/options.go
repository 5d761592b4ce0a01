// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	"github.com/fabricxfer/fabricxfer/internal/gcfloor"
	"github.com/fabricxfer/fabricxfer/topology"
	"github.com/fabricxfer/fabricxfer/topology/nvmlfake"
)

// Environment variables that set defaults of the flags of the same meaning.
const (
	EnvNodeName       = "NODE_NAME"
	envDisableEngines = "FABRICXFER_DISABLE_ENGINES"
	envEngines        = "FABRICXFER_ENGINES"
	envFabricDomain   = "FABRICXFER_FABRIC_DOMAIN"
	envNVMLFixture    = "FABRICXFER_NVML_FIXTURE"
)

// Options are everything the agent is told: how to detect the node, which pool it serves, how it reports, and
// its transfer side and DRA driver.
type Options struct {
	Detection     DetectionOptions
	Kubeconfig    string
	PoolNamespace string
	PoolName      string
	Heartbeat     time.Duration
	// Endpoint is the host:port other agents reach this one at, reported in the TransferNode.
	Endpoint string
	Transfer TransferOptions
	DRA      DRAOptions
	// Version is the agent's version, reported in the TransferNode, GetInfo and to peers.
	Version string
	// GCHeapFloor keeps the Go collector's heap goal at least about twice this many bytes while the agent runs
	// (internal/gcfloor), so a busy socket caller meets a collection every few thousand calls, not every
	// thousand; 0 leaves the collector's default.
	GCHeapFloor uint64
}

// DefaultGCHeapFloor is --gc-heap-floor's default.
const DefaultGCHeapFloor = gcfloor.Default

// maxGCHeapFloor bounds --gc-heap-floor: memory the agent may hold as garbage between collections.
const maxGCHeapFloor = 4 << 30

// RegisterFlags adds the flags of "agent run" (and "agent standalone") to fs.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	o.Detection.RegisterFlags(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; empty uses the in-cluster service account")
	fs.StringVar(&o.PoolNamespace, "pool-namespace", os.Getenv("POOL_NAMESPACE"), "namespace of the TransferPool this agent serves")
	fs.StringVar(&o.PoolName, "pool-name", os.Getenv("POOL_NAME"), "name of the TransferPool this agent serves")
	fs.DurationVar(&o.Heartbeat, "heartbeat", 10*time.Second, "heartbeat and re-detection period")
	fs.StringVar(&o.Endpoint, "endpoint", "", "host:port other agents reach this one at, reported in the TransferNode")
	fs.StringVar(&o.Endpoint, "advertise", "", "same as --endpoint (the name the operator's DaemonSet uses)")
	fs.Uint64Var(&o.GCHeapFloor, "gc-heap-floor", DefaultGCHeapFloor, "bytes the Go collector lets the heap grow by between collections at least (never touched: no resident memory); 0 keeps Go's default of twice the live heap, at most 4 GiB")
	o.Transfer.RegisterFlags(fs)
	o.DRA.RegisterFlags(fs)
}

// checkGCHeapFloor refuses a floor above maxGCHeapFloor (a unit typed wrong, most likely).
func (o *Options) checkGCHeapFloor() error {
	if o.GCHeapFloor > maxGCHeapFloor {
		return fmt.Errorf("--gc-heap-floor %d bytes is above %d (4 GiB)", o.GCHeapFloor, uint64(maxGCHeapFloor))
	}
	return nil
}

// DetectionOptions say how the node is detected ("agent detect", "run" and "standalone" share them).
type DetectionOptions struct {
	HostRoot       string
	NodeName       string
	DisableEngines string
	Engines        string
	FabricDomain   string
	NVMLFixture    string
	// OpenNVML opens the NVML library when no fixture is given (topology/nvml.Open); nil reports NVML facts as
	// unreadable. The caller links the binding: its cgo symbols are resolved when the binary starts where the
	// program also links Go's plugin package (xferctl does, through kustomize), so this package, which
	// xferctl's local agent imports, must not.
	OpenNVML topology.OpenNVML
}

// RegisterFlags adds the detection flags to fs.
func (d *DetectionOptions) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&d.HostRoot, "host-root", "/", "directory holding the node's /sys and /proc (the host's / mounted into the agent)")
	fs.StringVar(&d.NodeName, "node-name", os.Getenv(EnvNodeName), "name of the Node this agent runs on (default $"+EnvNodeName+")")
	fs.StringVar(&d.DisableEngines, "disable-engines", os.Getenv(envDisableEngines), "comma-separated engines to report unavailable, e.g. fabric,rdma (default $"+envDisableEngines+")")
	fs.StringVar(&d.Engines, "engines", os.Getenv(envEngines), "comma-separated engines the pool allows (the operator passes the pool's spec.engines); the others are reported unavailable (default $"+envEngines+", empty allows all)")
	fs.StringVar(&d.FabricDomain, "fabric-domain", os.Getenv(envFabricDomain), "pin every GPU's fabric domain key, ualink:<ppod>/<vpod> or nvlink:<clusterUUID>.<cliqueId> (default $"+envFabricDomain+")")
	fs.StringVar(&d.NVMLFixture, "nvml-fixture", os.Getenv(envNVMLFixture), "answer NVML queries from this JSON file instead of the driver (fixture nodes and demos)")
}

// detectFunc detects the node once.
type detectFunc func(ctx context.Context) (topology.Report, error)

// detector builds the detection function the options describe, failing on bad input before anything runs.
// declarations, when set, gives each detection the VPodTopologies that declare this node's GPUs.
func (d DetectionOptions) detector(declarations func(ctx context.Context) []topology.Declaration) (detectFunc, error) {
	host, err := topology.NewDirHost(d.HostRoot)
	if err != nil {
		return nil, err
	}
	o, err := d.overrides()
	if err != nil {
		return nil, err
	}
	open := d.OpenNVML
	if d.NVMLFixture != "" {
		m, err := nvmlfake.Load(d.NVMLFixture)
		if err != nil {
			return nil, fmt.Errorf("--nvml-fixture: %w", err)
		}
		open = m.Opener()
	}
	opts := topology.Options{OpenNVML: open, Overrides: o}
	return func(ctx context.Context) (topology.Report, error) {
		opts := opts
		if declarations != nil {
			opts.Declarations = declarations(ctx)
		}
		return topology.Detect(ctx, host, opts)
	}, nil
}

// overrides merges the engine and domain options: engines the pool does not allow and engines disabled on the
// node are both reported unavailable, each saying where that came from.
func (d DetectionOptions) overrides() (topology.Overrides, error) {
	o := topology.Overrides{FabricDomain: d.FabricDomain}
	disabled := map[string]bool{}
	var by []string
	if d.Engines != "" {
		allowed, err := topology.ParseEngineList(d.Engines)
		if err != nil {
			return o, fmt.Errorf("--engines: %w", err)
		}
		if len(allowed) == 0 {
			return o, fmt.Errorf("--engines %q names no engine", d.Engines)
		}
		ok := map[string]bool{}
		for _, e := range allowed {
			ok[e] = true
		}
		for _, e := range topology.AllEngines() {
			if !ok[e] {
				disabled[e] = true
			}
		}
		by = append(by, "the pool's engines (--engines)")
	}
	if d.DisableEngines != "" {
		off, err := topology.ParseEngineList(d.DisableEngines)
		if err != nil {
			return o, fmt.Errorf("--disable-engines: %w", err)
		}
		for _, e := range off {
			disabled[e] = true
		}
		by = append(by, "agent configuration (--disable-engines)")
	}
	for _, e := range topology.AllEngines() {
		if disabled[e] {
			o.DisabledEngines = append(o.DisabledEngines, e)
		}
	}
	o.DisabledBy = strings.Join(by, " and ")
	if err := o.Validate(); err != nil {
		return o, fmt.Errorf("--fabric-domain: %w", err)
	}
	return o, nil
}

// TransferOptions configure the transfer side: the socket server, the engines and the agent-to-agent channel
// (Config, whose flags xferctl's local agent shares), plus what only the node agent has: the health endpoint,
// the kernel cache and the GPU and verbs libraries it loads.
type TransferOptions struct {
	Config
	HealthAddr  string
	KernelCache string
	// ReportOnly: only detect and report; serve no socket and move no bytes.
	ReportOnly bool
	// CallerRoot is where callers' /proc is read from; it differs from --host-root only when detection reads a
	// fixture tree while callers are real local processes (demo, tests).
	CallerRoot string
	// Libibverbs is the verbs library the rdma engine loads ("": libibverbs.so.1 from the loader's path).
	Libibverbs string
	// Libamdhip64 is the HIP runtime the AMD GPU backend loads ("": the usual sonames from the loader's path).
	Libamdhip64 string
	// NoGPU loads no GPU runtime: host memory only, whatever the report lists (xferctl's local agent, which
	// detects nothing).
	NoGPU bool
	// sysRoot is where the verbs binding reads port GID types (the detection host root's /sys; "": the
	// binding's default).
	sysRoot string
}

// RegisterFlags adds the transfer side's flags to fs: Config's and the node agent's own.
func (t *TransferOptions) RegisterFlags(fs *flag.FlagSet) {
	t.Config.RegisterFlags(fs)
	fs.StringVar(&t.HealthAddr, "health-addr", ":7472", "address of /healthz and /readyz (empty: none)")
	fs.StringVar(&t.KernelCache, "kernel-cache", "", "directory caching compiled copy kernels between restarts (empty: no cache)")
	fs.BoolVar(&t.ReportOnly, "report-only", false, "only detect and report; serve no socket and move no bytes")
	fs.StringVar(&t.CallerRoot, "caller-host-root", "", "root whose /proc identifies socket callers (default: --host-root)")
	fs.StringVar(&t.Libibverbs, "libibverbs", "", "verbs library the rdma engine loads (default libibverbs.so.1 from the loader's search path)")
	fs.StringVar(&t.Libamdhip64, "libamdhip64", "", "HIP runtime the AMD GPU copy backend loads (default libamdhip64.so from the loader's search path)")
}

// DRAOptions configure the agent's DRA driver (agent/dra), off unless Enabled.
type DRAOptions struct {
	Enabled       bool
	Channels      int
	HostSocketDir string
	CDIDir        string
	PluginDir     string
	RegistryDir   string
}

// RegisterFlags adds the DRA driver's flags to fs.
func (f *DRAOptions) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&f.Enabled, "dra", false, "run the fabricxfer.io DRA driver: publish this node's ResourceSlice and prepare claims for the kubelet")
	fs.IntVar(&f.Channels, "dra-channels", dra.DefaultChannels, "transfer-channel devices this node publishes (pods that may hold a claim at once; at most 128)")
	fs.StringVar(&f.HostSocketDir, "dra-host-socket-dir", "", "the pool's socket directory as the host sees it, mounted into claiming containers (default: <--socket-dir>/<pool>)")
	fs.StringVar(&f.CDIDir, "cdi-dir", "/var/run/cdi", "where prepared claims' CDI specs are written")
	fs.StringVar(&f.PluginDir, "kubelet-plugin-dir", "/var/lib/kubelet/plugins/"+dra.DriverName, "folder of the plugin's gRPC socket dra.sock")
	fs.StringVar(&f.RegistryDir, "kubelet-registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registry")
}
