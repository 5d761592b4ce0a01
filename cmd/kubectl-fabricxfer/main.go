// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command kubectl-fabricxfer is xferctl as a kubectl plugin: kubectl runs it for "kubectl fabricxfer ..." when
// it is on PATH. Its own name decides how usage text and completion name it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/fabricxfer/fabricxfer/internal/xferctl"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	os.Exit(xferctl.Run(ctx, xferctl.Program{Name: "kubectl-fabricxfer", Version: version}, os.Args[1:], os.Stdout, os.Stderr))
}
