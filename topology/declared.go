// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology

import (
	"fmt"
	"sort"
	"strings"
)

// Fabric sources, as the TransferNode API spells them.
const (
	SourceDiscovered = "discovered"
	SourceDeclared   = "declared"
	SourceOverride   = "override"
)

// Declaration is an admin's statement that GPUs of this node belong to a fabric domain (a VPodTopology that
// names the node), for hardware that does not report its domain.
type Declaration struct {
	// Name is the declaring object's name, shown wherever the declaration decided something.
	Name   string
	Domain string
	// GPUs are GPU indexes of this node; empty means every GPU of the node.
	GPUs []int
}

// DeclarationResult is what detection took of one declaration.
type DeclarationResult struct {
	Name   string `json:"name"`
	Domain string `json:"domain"`
	// GPUs are the declared GPUs now in the domain (put there, or reported there by the hardware already).
	GPUs []int `json:"gpus,omitempty"`
	// Refused says which declared GPUs are not in the domain, and why; empty when every one is.
	Refused string `json:"refused,omitempty"`
}

// applyDeclarations puts declared GPUs into their domains, in the order given (the earlier declaration of a
// GPU wins). The rules: what the hardware reports wins over a declaration that disagrees (routing by a key
// the fabric does not have would hand peers handles they cannot import); a GPU is declared in one domain
// only; the pinned override (the pool's fabricDomainOverride) and declarations do not mix, the override
// stays and every declaration is refused.
func applyDeclarations(r *Report, decls []Declaration, override string) {
	taken := map[int]string{} // GPU index -> declaration that placed it
	for _, d := range decls {
		res := DeclarationResult{Name: d.Name, Domain: d.Domain}
		if override != "" {
			res.Refused = "every GPU of this node is pinned to " + override + " by the pool's fabricDomainOverride (--fabric-domain); remove one of the two"
			r.Declarations = append(r.Declarations, res)
			continue
		}
		kind, err := domainKind(d.Domain)
		if err != nil {
			res.Refused = err.Error()
			r.Declarations = append(r.Declarations, res)
			continue
		}
		want := d.GPUs
		if len(want) == 0 {
			for _, g := range r.GPUs {
				want = append(want, g.Index)
			}
		}
		refused := map[string][]int{}
		var order []string
		refuse := func(i int, why string) {
			if _, ok := refused[why]; !ok {
				order = append(order, why)
			}
			refused[why] = append(refused[why], i)
		}
		seen := map[int]bool{}
		for _, i := range want {
			if seen[i] {
				continue
			}
			seen[i] = true
			if i < 0 || i >= len(r.GPUs) {
				refuse(i, fmt.Sprintf("not on this node (%s)", plural(len(r.GPUs), "GPU")))
				continue
			}
			g := &r.GPUs[i]
			switch {
			case g.Fabric != nil && g.Fabric.Source == SourceDiscovered && g.Fabric.Domain == d.Domain:
				res.GPUs = append(res.GPUs, i) // the hardware agrees
			case g.Fabric != nil && g.Fabric.Source == SourceDiscovered:
				refuse(i, "the hardware reports "+g.Fabric.Domain)
			case taken[i] != "":
				refuse(i, "declared in "+g.Fabric.Domain+" by "+taken[i]+" first")
			default:
				taken[i] = d.Name
				g.Fabric = &Fabric{Kind: kind, Domain: d.Domain, Pinned: true, Source: SourceDeclared, Declaration: d.Name}
				note := "declared by " + d.Name
				if g.FabricNote != "" {
					note += "; hardware: " + g.FabricNote
				}
				g.FabricNote = note
				res.GPUs = append(res.GPUs, i)
			}
		}
		sort.Ints(res.GPUs)
		var parts []string
		for _, why := range order {
			noun := "GPUs "
			if len(refused[why]) == 1 {
				noun = "GPU "
			}
			parts = append(parts, noun+intRanges(refused[why])+": "+why)
		}
		res.Refused = strings.Join(parts, "; ")
		r.Declarations = append(r.Declarations, res)
	}
}
