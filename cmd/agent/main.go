// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// errUsage means the flag package already printed what was wrong.
var errUsage = errors.New("usage")

// errHelped: a command's flags were listed because -h asked for them, which is no failure.
var errHelped = errors.New("help shown")

// parseFailed is what a command returns when its flags did not parse: errHelped for -h, errUsage otherwise (the
// flag package has printed the error and the flags).
func parseFailed(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return errHelped
	}
	return errUsage
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(runMain(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	var err error
	switch args[0] {
	case "detect":
		err = detectCommand(ctx, args[1:], stdout, stderr)
	case "run":
		err = runCommand(ctx, args[1:], stderr)
	case "standalone":
		err = standaloneCommand(ctx, args[1:], stderr)
	case "certs":
		err = certsCommand(ctx, args[1:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
	case "-h", "--help", "help":
		usage(stdout)
	default:
		fmt.Fprintf(stderr, "agent: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	if err != nil {
		if errors.Is(err, errHelped) {
			return 0
		}
		if errors.Is(err, errUsage) {
			return 2
		}
		fmt.Fprintf(stderr, "agent %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: agent <command> [flags]

commands:
  detect      detect GPUs, peer links, fabric domains and RDMA NICs; print the node report
  run         detect and keep the node's TransferNode current until SIGTERM
  standalone  serve the socket on this machine without Kubernetes (every local process admitted)
  certs       write a pool's agent certificates for agents run without Kubernetes (standalone --tls-dir)
  version     print the agent version

"agent <command> -h" lists a command's flags.
`)
}
