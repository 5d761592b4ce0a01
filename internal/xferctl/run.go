// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package xferctl is the xferctl command line, also installed as the kubectl plugin kubectl-fabricxfer:
// "status" reads pools, nodes, engines and vPODs from the API server; "info", "explain", "register" and
// "transfer" talk to an agent's socket; "bench" measures the socket round trip of small transfers against a
// direct in-process engine call; "local-agent" runs an agent's transfer side outside Kubernetes (demos,
// benchmarks); "completion" prints a shell completion script.
package xferctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Program says which binary runs: its file name decides how usage text and completion name it.
type Program struct {
	Name    string // the executable's name: "xferctl" or "kubectl-fabricxfer"
	Version string
}

// displayName is how a user types the program: kubectl runs the plugin kubectl-foo_bar as "kubectl foo-bar".
func (p Program) displayName() string {
	if rest, ok := strings.CutPrefix(p.Name, "kubectl-"); ok {
		return "kubectl " + strings.ReplaceAll(strings.ReplaceAll(rest, "-", " "), "_", "-")
	}
	return p.Name
}

// errUsage means the flag package already printed what was wrong.
var errUsage = errors.New("usage")

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands(p Program) []command {
	return []command{
		{"status", "pools, nodes, engines and vPODs from the API server", statusCommand},
		{"info", "what an agent socket says about the node, the pool and the caller", infoCommand},
		{"explain", "which engine would carry a pair of segments, and why not the others", explainCommand},
		{"register", "register shared memory under a segment name and hold it (smoke test)", registerCommand},
		{"transfer", "write (or read) random bytes to a segment and verify them (smoke test)", transferCommand},
		{"bench", "4 KiB transfer round trip through the socket vs a direct engine call: p50/p99", benchCommand},
		{"local-agent", "run an agent's transfer side outside Kubernetes (demo, bench)", func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return localAgentCommand(ctx, p.Version, args, stdout, stderr)
		}},
	}
}

func usage(p Program, w io.Writer) {
	name := p.displayName()
	fmt.Fprintf(w, "usage: %s <command> [flags]\n\ncommands:\n", name)
	for _, c := range commands(p) {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-12s %s\n", "completion", "print a shell completion script: completion bash|zsh|fish")
	fmt.Fprintf(w, "  %-12s %s\n\n%s <command> -h shows a command's flags.\n", "version", "print the version", name)
}

// Run runs the command line args (without the program name) and returns the exit status: 0, 1 when the
// command failed, 2 for a usage error.
func Run(ctx context.Context, p Program, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(p, stderr)
		return 2
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(stdout, p.Version)
		return 0
	case "-h", "--help", "help":
		usage(p, stdout)
		return 0
	case "completion", completeRequest, completeRequestNoDesc:
		return runCompletion(ctx, p, args, stdout, stderr)
	}
	for _, c := range commands(p) {
		if c.name != args[0] {
			continue
		}
		if err := c.run(ctx, args[1:], stdout, stderr); err != nil {
			if errors.Is(err, errUsage) {
				return 2
			}
			fmt.Fprintf(stderr, "%s %s: %v\n", p.displayName(), c.name, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "%s: unknown command %q\n", p.displayName(), args[0])
	usage(p, stderr)
	return 2
}
