// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xferctl

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

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
// then rdma, then tcp where both nodes stage GPU memory: each where both nodes' agents run it), with where each GPU's fabric domain
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
	var verdicts []verdict
	// runs says whether a node's agent runs an engine, and why not: what its report says it runs, or what
	// detection found for an agent that does not say.
	runs := func(tn *fxv1.TransferNode, e fxv1.EngineName) (bool, string) {
		a := engineOf(tn, e)
		switch {
		case a == nil:
			return false, "not reported by " + tn.Name
		case !a.Available && !a.Runs():
			return false, "not available on " + tn.Name + ": " + a.Reason
		case !a.Runs():
			return false, "not running on " + tn.Name + ": " + a.RunningReason
		}
		return true, a.RunningReason
	}
	// detected says whether detection allows an engine on both nodes: the engine the pair would take once both
	// agents run it.
	detected := func(e fxv1.EngineName) bool {
		for i := range tns {
			if a := engineOf(&tns[i], e); a == nil || !a.Available {
				return false
			}
		}
		return true
	}
	wouldBe := ""
	both := func(e fxv1.EngineName) (bool, string) {
		for i := range tns {
			if ok, why := runs(&tns[i], e); !ok {
				return false, why
			}
		}
		return true, ""
	}
	if src.node == dst.node {
		up, whyNot := both(fxv1.EngineXGMI)
		if x := engineOf(&tns[0], fxv1.EngineXGMI); up && x.GPUMemory != nil && !*x.GPUMemory {
			up, whyNot = false, "the same-node engine on "+src.node+" copies host memory only: "+x.RunningReason
		} else if up {
			whyNot = "both GPUs on node " + src.node
		}
		verdicts = append(verdicts, verdict{"xgmi", up, whyNot})
	} else {
		verdicts = append(verdicts, verdict{"xgmi", false, "GPUs on two nodes"})
		ok, why := fabric.Claims(src.node, &descs[0], &descs[1])
		if ok {
			why = "same fabric domain " + descs[0].FabricDomain + ", " + decidedBy(&tns[0], src.index, &tns[1], dst.index)
			if up, whyNot := both(fxv1.EngineFabric); !up {
				ok, why = false, why+", but the fabric engine is "+whyNot
				if detected(fxv1.EngineFabric) {
					wouldBe = "fabric"
				}
			}
		}
		verdicts = append(verdicts, verdict{"fabric", ok, why})
		if !ok {
			up, whyNot := both(fxv1.EngineRDMA)
			if up {
				whyNot = "both nodes run rdma"
			} else if wouldBe == "" && detected(fxv1.EngineRDMA) {
				wouldBe = "rdma"
			}
			verdicts = append(verdicts, verdict{"rdma", up, whyNot})
			if !up {
				verdicts = append(verdicts, tcpVerdict(&tns, runs))
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
		if wouldBe != "" {
			chosen += " running, " + wouldBe + " once both agents run it"
		}
	}
	fmt.Fprintf(stdout, "%s -> %s: %s (GPU memory with a fabric handle, from the nodes' TransferNodes)\n", from, to, chosen)
	for i, ref := range []gpuRef{src, dst} {
		fmt.Fprintf(stdout, "  %s GPU %d: %s\n", ref.node, ref.index, printable(domainFact(tns[i].Status.GPUs[ref.index].Fabric)))
	}
	for _, v := range verdicts {
		mark := "no "
		if v.yes {
			mark = "yes"
		}
		fmt.Fprintf(stdout, "  %-9s %s  %s\n", v.engine, mark, printable(v.why))
	}
	return nil
}

// tcpVerdict says whether tcp carries GPU memory between the two nodes: where both agents run it and stage
// their GPU memory through pinned host memory (their tcp status says so).
func tcpVerdict(tns *[2]fxv1.TransferNode, runs func(*fxv1.TransferNode, fxv1.EngineName) (bool, string)) verdict {
	for i := range tns {
		up, how := runs(&tns[i], fxv1.EngineTCP)
		if !up {
			return verdict{"tcp", false, how}
		}
		switch staged := engineOf(&tns[i], fxv1.EngineTCP).GPUMemory; {
		case staged == nil:
			return verdict{"tcp", false, "the agent on " + tns[i].Name + " does not say whether tcp stages its GPU memory (an agent older than the report's gpuMemory)"}
		case !*staged:
			return verdict{"tcp", false, "tcp runs on " + tns[i].Name + " without staging its GPU memory: " + how}
		}
	}
	return verdict{"tcp", true, "both nodes run tcp and stage GPU memory through pinned host memory"}
}

// engineOf is a report's entry for an engine, nil when it has none.
func engineOf(tn *fxv1.TransferNode, e fxv1.EngineName) *fxv1.EngineAvailability {
	for i := range tn.Status.Engines {
		if tn.Status.Engines[i].Name == e {
			return &tn.Status.Engines[i]
		}
	}
	return nil
}

// printable replaces control characters in text an agent wrote (a reason) before it reaches a terminal: a
// node's report is written with that node's token, not the admin's.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
}

// verdict is one engine's answer for a pair of GPUs.
type verdict struct {
	engine string
	yes    bool
	why    string
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
