// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
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

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/controllers"
)

func kubeClient(kubeconfig string) (client.Client, error) {
	var (
		restCfg *rest.Config
		err     error
	)
	if kubeconfig != "" {
		restCfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
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
	namespace := fs.String("n", "", "only pools of this namespace")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	c, err := kubeClient(*kubeconfig)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return printStatus(ctx, c, *namespace, stdout, time.Now())
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

func printStatus(ctx context.Context, c client.Reader, namespace string, w io.Writer, now time.Time) error {
	var pools fxv1.TransferPoolList
	var opts []client.ListOption
	if namespace != "" {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, &pools, opts...); err != nil {
		return fmt.Errorf("listing TransferPools: %w", err)
	}
	var nodes fxv1.TransferNodeList
	if err := c.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing TransferNodes: %w", err)
	}
	// Agents heartbeat through Leases; a TransferNode is rewritten only when its report changes.
	beats, err := controllers.ListHeartbeats(ctx, c)
	if err != nil {
		return err
	}
	var vpods fxv1.VPodTopologyList
	if err := c.List(ctx, &vpods); err != nil {
		return fmt.Errorf("listing VPodTopologies: %w", err)
	}

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "POOLS (%d)\nNAMESPACE\tNAME\tREADY\tNODES\tENGINES\tVPODS\tSOCKET DIR\tDEGRADED\n", len(pools.Items))
	for _, p := range pools.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%d\t%s\t%s\n", p.Namespace, p.Name, condition(p.Status.Conditions, "Ready"),
			p.Status.ReadyNodes, p.Status.DesiredNodes, orDash(p.Status.EngineSummary), len(p.Status.VPods),
			orDash(p.Spec.SocketDir), condition(p.Status.Conditions, "Degraded"))
	}
	sort.Slice(nodes.Items, func(i, j int) bool { return nodes.Items[i].Name < nodes.Items[j].Name })
	fmt.Fprintf(tw, "\nNODES (%d)\nNAME\tPOOL\tENGINES\tGPUS\tNICS\tENDPOINT\tHEARTBEAT\tAGENT\n", len(nodes.Items))
	for _, n := range nodes.Items {
		var engs []string
		for _, e := range n.Status.Engines {
			if e.Available {
				engs = append(engs, string(e.Name))
			} else {
				engs = append(engs, "-"+string(e.Name))
			}
		}
		hb := "never"
		if at := beats.LastHeartbeat(&n); !at.IsZero() {
			hb = now.Sub(at).Round(time.Second).String() + " ago"
		}
		pool := "-"
		if n.Spec.PoolName != "" {
			pool = n.Spec.PoolNamespace + "/" + n.Spec.PoolName
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", n.Name, pool, orDash(strings.Join(engs, ",")), len(n.Status.GPUs),
			len(n.Status.NICs), orDash(n.Status.Endpoint), hb, orDash(n.Status.AgentVersion))
	}
	fmt.Fprintf(tw, "\nVPODS (%d)\nNAME\tKIND\tDOMAIN\tNODES\tGPUS\tREADY\n", len(vpods.Items))
	for _, v := range vpods.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", v.Name, v.Spec.Kind, v.Spec.Domain, v.Status.Nodes, v.Status.GPUs,
			condition(v.Status.Conditions, "Ready"))
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
