// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/internal/heartbeat"
)

// kubeClient connects as kubectl would with the same flags (kubeconfig, --context, --server, ...).
func kubeClient(kube genericclioptions.RESTClientGetter) (client.Client, error) {
	restCfg, err := kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the API server configuration: %w", err)
	}
	scheme, err := statusScheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("connecting to the API server: %w", err)
	}
	return c, nil
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

// outputFormats are status's -o values besides the default tables.
func outputFormats() []string { return []string{"json", "yaml", "wide", "name"} }

func checkOutput(output string) error {
	if output == "" || slices.Contains(outputFormats(), output) {
		return nil
	}
	return fmt.Errorf("--output %q: want one of %s (or none, for tables)", output, strings.Join(outputFormats(), ", "))
}

// statusOptions are status's flags: kubectl's connection flags (genericclioptions) plus -A and -o.
type statusOptions struct {
	kube          *genericclioptions.ConfigFlags
	allNamespaces bool
	output        string
}

func newStatusFlags(stderr io.Writer) (*pflag.FlagSet, *statusOptions) {
	o := &statusOptions{kube: genericclioptions.NewConfigFlags(true)}
	fs := pflag.NewFlagSet("status", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	o.kube.AddFlags(fs)
	fs.BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "pools of every namespace (default: the -n namespace, else the kubeconfig context's)")
	fs.StringVarP(&o.output, "output", "o", "", "output format: "+strings.Join(outputFormats(), ", ")+" (default: tables)")
	return fs, o
}

// namespace is the namespace whose pools status shows, "" for all of them, as kubectl get decides it.
func (o *statusOptions) namespace() (string, error) {
	if o.allNamespaces {
		return "", nil
	}
	if o.kube.Namespace != nil && *o.kube.Namespace != "" {
		return *o.kube.Namespace, nil
	}
	ns, _, err := o.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("reading the namespace of the kubeconfig context: %w", err)
	}
	return ns, nil
}

func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, o := newStatusFlags(stderr)
	if err := parsePFlags(ctx, fs, args); err != nil {
		if !errors.Is(err, pflag.ErrHelp) && !errors.Is(err, errFlagsCollected) {
			fmt.Fprintf(stderr, "status: %v\n", err) // pflag, unlike flag, does not print it
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "status: unexpected arguments %q\n", fs.Args())
		return errUsage
	}
	if err := checkOutput(o.output); err != nil {
		fmt.Fprintf(stderr, "status: %v\n", err)
		return errUsage
	}
	ns, err := o.namespace()
	if err != nil {
		return err
	}
	c, err := kubeClient(o.kube)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return printStatus(ctx, c, ns, o.output, stdout, time.Now())
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

// statusView is what status shows, in the shape -o json and -o yaml print. It is a runtime.Object of its own
// kind (not an API server's) so that cli-runtime's printers print it.
type statusView struct {
	metav1.TypeMeta `json:",inline"`
	Pools           []poolView `json:"pools"`
	Nodes           []nodeView `json:"nodes"`
	VPods           []vpodView `json:"vpods"`
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
	// Engines are the engines the node's agent runs (available ones, for an agent that does not say);
	// Unavailable the others (TransferNode status says why).
	Engines     []string `json:"engines,omitempty"`
	Unavailable []string `json:"unavailable,omitempty"`
	// UnavailableReasons says, per unavailable engine, why (-o wide shows it).
	UnavailableReasons map[string]string `json:"unavailableReasons,omitempty"`
	GPUs               int               `json:"gpus"`
	NICs               int               `json:"nics"`
	Endpoint           string            `json:"endpoint,omitempty"`
	AgentVersion       string            `json:"agentVersion,omitempty"`
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
	v := statusView{TypeMeta: metav1.TypeMeta{APIVersion: statusAPIVersion, Kind: "Status"}}
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
	beats, err := heartbeat.List(ctx, c)
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
			if e.Runs() {
				nv.Engines = append(nv.Engines, string(e.Name))
				continue
			}
			nv.Unavailable = append(nv.Unavailable, string(e.Name))
			why := e.Reason
			if e.Available { // detection allows it; the agent does not run it
				why = e.RunningReason
				if !strings.Contains(why, "not running") {
					why = "not running: " + why
				}
			}
			if why != "" {
				if nv.UnavailableReasons == nil {
					nv.UnavailableReasons = map[string]string{}
				}
				nv.UnavailableReasons[string(e.Name)] = why
			}
		}
		if at := beats.Last(&n); !at.IsZero() {
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

// statusAPIVersion marks -o json and -o yaml output as xferctl's own shape, which no API server serves.
const statusAPIVersion = "xferctl.fabricxfer.io/v1"

// DeepCopyObject makes statusView a runtime.Object.
func (v *statusView) DeepCopyObject() runtime.Object {
	c := *v
	c.Pools = slices.Clone(v.Pools)
	for i := range c.Pools {
		c.Pools[i].VPods = slices.Clone(c.Pools[i].VPods)
	}
	c.Nodes = slices.Clone(v.Nodes)
	for i := range c.Nodes {
		n := &c.Nodes[i]
		n.Engines, n.Unavailable, n.UnavailableReasons = slices.Clone(n.Engines), slices.Clone(n.Unavailable), maps.Clone(n.UnavailableReasons)
		if n.LastHeartbeat != nil {
			n.LastHeartbeat = n.LastHeartbeat.DeepCopy()
		}
	}
	c.VPods = slices.Clone(v.VPods)
	return &c
}

// printStatus prints the status of the pools of namespace ("": all) with cli-runtime's printers: tables
// (output "" or "wide", which adds columns), json, yaml, or name (kind.group/name of each object shown).
func printStatus(ctx context.Context, c client.Reader, namespace, output string, w io.Writer, now time.Time) error {
	if err := checkOutput(output); err != nil {
		return err
	}
	v, err := readStatus(ctx, c, namespace)
	if err != nil {
		return err
	}
	switch output {
	case "json":
		return (&printers.JSONPrinter{}).PrintObj(&v, w)
	case "yaml":
		return (&printers.YAMLPrinter{}).PrintObj(&v, w)
	case "name":
		return printNames(v, w)
	}
	return printTables(v, output == "wide", w, now)
}

func printNames(v statusView, w io.Writer) error {
	p := &printers.NamePrinter{}
	obj := func(kind, namespace, name string) *metav1.PartialObjectMetadata {
		return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: fxv1.GroupVersion.String(), Kind: kind},
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	}
	for _, pl := range v.Pools {
		if err := p.PrintObj(obj("TransferPool", pl.Namespace, pl.Name), w); err != nil {
			return err
		}
	}
	for _, n := range v.Nodes {
		if err := p.PrintObj(obj("TransferNode", "", n.Name), w); err != nil {
			return err
		}
	}
	for _, d := range v.VPods {
		if err := p.PrintObj(obj("VPodTopology", "", d.Name), w); err != nil {
			return err
		}
	}
	return nil
}

