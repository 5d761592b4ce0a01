// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Command drakubelet stands in for the kubelet in the demo (no kubelet runs there): it waits until the
// scheduler bound a pod, prepares the pod's ResourceClaims on the bound node's DRA plugin and runs a command
// with the claims' CDI edits (FABRICXFER_SOCKET) applied, paths mapped to the host.
//
//	drakubelet -kubeconfig K -pod default/decode -node gpu-node-a=PLUGIN_SOCKET,CDI_DIR ... -- xferctl transfer ...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fabricxfer/fabricxfer/hack/internal/drakubelet"
)

type nodeFlags map[string]drakubelet.Node

func (n nodeFlags) String() string { return fmt.Sprint(map[string]drakubelet.Node(n)) }
func (n nodeFlags) Set(v string) error {
	name, rest, ok := strings.Cut(v, "=")
	sock, cdi, ok2 := strings.Cut(rest, ",")
	if !ok || !ok2 {
		return fmt.Errorf("want NODE=PLUGIN_SOCKET,CDI_DIR, got %q", v)
	}
	n[name] = drakubelet.Node{PluginSocket: sock, CDIDir: cdi}
	return nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	pod := flag.String("pod", "", "namespace/name of the pod")
	timeout := flag.Duration("timeout", time.Minute, "how long to wait for the pod to be bound and prepared")
	nodes := nodeFlags{}
	flag.Var(nodes, "node", "NODE=PLUGIN_SOCKET,CDI_DIR (repeat per node)")
	flag.Parse()
	ns, name, ok := strings.Cut(*pod, "/")
	if !ok || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: drakubelet -kubeconfig K -pod NS/NAME -node N=SOCK,CDI ... -- COMMAND ...")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drakubelet:", err)
		os.Exit(1)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "drakubelet:", err)
		os.Exit(1)
	}
	err = drakubelet.Run(context.Background(), drakubelet.Options{Kube: cs, Namespace: ns, Pod: name, Nodes: nodes,
		Command: flag.Args(), Stdout: os.Stdout, Stderr: os.Stderr, Timeout: *timeout})
	if err != nil {
		fmt.Fprintln(os.Stderr, "drakubelet:", err)
		os.Exit(1)
	}
}
