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
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
)

func kubeClient(kubeconfig, kubeContext string) (client.Client, error) {
	var (
		restCfg *rest.Config
		err     error
	)
	switch {
	case kubeconfig != "":
		restCfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{CurrentContext: kubeContext}).ClientConfig()
	case kubeContext != "":
		restCfg, err = config.GetConfigWithContext(kubeContext)
	default:
		restCfg, err = config.GetConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("loading the API server configuration: %w", err)
	}
	scheme, err := statusScheme()
	if err != nil {
		return nil, err
	}
	return client.New(restCfg, client.Options{Scheme: scheme})
}

// statusScheme holds what status reads: the project's objects and the agents' heartbeat Leases.
func statusScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := fxv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default $KUBECONFIG, then in-cluster)")
	kubeContext := fs.String("context", "", "kubeconfig context (default: the current one)")
	namespace := fs.String("n", "", "only pools of this namespace (default: every namespace)")
	output := fs.String("o", "", "output format: json or yaml (default: tables)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	c, err := kubeClient(*kubeconfig, *kubeContext)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return printStatus(ctx, c, *namespace, *output, stdout, time.Now())
}

func condition(conds []metav1.Condition, t string) string {
	for _, c := range conds {
		if c.Type == t {
			if c.Reason != "" {
				return string(c.Status) + " (" + c.Reason + ")"
			}
			return string(c.Status)
		}
	}
	return "-"
}

// statusView is what status shows, in the shape -o json and -o yaml print.
type statusView struct {
	Pools []poolView `json:"pools"`
	Nodes []nodeView `json:"nodes"`
	VPods []vpodView `json:"vpods"`
}

type poolView struct {
	Namespace    string   `json:"namespace"`
	Name         string   `json:"name"`
	Ready        string   `json:"ready"`
	Degraded     string   `json:"degraded"`
	ReadyNodes   int32    `json:"readyNodes"`
	DesiredNodes int32    `json:"desiredNodes"`
	Engines      string   `json:"engines,omitempty"`
	VPods        []string `json:"vpods,omitempty"`
	VPodCount    int32    `json:"vpodCount"` // all of them: VPods names at most 64
	SocketDir    string   `json:"socketDir,omitempty"`
}

type nodeView struct {
	Name string `json:"name"`
	Pool string `json:"pool,omitempty"`
	// Engines are the available engines; Unavailable the others (TransferNode status says why).
	Engines      []string `json:"engines,omitempty"`
	Unavailable  []string `json:"unavailable,omitempty"`
	GPUs         int      `json:"gpus"`
	NICs         int      `json:"nics"`
	Endpoint     string   `json:"endpoint,omitempty"`
	AgentVersion string   `json:"agentVersion,omitempty"`
	// LastHeartbeat is the later of the Lease's renewal and the report's heartbeat; absent when never.
	LastHeartbeat *metav1.Time `json:"lastHeartbeat,omitempty"`
}

type vpodView struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Domain string `json:"domain"`
	Nodes  int32  `json:"nodes"`
	GPUs   int32  `json:"gpus"`
	Ready  string `json:"ready"`
}

