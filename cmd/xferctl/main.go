// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command xferctl inspects and exercises fabricxfer (package internal/xferctl); cmd/kubectl-fabricxfer is the
// same program installed as a kubectl plugin.
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
	os.Exit(xferctl.Run(ctx, xferctl.Program{Name: "xferctl", Version: version}, os.Args[1:], os.Stdout, os.Stderr))
}
