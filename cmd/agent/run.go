// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

// runConfig is everything "agent run" was told.
type runConfig struct {
	detection     detectionFlags
	kubeconfig    string
	poolNamespace string
	poolName      string
	heartbeat     time.Duration
	endpoint      string
	transfer      transferFlags
	dra           draFlags
}

func (c *runConfig) register(fs *flag.FlagSet) {
	c.detection.register(fs)
	fs.StringVar(&c.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; empty uses the in-cluster service account")
	fs.StringVar(&c.poolNamespace, "pool-namespace", os.Getenv("POOL_NAMESPACE"), "namespace of the TransferPool this agent serves")
	fs.StringVar(&c.poolName, "pool-name", os.Getenv("POOL_NAME"), "name of the TransferPool this agent serves")
	fs.DurationVar(&c.heartbeat, "heartbeat", 10*time.Second, "heartbeat and re-detection period")
	fs.StringVar(&c.endpoint, "endpoint", "", "host:port other agents reach this one at, reported in the TransferNode")
	fs.StringVar(&c.endpoint, "advertise", "", "same as --endpoint (the name the operator's DaemonSet uses)")
	c.transfer.register(fs)
	c.dra.register(fs)
}

// declarationListWait bounds the read of the node's declarations at start.
const declarationListWait = 10 * time.Second

// gpuDomains keeps each GPU's fabric domain from the latest detection.
type gpuDomains struct {
	mu      sync.Mutex
	byIndex map[int]string
}

// track wraps a detector so that every successful detection updates the domains.
func (g *gpuDomains) track(detect func(context.Context) (topology.Report, error)) func(context.Context) (topology.Report, error) {
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

// component is one long-running part of the agent. Run returns when ctx ends (nil) or on a fatal error.
type component interface {
	Run(ctx context.Context) error
}

// agentRuntime is the running agent: the shared dependencies and the components that use them.
type agentRuntime struct {
	log        logr.Logger
	client     client.Client
	detect     func(context.Context) (topology.Report, error)
	identity   nodestatus.Identity
	components []component
}

// buildRuntime wires the agent from its configuration. Components that serve pods or peers (the socket
// server, the agent-to-agent listener) are added here, next to the reporter, sharing the same detector,
// client and identity.
func buildRuntime(cfg runConfig, log logr.Logger) (*agentRuntime, error) {
	if cfg.detection.nodeName == "" {
		return nil, fmt.Errorf("--node-name (or $%s) is required", envNodeName)
	}
	if cfg.heartbeat <= 0 {
		return nil, fmt.Errorf("--heartbeat %s must be positive", cfg.heartbeat)
	}
	// Declared vPODs: the VPodTopologies labelled for this node only, read once before the first detection, so
	// the first report and the transfer side (which builds its engines from it) start from them, then watched.
	var (
		decls   *nodesync.DeclarationWatch
		initial []topology.Declaration
	)
	cfg.detection.declarations = func(context.Context) []topology.Declaration {
		if decls.WaitSynced(nil) {
			return decls.Declarations()
		}
		return initial
	}
	detect, err := cfg.detection.detector()
	if err != nil {
		return nil, err
	}
	restCfg, err := restConfig(cfg.kubeconfig)
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
	decls = nodesync.NewDeclarationWatch(c, cfg.detection.nodeName, log.WithName("declarations"))
	listCtx, cancel := context.WithTimeout(context.Background(), declarationListWait)
	initial, err = nodesync.ListDeclarations(listCtx, c, cfg.detection.nodeName)
	cancel()
	if err != nil {
		log.Error(err, "reading declared vPODs at start; the watch retries", "node", cfg.detection.nodeName)
	}
	// The transfer side registers GPU memory under each GPU's domain as the latest detection has it.
	domains := &gpuDomains{}
	detect = domains.track(detect)
	cfg.transfer.fabricDomainOf = domains.of
	rt := &agentRuntime{
		log:      log,
		client:   c,
		detect:   detect,
		identity: nodestatus.Identity{AgentVersion: version, Endpoint: cfg.endpoint},
	}
	rt.components = append(rt.components, decls)
	rep, err := nodesync.New(nodesync.Config{
		NodeName:      cfg.detection.nodeName,
		PoolNamespace: cfg.poolNamespace,
		PoolName:      cfg.poolName,
		Period:        cfg.heartbeat,
		Identity:      rt.identity,
		Detect:        detect,
		Client:        c,
		Log:           log.WithName("reporter"),
		RecordEvents:  true,
		Watch:         c,
	})
	if err != nil {
		return nil, err
	}
	rt.components = append(rt.components, rep)
	if cfg.dra.enabled {
		drv, err := cfg.dra.component(cfg, restCfg, detect, log)
		if err != nil {
			return nil, err
		}
		rt.components = append(rt.components, drv)
	}
	if !cfg.transfer.noTransfer {
		ts, err := buildTransferSide(cfg, c, detect, log)
		if err != nil {
			return nil, err
		}
		rt.components = append(rt.components, ts)
	}
	return rt, nil
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

// run starts every component and waits until ctx ends or one fails.
func (rt *agentRuntime) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	for _, c := range rt.components {
		g.Go(func() error { return c.Run(ctx) })
	}
	return g.Wait()
}

func runCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg runConfig
	var lf logFlags
	cfg.register(fs)
	lf.register(fs)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent run: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	rt, err := buildRuntime(cfg, log)
	if err != nil {
		return err
	}
	log.Info("agent started", "node", cfg.detection.nodeName, "hostRoot", cfg.detection.hostRoot, "heartbeat", cfg.heartbeat, "version", version)
	err = rt.run(ctx)
	log.Info("agent stopped", "node", cfg.detection.nodeName)
	return err
}
