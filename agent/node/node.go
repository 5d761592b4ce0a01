// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodecert"
	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/gcfloor"
	"github.com/fabricxfer/fabricxfer/topology"
)

const (
	// declarationListWait bounds the read of the node's declarations at start.
	declarationListWait = 10 * time.Second
	// firstDetectionWait bounds the detection the transfer side is built from.
	firstDetectionWait = 30 * time.Second
)

// component is one long-running part of the agent. Run returns when ctx ends (nil) or on a fatal error.
type component interface {
	Run(ctx context.Context) error
}

// Node is an assembled agent: the parts that run side by side, sharing one detector, client and identity.
type Node struct {
	components []component
	// gcHeapFloor is held while the agent runs (Options.GCHeapFloor).
	gcHeapFloor uint64
}

// Run starts every part and waits until ctx ends or one fails.
func (n *Node) Run(ctx context.Context) error {
	floor := gcfloor.Hold(n.gcHeapFloor)
	defer floor.Release()
	g, ctx := errgroup.WithContext(ctx)
	for _, c := range n.components {
		g.Go(func() error { return c.Run(ctx) })
	}
	return g.Wait()
}

// New assembles the agent of a Kubernetes node: the watch of the node's declared vPODs, the reporter that keeps
// its TransferNode current, the DRA driver when asked for, and the transfer side (socket server, engines,
// agent-to-agent channel) unless the agent only reports.
func New(ctx context.Context, opts Options, log logr.Logger) (*Node, error) {
	if opts.Detection.NodeName == "" {
		return nil, fmt.Errorf("--node-name (or $%s) is required", EnvNodeName)
	}
	if opts.Heartbeat <= 0 {
		return nil, fmt.Errorf("--heartbeat %s must be positive", opts.Heartbeat)
	}
	if err := opts.checkGCHeapFloor(); err != nil {
		return nil, err
	}
	node := opts.Detection.NodeName
	// Declared vPODs: the VPodTopologies labelled for this node only, read once before the first detection, so
	// the first report and the transfer side (built from it) start from them, then watched. The detector is
	// built first so that bad detection flags are refused before the API is reached.
	var (
		decls   *nodesync.DeclarationWatch
		initial []topology.Declaration
	)
	detect, err := opts.Detection.detector(func(context.Context) []topology.Declaration {
		if decls.Synced() {
			return decls.Declarations()
		}
		return initial
	})
	if err != nil {
		return nil, err
	}
	restCfg, err := restConfig(opts.Kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	// A watching client: the reporter watches the agent's own TransferNode to write back a status someone else
	// changed.
	c, err := client.NewWithWatch(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating Kubernetes client: %w", err)
	}
	decls = nodesync.NewDeclarationWatch(c, node, log.WithName("declarations"))
	listCtx, cancel := context.WithTimeout(ctx, declarationListWait)
	initial, err = nodesync.ListDeclarations(listCtx, c, node)
	cancel()
	if err != nil {
		log.Error(err, "reading declared vPODs at start; the watch retries", "node", node)
	}
	// The transfer side registers GPU memory under each GPU's domain as the latest detection has it.
	domains := &gpuDomains{}
	detect = domains.track(detect)
	n := &Node{components: []component{decls}, gcHeapFloor: opts.GCHeapFloor}
	runs := newEngineRuns(opts.Transfer.ReportOnly)
	rep, err := nodesync.New(nodesync.Config{
		NodeName:      node,
		PoolNamespace: opts.PoolNamespace,
		PoolName:      opts.PoolName,
		Period:        opts.Heartbeat,
		Identity:      nodestatus.Identity{AgentVersion: opts.Version, Endpoint: opts.Endpoint},
		Detect:        detect,
		Client:        c,
		Log:           log.WithName("reporter"),
		RecordEvents:  true,
		Watch:         c,
		Decorate:      runs.decorate,
		Kick:          runs.kick(),
	})
	if err != nil {
		return nil, err
	}
	n.components = append(n.components, rep)
	// One reading of the pool's allowedNamespaces, cached once, for the socket and the DRA driver.
	policy := &identity.APIPoolPolicy{Reader: c, Namespace: opts.PoolNamespace, Name: opts.PoolName}
	if opts.DRA.Enabled {
		drv, err := draDriver(opts, restCfg, policy, runs.overlay(detect), runs.kick(), log)
		if err != nil {
			return nil, err
		}
		n.components = append(n.components, drv)
	}
	if !opts.Transfer.ReportOnly {
		ts, err := newTransferSideFromDetection(ctx, opts, c, detect, domains.of, log)
		if err != nil {
			return nil, err
		}
		ts.deps.EnginesAssembled = runs.assembled
		ts.deps.Policy = policy
		n.components = append(n.components, ts)
	}
	return n, nil
}

// NewStandalone assembles an agent that serves the socket and moves bytes on one machine without Kubernetes:
// no kubeconfig, no TransferNode report, every local process admitted, no peers unless Transfer.StaticPeers
// and Transfer.TLSDir say so. The node is named after the host unless Detection.NodeName names it.
func NewStandalone(ctx context.Context, opts Options, log logr.Logger) (*Node, error) {
	if opts.Detection.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("no --node-name and no hostname: %w", err)
		}
		opts.Detection.NodeName = host
	}
	opts.Transfer.AllowLocal = true // there is no API server to identify pods with
	if err := opts.checkGCHeapFloor(); err != nil {
		return nil, err
	}
	detect, err := opts.Detection.detector(nil)
	if err != nil {
		return nil, err
	}
	ts, err := newTransferSideFromDetection(ctx, opts, nil, detect, nil, log)
	if err != nil {
		return nil, err
	}
	return &Node{components: []component{ts}, gcHeapFloor: opts.GCHeapFloor}, nil
}

