// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/fabricxfer/fabricxfer/agent/node"
	"github.com/fabricxfer/fabricxfer/topology/nvml"
)

func runCommand(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts := node.Options{Version: version, Detection: node.DetectionOptions{OpenNVML: nvml.Open}}
	var lf logFlags
	opts.RegisterFlags(fs)
	lf.register(fs)
	if err := fs.Parse(args); err != nil {
		return parseFailed(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent run: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	n, err := node.New(ctx, opts, log)
	if err != nil {
		return err
	}
	log.Info("agent started", "node", opts.Detection.NodeName, "hostRoot", opts.Detection.HostRoot, "heartbeat", opts.Heartbeat, "version", version)
	err = n.Run(ctx)
	log.Info("agent stopped", "node", opts.Detection.NodeName)
	return err
}
