// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	"github.com/fabricxfer/fabricxfer/topology"
)

// draFlags configure the agent's DRA driver (agent/dra), off unless --dra is given.
type draFlags struct {
	enabled       bool
	channels      int
	hostSocketDir string
	cdiDir        string
	pluginDir     string
	registryDir   string
}

func (f *draFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "dra", false, "run the fabricxfer.io DRA driver: publish this node's ResourceSlice and prepare claims for the kubelet")
	fs.IntVar(&f.channels, "dra-channels", dra.DefaultChannels, "transfer-channel devices this node publishes (pods that may hold a claim at once; at most 128)")
	fs.StringVar(&f.hostSocketDir, "dra-host-socket-dir", "", "the pool's socket directory as the host sees it, mounted into claiming containers (default: <--socket-dir>/<pool>)")
	fs.StringVar(&f.cdiDir, "cdi-dir", "/var/run/cdi", "where prepared claims' CDI specs are written")
	fs.StringVar(&f.pluginDir, "kubelet-plugin-dir", "/var/lib/kubelet/plugins/"+dra.DriverName, "folder of the plugin's gRPC socket dra.sock")
	fs.StringVar(&f.registryDir, "kubelet-registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registry")
}

// component builds the DRA driver from the agent's configuration.
func (f *draFlags) component(cfg runConfig, restCfg *rest.Config, detect func(context.Context) (topology.Report, error), log logr.Logger) (*dra.Driver, error) {
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA driver's Kubernetes client: %w", err)
	}
	host := f.hostSocketDir
	if host == "" {
		host = filepath.Join(cfg.transfer.stack.SocketDir, cfg.poolName)
	}
	period := cfg.heartbeat
	if period <= 0 {
		period = 10 * time.Second
	}
	return dra.New(dra.Config{
		NodeName: cfg.detection.nodeName, PoolNamespace: cfg.poolNamespace, PoolName: cfg.poolName,
		HostSocketDir: host, Channels: f.channels, CDIDir: f.cdiDir, PluginDir: f.pluginDir, RegistryDir: f.registryDir,
		Kube: cs, Detect: detect, Period: period, Log: log.WithName("dra"),
	})
}
