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

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	"github.com/fabricxfer/fabricxfer/agent/nodesync"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

func detectCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("agent detect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var d detectionFlags
	d.register(fs)
	output := fs.String("o", "table", "output format: table or json (json is exactly the TransferNode .status the agent writes)")
	endpoint := fs.String("endpoint", "", "agent-to-agent endpoint host:port to put in the JSON status")
	kubeconfig := fs.String("kubeconfig", "", "also read the VPodTopologies that declare --node-name's GPUs from this cluster, and apply them as the agent does")
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
	if *kubeconfig != "" {
		decls, err := readDeclarations(ctx, *kubeconfig, d.nodeName)
		if err != nil {
			return err
		}
		d.declarations = func(context.Context) []topology.Declaration { return decls }
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
		st := nodestatus.FromReport(rep, nodestatus.Identity{AgentVersion: version, Endpoint: *endpoint})
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

// readDeclarations lists the node's declarations once, through the same label selector the agent watches by.
func readDeclarations(ctx context.Context, kubeconfig, node string) ([]topology.Declaration, error) {
	if node == "" {
		return nil, fmt.Errorf("--kubeconfig needs --node-name (or $%s): declarations name nodes", envNodeName)
	}
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating Kubernetes client: %w", err)
	}
	return nodesync.ListDeclarations(ctx, c, node)
}
