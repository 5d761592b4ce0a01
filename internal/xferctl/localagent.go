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

	"github.com/fabricxfer/fabricxfer/agent/node"
	"github.com/fabricxfer/fabricxfer/topology"
)

func localAgentCommand(ctx context.Context, version string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("local-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var opts node.TransferOptions
	opts.Config.RegisterFlags(fs) // the socket and peer flags only: no detection, GPU runtime or health port here
	cfg := &opts.Config
	fs.StringVar(&cfg.PoolNamespace, "pool-namespace", "default", "namespace of the pool this agent serves")
	fs.StringVar(&cfg.PoolName, "pool-name", "kv", "name of the pool this agent serves (the socket is <socket dir>/<pool>/agent.sock), as agent standalone's")
	fs.StringVar(&cfg.PoolName, "pool", "kv", "the same as --pool-name")
	fs.StringVar(&cfg.PeerAdvertise, "peer-advertise", "", "address peers dial for the agent-to-agent channel (default: the listen address)")
	fs.StringVar(&cfg.NodeName, "node-name", hostname(), "node name this agent reports")
	fs.StringVar(&cfg.HostRoot, "host-root", "/", "where the host's / is (callers' cgroups are read from <host-root>/proc)")
	verbose := fs.Bool("v", false, "log connections and errors to stderr")
	_ = fs.Set("tls-dir", "") // alone unless given the pool's certificates
	fs.Lookup("tls-dir").DefValue = ""
	if err := parseFlags(ctx, fs, args); err != nil {
		return errUsage
	}
	cfg.AllowLocal = true // there is no API server to identify pods with
	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	// The local agent detects nothing and loads no GPU runtime: the report lists the same-node engine alone.
	opts.NoGPU = true
	rep := topology.Report{Engines: []topology.Engine{{Name: "xgmi", Available: true, Reason: "host backend only (local agent)"}}}
	return node.Serve(ctx, opts, rep, node.Deps{AgentVersion: version, Logger: log,
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
