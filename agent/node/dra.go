// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fabricxfer/fabricxfer/agent/dra"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
)

// draDriver builds the DRA driver from the agent's options.
func draDriver(opts Options, restCfg *rest.Config, policy identity.NamespacePolicy, detect detectFunc, kick <-chan struct{}, log logr.Logger) (*dra.Driver, error) {
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("creating the DRA driver's Kubernetes client: %w", err)
	}
	f := opts.DRA
	host := f.HostSocketDir
	if host == "" {
		host = filepath.Join(opts.Transfer.SocketDir, opts.PoolName)
	}
	period := opts.Heartbeat
	if period <= 0 {
		period = 10 * time.Second
	}
	return dra.New(dra.Config{
		NodeName: opts.Detection.NodeName, PoolNamespace: opts.PoolNamespace, PoolName: opts.PoolName,
		HostSocketDir: host, Channels: f.Channels, CDIDir: f.CDIDir, PluginDir: f.PluginDir, RegistryDir: f.RegistryDir,
		Kube: cs, Detect: detect, Period: period, Kick: kick, Log: log.WithName("dra"),
		AdmitNamespace: func(ctx context.Context, namespace string) error {
			return identity.Admit(ctx, policy, opts.PoolNamespace, opts.PoolName, namespace)
		},
	})
}
