// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/fabricxfer/fabricxfer/agent/report"
	"github.com/fabricxfer/fabricxfer/topology"
)

func detectCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent detect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var d detectionFlags
	d.register(fs)
	output := fs.String("o", "table", "output format: table or json (json is exactly the TransferNode .status the agent writes)")
	endpoint := fs.String("endpoint", "", "agent-to-agent endpoint host:port to put in the JSON status")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "agent detect: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "agent detect: -o %q: want table or json\n", *output)
		return errUsage
	}
	detect, err := d.detector()
	if err != nil {
		return err
	}
	rep, err := detect(ctx)
	if err != nil {
		return err
	}
	if *output == "json" {
		st := report.Status(rep, report.Identity{AgentVersion: version, Endpoint: *endpoint})
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	node := d.nodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	fmt.Fprintf(stdout, "Node %s (host root %s, agent %s)\n\n", node, d.hostRoot, version)
	return topology.WriteTable(stdout, rep)
}
