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

func detectCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent detect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := node.DetectionOptions{OpenNVML: nvml.Open}
	d.RegisterFlags(fs)
	output := fs.String("o", "table", "output format: table or json (json is exactly the TransferNode .status the agent writes)")
	endpoint := fs.String("endpoint", "", "agent-to-agent endpoint host:port to put in the JSON status")
	kubeconfig := fs.String("kubeconfig", "", "also read the VPodTopologies that declare --node-name's GPUs from this cluster, and apply them as the agent does")
	if err := fs.Parse(args); err != nil {
		return parseFailed(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent detect: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "agent detect: -o %q: want table or json\n", *output)
		return errUsage
	}
	return node.PrintDetection(ctx, stdout, d, node.PrintOptions{JSON: *output == "json", Endpoint: *endpoint,
		Kubeconfig: *kubeconfig, Version: version})
}
