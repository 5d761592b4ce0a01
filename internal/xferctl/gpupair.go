// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
)

// gpuRef is node/index.
type gpuRef struct {
	node  string
	index int
}

func parseGPURef(s string) (gpuRef, error) {
	node, idx, ok := strings.Cut(s, "/")
	i, err := strconv.Atoi(idx)
	if !ok || node == "" || err != nil || i < 0 || i > 1023 {
		return gpuRef{}, fmt.Errorf("GPU reference %q: want node/index, index 0-1023", s)
	}
	return gpuRef{node: node, index: i}, nil
}

// explainGPUs says which engine carries fabric-exportable GPU memory between two GPUs, from their nodes'
// TransferNodes: the rule the agents' composite applies to such memory (xgmi on one node, then fabric.Claims,
// then rdma where both nodes run it; tcp does not carry GPU memory yet), with where each GPU's fabric domain
// came from and the declaration that decided.
func explainGPUs(ctx context.Context, kubeconfig, from, to string, stdout io.Writer) error {
	src, err := parseGPURef(from)
	if err != nil {
		return fmt.Errorf("--from-gpu: %w", err)
	}
	dst, err := parseGPURef(to)
	if err != nil {
		return fmt.Errorf("--to-gpu: %w", err)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	restCfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	if err != nil {
		return fmt.Errorf("loading the API server configuration: %w", err)
	}
	scheme, err := statusScheme()
	if err != nil {
		return err
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the API server: %w", err)
	}
	return writeGPURoute(ctx, c, src, dst, from, to, stdout)
}

func writeGPURoute(ctx context.Context, c client.Reader, src, dst gpuRef, from, to string, stdout io.Writer) error {
	var tns [2]fxv1.TransferNode
	var descs [2]engines.MemoryDesc
	for i, ref := range []gpuRef{src, dst} {
		if err := c.Get(ctx, client.ObjectKey{Name: ref.node}, &tns[i]); err != nil {
			return fmt.Errorf("reading the TransferNode of %s: %w", ref.node, err)
		}
		if ref.index >= len(tns[i].Status.GPUs) {
			return fmt.Errorf("node %s reports %d GPUs, no GPU %d", ref.node, len(tns[i].Status.GPUs), ref.index)
		}
		g := tns[i].Status.GPUs[ref.index]
		descs[i] = engines.MemoryDesc{ID: engines.MemoryID(fmt.Sprintf("%s/gpu%d", ref.node, ref.index)), Node: ref.node, Size: 1,
			Location: engines.Location{Kind: engines.LocationGPU, Device: ref.index}, Handles: engines.Handles{Fabric: &engines.FabricHandle{}}}
		if g.Fabric != nil {
			descs[i].FabricDomain = g.Fabric.Domain
		}
	}
	type verdict struct {
		engine string
		yes    bool
		why    string
	}
	var verdicts []verdict
	available := func(tn *fxv1.TransferNode, e fxv1.EngineName) (bool, string) {
		for _, a := range tn.Status.Engines {
			if a.Name == e {
				return a.Available, a.Reason
			}
		}
		return false, "not reported"
	}
	both := func(e fxv1.EngineName) (bool, string) {
		for i := range tns {
			if ok, why := available(&tns[i], e); !ok {
				return false, fmt.Sprintf("not available on %s: %s", tns[i].Name, why)
			}
		}
		return true, ""
	}
	if src.node == dst.node {
		verdicts = append(verdicts, verdict{"xgmi", true, "both GPUs on node " + src.node})
	} else {
		verdicts = append(verdicts, verdict{"xgmi", false, "GPUs on two nodes"})
		ok, why := fabric.Claims(src.node, &descs[0], &descs[1])
		if ok {
			if up, whyNot := both(fxv1.EngineFabric); !up {
				ok, why = false, "same fabric domain, but the fabric engine is "+whyNot
			} else {
				why = "same fabric domain " + descs[0].FabricDomain + ", " + decidedBy(&tns[0], src.index, &tns[1], dst.index)
			}
		}
		verdicts = append(verdicts, verdict{"fabric", ok, why})
		if !ok {
			up, whyNot := both(fxv1.EngineRDMA)
			if up {
				whyNot = "both nodes report rdma available"
			}
			verdicts = append(verdicts, verdict{"rdma", up, whyNot})
			if !up {
				verdicts = append(verdicts, verdict{"tcp", false, "tcp does not carry GPU memory yet"})
			}
		}
	}
	chosen := ""
	for _, v := range verdicts {
		if v.yes {
			chosen = v.engine
		}
	}
	if chosen == "" {
		chosen = "no engine"
	}
	fmt.Fprintf(stdout, "%s -> %s: %s (GPU memory with a fabric handle, from the nodes' TransferNodes)\n", from, to, chosen)
	for i, ref := range []gpuRef{src, dst} {
		fmt.Fprintf(stdout, "  %s GPU %d: %s\n", ref.node, ref.index, domainFact(tns[i].Status.GPUs[ref.index].Fabric))
	}
	for _, v := range verdicts {
		mark := "no "
		if v.yes {
			mark = "yes"
		}
		fmt.Fprintf(stdout, "  %-9s %s  %s\n", v.engine, mark, v.why)
	}
	return nil
}

// domainFact is a GPU's fabric domain and where it came from.
func domainFact(f *fxv1.FabricMembership) string {
	if f == nil {
		return "in no fabric domain"
	}
	switch f.Source {
	case fxv1.FabricDeclared:
		return fmt.Sprintf("%s, declared by VPodTopology %s", f.Domain, f.Declaration)
	case fxv1.FabricOverride:
		return f.Domain + ", pinned by the pool's fabricDomainOverride"
	}
	return f.Domain + ", reported by the hardware"
}

// decidedBy names what put both GPUs in their common domain.
func decidedBy(a *fxv1.TransferNode, ai int, b *fxv1.TransferNode, bi int) string {
	fa, fb := a.Status.GPUs[ai].Fabric, b.Status.GPUs[bi].Fabric
	if fa.Source == fxv1.FabricDeclared && fb.Source == fxv1.FabricDeclared && fa.Declaration == fb.Declaration {
		return "decided by VPodTopology " + fa.Declaration
	}
	return "decided by: " + domainFact(fa) + " / " + domainFact(fb)
}