// newTransferSideFromDetection detects once to learn the node's engines and GPUs, then prepares the socket
// server and engines for the pool this agent serves. c is nil outside Kubernetes; fabricDomainOf, when set, is
// each GPU's fabric domain as the latest detection has it.
func newTransferSideFromDetection(ctx context.Context, opts Options, c client.Client, detect detectFunc,
	fabricDomainOf func(gpu int) (string, bool), log logr.Logger) (*transferSide, error) {
	dctx, cancel := context.WithTimeout(ctx, firstDetectionWait)
	defer cancel()
	rep, err := detect(dctx)
	if err != nil {
		return nil, fmt.Errorf("detecting the node before starting the transfer side: %w", err)
	}
	tf := opts.Transfer
	tf.NodeName = opts.Detection.NodeName
	tf.PoolNamespace = opts.PoolNamespace
	tf.PoolName = opts.PoolName
	tf.HostRoot = opts.Detection.HostRoot
	if tf.CallerRoot != "" {
		tf.HostRoot = tf.CallerRoot
	}
	tf.PeerAdvertise = opts.Endpoint
	tf.sysRoot = filepath.Join(opts.Detection.HostRoot, "sys")
	if !engineAllowed(rep, engines.EngineTCP) {
		tf.DisableTCP = true
	}
	if err := tf.Validate(); err != nil {
		return nil, err
	}
	// /metrics: the transfer layer's collectors and the server's (registered while it runs), with the Go
	// runtime's and the process's (goroutines, memory, open fds), so an admin, and the soak test, can watch an
	// agent for leaks.
	reg := prometheus.NewRegistry()
	deps := Deps{Kube: c, AgentVersion: opts.Version, Logger: slogFrom(log.WithName("transfer")), Metrics: engines.NewMetrics(),
		Registry: reg, FabricDomainOf: fabricDomainOf}
	if tf.NodeCert && c != nil {
		deps.NodeCertificate = (&nodecert.Requester{Client: c, PoolNamespace: opts.PoolNamespace, PoolName: opts.PoolName,
			Node: tf.NodeName}).Request
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), deps.Metrics)
	t := newTransferSide(tf, rep, deps)
	t.registry = reg
	return t, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// gpuDomains keeps each GPU's fabric domain from the latest detection.
type gpuDomains struct {
	mu      sync.Mutex
	byIndex map[int]string
}

// track wraps a detector so that every successful detection updates the domains.
func (g *gpuDomains) track(detect detectFunc) detectFunc {
	return func(ctx context.Context) (topology.Report, error) {
		rep, err := detect(ctx)
		if err != nil {
			return rep, err
		}
		m := make(map[int]string, len(rep.GPUs))
		for _, gpu := range rep.GPUs {
			if gpu.Fabric != nil {
				m[gpu.Index] = gpu.Fabric.Domain
			} else {
				m[gpu.Index] = ""
			}
		}
		g.mu.Lock()
		g.byIndex = m
		g.mu.Unlock()
		return rep, nil
	}
}

// of is the GPU's domain as of the latest detection; ok is false before the first.
func (g *gpuDomains) of(gpu int) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	d, ok := g.byIndex[gpu]
	return d, ok
}