// printTables prints pools, nodes and vPODs as kubectl prints tables; columns of priority 1 only with wide.
func printTables(v statusView, wide bool, w io.Writer, now time.Time) error {
	col := func(name, typ string, priority int32) metav1.TableColumnDefinition {
		return metav1.TableColumnDefinition{Name: name, Type: typ, Priority: priority}
	}
	tp := printers.NewTablePrinter(printers.PrintOptions{Wide: wide})

	// Per pool, how many of its nodes run each engine: which transfers the pool can carry where.
	engineNodes := map[string]map[string]int{}
	for _, n := range v.Nodes {
		if n.Pool == "" {
			continue
		}
		if engineNodes[n.Pool] == nil {
			engineNodes[n.Pool] = map[string]int{}
		}
		for _, e := range n.Engines {
			engineNodes[n.Pool][e]++
		}
		for _, e := range n.Unavailable {
			engineNodes[n.Pool][e] += 0
		}
	}
	pools := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		col("Namespace", "string", 0), col("Name", "string", 0), col("Ready", "string", 0), col("Nodes", "string", 0),
		col("Engines", "string", 0), col("VPods", "integer", 0), col("Socket Dir", "string", 0), col("Degraded", "string", 0),
		col("Nodes Per Engine", "string", 1), col("VPod Names", "string", 1)}}
	for _, p := range v.Pools {
		var perEngine []string
		for _, e := range slices.Sorted(maps.Keys(engineNodes[p.Namespace+"/"+p.Name])) {
			perEngine = append(perEngine, fmt.Sprintf("%s=%d", e, engineNodes[p.Namespace+"/"+p.Name][e]))
		}
		pools.Rows = append(pools.Rows, metav1.TableRow{Cells: []any{p.Namespace, p.Name, p.Ready,
			fmt.Sprintf("%d/%d", p.ReadyNodes, p.DesiredNodes), orDash(p.Engines), p.VPodCount, orDash(p.SocketDir), p.Degraded,
			orDash(strings.Join(perEngine, ",")), orDash(strings.Join(p.VPods, ","))}})
	}
	nodes := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		col("Name", "string", 0), col("Pool", "string", 0), col("Engines", "string", 0), col("GPUs", "integer", 0),
		col("NICs", "integer", 0), col("Endpoint", "string", 0), col("Heartbeat", "string", 0), col("Agent", "string", 0),
		col("Unavailable Because", "string", 1)}}
	for _, n := range v.Nodes {
		engs := slices.Clone(n.Engines)
		var why []string
		for _, e := range n.Unavailable {
			engs = append(engs, "-"+e)
			if r := n.UnavailableReasons[e]; r != "" {
				why = append(why, e+": "+r)
			}
		}
		hb := "never"
		if n.LastHeartbeat != nil {
			hb = now.Sub(n.LastHeartbeat.Time).Round(time.Second).String() + " ago"
		}
		nodes.Rows = append(nodes.Rows, metav1.TableRow{Cells: []any{n.Name, orDash(n.Pool), orDash(strings.Join(engs, ",")),
			n.GPUs, n.NICs, orDash(n.Endpoint), hb, orDash(n.AgentVersion), orDash(strings.Join(why, "; "))}})
	}
	vpods := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		col("Name", "string", 0), col("Kind", "string", 0), col("Domain", "string", 0), col("Nodes", "integer", 0),
		col("GPUs", "integer", 0), col("Ready", "string", 0)}}
	for _, d := range v.VPods {
		vpods.Rows = append(vpods.Rows, metav1.TableRow{Cells: []any{d.Name, d.Kind, d.Domain, d.Nodes, d.GPUs, d.Ready}})
	}
	for i, t := range []struct {
		title string
		table *metav1.Table
	}{{"POOLS", pools}, {"NODES", nodes}, {"VPODS", vpods}} {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s (%d)\n", t.title, len(t.table.Rows))
		if err := tp.PrintObj(t.table, w); err != nil {
			return fmt.Errorf("printing %s: %w", strings.ToLower(t.title), err)
		}
	}
	note := "(engines: -name means the node's agent does not run it; `kubectl get transfernode <name> -o yaml` says why)"
	if wide {
		note = "(engines: -name means the node's agent does not run it, for the reason under UNAVAILABLE BECAUSE)"
	}
	_, err := fmt.Fprintln(w, "\n"+note)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
