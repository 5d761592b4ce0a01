// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package topology_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/topology"
)

const hwKey = "ualink:1c9e2f4a-6b7d-4e11-9a2b-3c4d5e6f7081/1"

func domains(r topology.Report) string {
	var parts []string
	for _, g := range r.GPUs {
		if g.Fabric == nil {
			parts = append(parts, "-")
			continue
		}
		parts = append(parts, g.Fabric.Source+":"+g.Fabric.Domain+":"+g.Fabric.Declaration)
	}
	return strings.Join(parts, " ")
}

// TestDeclarationsSplitANodeGPUByGPU: two declarations cut one node of eight GPUs into two domains.
func TestDeclarationsSplitANodeGPUByGPU(t *testing.T) {
	r := mustDetect(t, fixture(t, "mi300x-8gpu-roce"), topology.Options{Declarations: []topology.Declaration{
		{Name: "vpod-a", Domain: "ualink:77/1", GPUs: []int{0, 1, 2, 3}},
		{Name: "vpod-b", Domain: "ualink:77/2", GPUs: []int{4, 5, 6, 7}},
	}})
	for i, g := range r.GPUs {
		want, decl := "ualink:77/1", "vpod-a"
		if i >= 4 {
			want, decl = "ualink:77/2", "vpod-b"
		}
		if g.Fabric == nil || g.Fabric.Domain != want || g.Fabric.Source != topology.SourceDeclared || g.Fabric.Declaration != decl {
			t.Errorf("GPU %d fabric %+v, want %s declared by %s", i, g.Fabric, want, decl)
		}
	}
	if e := engineOf(t, r, "fabric"); !e.Available || e.Reason != "ualink:77/1: GPUs 0-3; ualink:77/2: GPUs 4-7; declared by vpod-a, vpod-b" {
		t.Errorf("fabric %+v", e)
	}
	if got := fmt.Sprint(r.Declarations); got != "[{vpod-a ualink:77/1 [0 1 2 3] } {vpod-b ualink:77/2 [4 5 6 7] }]" {
		t.Errorf("declarations %s", got)
	}
}

// TestDeclarationRules: the hardware wins where it reports a domain, a GPU is declared in one domain only (the
// first declaration keeps it), GPUs the node lacks are refused, and the override refuses every declaration.
func TestDeclarationRules(t *testing.T) {
	// GPU 3 of this fixture reports no domain (accel_state error); 0-2 report hwKey.
	h := fixture(t, "ualink-vpod-node-b-accel-error")
	r := mustDetect(t, h, topology.Options{Declarations: []topology.Declaration{
		{Name: "first", Domain: "ualink:99/1"}, // every GPU: 0-2 disagree with the hardware, 3 is free
		{Name: "second", Domain: "ualink:99/2", GPUs: []int{3, 2, 3, 9, -1, 1 << 30}},
		{Name: "agrees", Domain: hwKey, GPUs: []int{0}},
		{Name: "bad-kind", Domain: "hive:1/2"},
	}})
	want := "discovered:" + hwKey + ": discovered:" + hwKey + ": discovered:" + hwKey + ": declared:ualink:99/1:first"
	if got := domains(r); got != want {
		t.Errorf("domains\n got %s\nwant %s", got, want)
	}
	res := map[string]topology.DeclarationResult{}
	for _, d := range r.Declarations {
		res[d.Name] = d
	}
	if d := res["first"]; fmt.Sprint(d.GPUs) != "[3]" || d.Refused != "GPUs 0-2: the hardware reports "+hwKey {
		t.Errorf("first: %+v", d)
	}
	if d := res["second"]; len(d.GPUs) != 0 || d.Refused != "GPU 3: declared in ualink:99/1 by first first; GPU 2: the hardware reports "+hwKey+"; GPUs -1,9,1073741824: not on this node (4 GPUs)" {
		t.Errorf("second: %+v", d)
	}
	if d := res["agrees"]; fmt.Sprint(d.GPUs) != "[0]" || d.Refused != "" {
		t.Errorf("agrees: %+v", d)
	}
	if d := res["bad-kind"]; len(d.GPUs) != 0 || !strings.Contains(d.Refused, `"hive:1/2"`) {
		t.Errorf("bad-kind: %+v", d)
	}

	// The pool's override pins every GPU and refuses declarations for the node.
	r = mustDetect(t, h, topology.Options{Overrides: topology.Overrides{FabricDomain: "ualink:42/7"},
		Declarations: []topology.Declaration{{Name: "first", Domain: "ualink:99/1"}}})
	for _, g := range r.GPUs {
		if g.Fabric == nil || g.Fabric.Domain != "ualink:42/7" || g.Fabric.Source != topology.SourceOverride {
			t.Errorf("GPU %d fabric %+v under the override", g.Index, g.Fabric)
		}
	}
	if len(r.Declarations) != 1 || len(r.Declarations[0].GPUs) != 0 || !strings.Contains(r.Declarations[0].Refused, "fabricDomainOverride") {
		t.Errorf("declaration under the override: %+v", r.Declarations)
	}
}

// TestTableShowsDeclarations: agent detect prints each GPU's source and every declaration with what was taken.
func TestTableShowsDeclarations(t *testing.T) {
	r := mustDetect(t, fixture(t, "ualink-vpod-node-b-accel-error"), topology.Options{Declarations: []topology.Declaration{
		{Name: "vpod-x", Domain: "ualink:99/1"},
	}})
	var b strings.Builder
	if err := topology.WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		hwKey + " [discovered]",
		"ualink:99/1 [declared] (declared by vpod-x",
		"Declared fabric domains (1 VPodTopologies name this node; what the hardware reports wins)",
		"vpod-x       ualink:99/1  3           GPUs 0-2: the hardware reports " + hwKey,
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
