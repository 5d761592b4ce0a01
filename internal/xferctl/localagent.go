// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/fabricxfer/fabricxfer/agent/server"
	"github.com/fabricxfer/fabricxfer/agent/node"
)

func localAgentCommand(ctx context.Context, version string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("local-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg node.Config
	cfg.RegisterFlags(fs)
	fs.StringVar(&cfg.PoolNamespace, "pool-namespace", "default", "namespace of the pool this agent serves")
	fs.StringVar(&cfg.PoolName, "pool", "default", "name of the pool this agent serves (the socket is <socket dir>/<pool>/agent.sock)")
	fs.StringVar(&cfg.PeerAdvertise, "peer-advertise", "", "address peers dial for the agent-to-agent channel (default: the listen address)")
	fs.StringVar(&cfg.NodeName, "node-name", hostname(), "node name this agent reports")
	fs.StringVar(&cfg.HostRoot, "host-root", "/", "where the host's / is (callers' cgroups are read from <host-root>/proc)")
	verbose := fs.Bool("v", false, "log connections and errors to stderr")
	_ = fs.Set("tls-dir", "") // alone unless given the pool's certificates
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	cfg.AllowLocal = true // there is no API server to identify pods with
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	return node.Run(ctx, cfg, node.Deps{AgentVersion: version, Logger: log,
		Engines: []server.EngineStatus{{Name: "xgmi", Available: true, Reason: "host backend only (local agent)"}},
		Ready: func(peer string) {
			fmt.Fprintf(stdout, "ready: socket %s/%s/agent.sock", cfg.SocketDir, cfg.PoolName)
			if peer != "" {
				fmt.Fprintf(stdout, ", peers at %s", peer)
			}
			fmt.Fprintln(stdout)
		}})
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
