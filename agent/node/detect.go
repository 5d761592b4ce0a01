// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"encoding/json"
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

// PrintOptions say how "agent detect" prints the node.
type PrintOptions struct {
	// JSON prints exactly the TransferNode .status the agent writes; otherwise a table for admins.
	JSON bool
	// Endpoint is the agent-to-agent endpoint put in the JSON status.
	Endpoint string
	// Kubeconfig, when set, reads the VPodTopologies that declare the node's GPUs from that cluster and applies
	// them as the agent does.
	Kubeconfig string
	// Version is the agent's version, printed with the node.
	Version string
}

// PrintDetection detects the node once and writes what it found to w.
func PrintDetection(ctx context.Context, w io.Writer, d DetectionOptions, p PrintOptions) error {
	var declarations func(context.Context) []topology.Declaration
	if p.Kubeconfig != "" {
		decls, err := readDeclarations(ctx, p.Kubeconfig, d.NodeName)
		if err != nil {
			return err
		}
		declarations = func(context.Context) []topology.Declaration { return decls }
	}
	detect, err := d.detector(declarations)
	if err != nil {
		return err
	}
	rep, err := detect(ctx)
	if err != nil {
		return err
	}
	if p.JSON {
		st := nodestatus.FromReport(rep, nodestatus.Identity{AgentVersion: p.Version, Endpoint: p.Endpoint})
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	node := d.NodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	fmt.Fprintf(w, "Node %s (host root %s, agent %s)\n\n", node, d.HostRoot, p.Version)
	return topology.WriteTable(w, rep)
}

// readDeclarations lists the node's declarations once, through the same label selector the agent watches by.
func readDeclarations(ctx context.Context, kubeconfig, node string) ([]topology.Declaration, error) {
	if node == "" {
		return nil, fmt.Errorf("--kubeconfig needs --node-name (or $%s): declarations name nodes", EnvNodeName)
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