// readStatus reads pools (of namespace, or all), reports, heartbeats and domains.
func readStatus(ctx context.Context, c client.Reader, namespace string) (statusView, error) {
	var v statusView
	var pools fxv1.TransferPoolList
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, &pools, opts...); err != nil {
		return v, fmt.Errorf("listing TransferPools: %w", err)
	}
	var nodes fxv1.TransferNodeList
	if err := c.List(ctx, &nodes); err != nil {
		return v, fmt.Errorf("listing TransferNodes: %w", err)
	}
	// Agents heartbeat through Leases; a TransferNode is rewritten only when its report changes.
	beats, err := controllers.ListHeartbeats(ctx, c)
	if err != nil {
		return v, err
	}
	var vpods fxv1.VPodTopologyList
	if err := c.List(ctx, &vpods); err != nil {
		return v, fmt.Errorf("listing VPodTopologies: %w", err)
	}
	v.Pools, v.Nodes, v.VPods = []poolView{}, []nodeView{}, []vpodView{}
	for _, p := range pools.Items {
		v.Pools = append(v.Pools, poolView{Namespace: p.Namespace, Name: p.Name, Ready: condition(p.Status.Conditions, "Ready"),
			Degraded: condition(p.Status.Conditions, "Degraded"), ReadyNodes: p.Status.ReadyNodes, DesiredNodes: p.Status.DesiredNodes,
			Engines: p.Status.EngineSummary, VPods: p.Status.VPods, VPodCount: p.Status.VPodCount, SocketDir: p.Spec.SocketDir})
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	for _, n := range nodes.Items {
		nv := nodeView{Name: n.Name, GPUs: len(n.Status.GPUs), NICs: len(n.Status.NICs), Endpoint: n.Status.Endpoint,
			AgentVersion: n.Status.AgentVersion}
		for _, e := range n.Status.Engines {
			if e.Available {
				nv.Engines = append(nv.Engines, string(e.Name))
			} else {
				nv.Unavailable = append(nv.Unavailable, string(e.Name))
			}
		}
		if at := beats.LastHeartbeat(&n); !at.IsZero() {
			t := metav1.NewTime(at)
			nv.LastHeartbeat = &t
		}
		if n.Spec.PoolName != "" {
			nv.Pool = n.Spec.PoolNamespace + "/" + n.Spec.PoolName
		}
		v.Nodes = append(v.Nodes, nv)
	}
	for _, d := range vpods.Items {
		v.VPods = append(v.VPods, vpodView{Name: d.Name, Kind: string(d.Spec.Kind), Domain: d.Spec.Domain, Nodes: d.Status.Nodes,
			GPUs: d.Status.GPUs, Ready: condition(d.Status.Conditions, "Ready")})
	}
	return v, nil
}

// printStatus prints the status as tables (output ""), json or yaml.
func printStatus(ctx context.Context, c client.Reader, namespace, output string, w io.Writer, now time.Time) error {
	switch output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("-o %q: want json or yaml (or nothing, for tables)", output)
	}
	v, err := readStatus(ctx, c, namespace)
	if err != nil {
		return err
	}
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "yaml":
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "POOLS (%d)\nNAMESPACE\tNAME\tREADY\tNODES\tENGINES\tVPODS\tSOCKET DIR\tDEGRADED\n", len(v.Pools))
	for _, p := range v.Pools {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%d\t%s\t%s\n", p.Namespace, p.Name, p.Ready, p.ReadyNodes, p.DesiredNodes,
			orDash(p.Engines), p.VPodCount, orDash(p.SocketDir), p.Degraded)
	}
	fmt.Fprintf(tw, "\nNODES (%d)\nNAME\tPOOL\tENGINES\tGPUS\tNICS\tENDPOINT\tHEARTBEAT\tAGENT\n", len(v.Nodes))
	for _, n := range v.Nodes {
		engs := slices.Clone(n.Engines)
		for _, e := range n.Unavailable {
			engs = append(engs, "-"+e)
		}
		hb := "never"
		if n.LastHeartbeat != nil {
			hb = now.Sub(n.LastHeartbeat.Time).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", n.Name, orDash(n.Pool), orDash(strings.Join(engs, ",")), n.GPUs,
			n.NICs, orDash(n.Endpoint), hb, orDash(n.AgentVersion))
	}
	fmt.Fprintf(tw, "\nVPODS (%d)\nNAME\tKIND\tDOMAIN\tNODES\tGPUS\tREADY\n", len(v.VPods))
	for _, d := range v.VPods {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", d.Name, d.Kind, d.Domain, d.Nodes, d.GPUs, d.Ready)
	}
	fmt.Fprintln(tw, "\n(engines: -name means detected unavailable; `kubectl get transfernode <name> -o yaml` says why)")
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
