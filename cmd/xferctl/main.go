// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command xferctl inspects and exercises fabricxfer: "status" reads pools, nodes, engines and vPODs from the
// API server; "info", "explain", "register" and "transfer" talk to an agent's socket; "bench" measures the
// socket round trip of small transfers against a direct in-process engine call; "local-agent" runs an agent's
// transfer side outside Kubernetes (demos, benchmarks).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// errUsage means the flag package already printed what was wrong.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"status", "pools, nodes, engines and vPODs from the API server", statusCommand},
		{"info", "what an agent socket says about the node, the pool and the caller", infoCommand},
		{"explain", "which engine would carry a pair of segments, and why not the others", explainCommand},
		{"register", "register shared memory under a segment name and hold it (smoke test)", registerCommand},
		{"transfer", "write (or read) random bytes to a segment and verify them (smoke test)", transferCommand},
		{"bench", "4 KiB transfer round trip through the socket vs a direct engine call: p50/p99", benchCommand},
		{"local-agent", "run an agent's transfer side outside Kubernetes (demo, bench)", localAgentCommand},
	}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: xferctl <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "  version      print the version\n\nxferctl <command> -h shows a command's flags.")
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(stdout, version)
		return 0
	case "-h", "--help", "help":
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		if err := c.run(ctx, args[1:], stdout, stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "xferctl %s: %v\n", c.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "xferctl: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}
