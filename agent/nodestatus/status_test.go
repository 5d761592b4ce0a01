// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nodestatus_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/nodestatus"
	v1alpha1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/topology"
)

func TestStatusMirrorsTheReport(t *testing.T) {
	h, err := topology.NewDirHost(filepath.Join("..", "..", "topology", "testdata", "ualink-vpod-node-a"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := topology.Detect(t.Context(), h, topology.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := nodestatus.FromReport(r, nodestatus.Identity{AgentVersion: "v0.1.0", Endpoint: "10.0.0.7:7470"})
	if len(st.GPUs) != len(r.GPUs) || len(st.NICs) != len(r.NICs) || len(st.Engines) != 4 {
		t.Fatalf("status has %d GPUs, %d NICs, %d engines", len(st.GPUs), len(st.NICs), len(st.Engines))
	}
	for i, g := range r.GPUs {
		s := st.GPUs[i]
		if int(s.Index) != g.Index || string(s.Vendor) != g.Vendor || s.PCIBusID != g.PCIBusID || int(s.NUMANode) != g.NUMANode ||
			s.MemoryBytes != g.MemoryBytes || s.UUID != g.UUID || s.Fabric == nil || s.Fabric.Domain != g.Fabric.Domain ||
			s.Fabric.Kind != v1alpha1.FabricUALink || s.Fabric.DomainSize != 8 {
			t.Errorf("GPU %d: status %+v from %+v", i, s, g)
		}
	}
	for i, n := range r.NICs {
		s := st.NICs[i]
		if s.Name != n.Name || int(s.Port) != n.Port || s.State != n.State || s.LinkLayer != n.LinkLayer || s.RoCEv2 != n.RoCEv2 ||
			int(s.RateGbps) != n.RateGbps || s.PCIBusID != n.PCIBusID || fmt.Sprint(s.NearestGPUs) != fmt.Sprint(n.NearestGPUs) {
			t.Errorf("NIC %d: status %+v from %+v", i, s, n)
		}
	}
	for i, e := range r.Engines {
		if string(st.Engines[i].Name) != e.Name || st.Engines[i].Available != e.Available || st.Engines[i].Reason != e.Reason {
			t.Errorf("engine %d: %+v from %+v", i, st.Engines[i], e)
		}
	}
	if st.GPUDirect == nil || st.GPUDirect.PeerMem != r.GPUDirect.PeerMem || st.Endpoint != "10.0.0.7:7470" || st.AgentVersion != "v0.1.0" {
		t.Errorf("node fields %+v", st)
	}
}

func TestStatusKeepsWithinAPILimits(t *testing.T) {
	var r topology.Report
	for i := 0; i < 70; i++ {
		r.NICs = append(r.NICs, topology.NIC{Name: fmt.Sprintf("mlx5_%d", i), Port: 1, State: "ACTIVE", NUMANode: -1})
	}
	for i := 0; i < 20; i++ {
		r.Unreadable = append(r.Unreadable, topology.Unreadable{Field: strings.Repeat("f", 80), Reason: strings.Repeat("é", 200)})
	}
	r.Engines = []topology.Engine{{Name: "rdma", Available: true, Reason: strings.Repeat("x", 600)}}
	st := nodestatus.FromReport(r, nodestatus.Identity{})
	if len(st.NICs) != 64 {
		t.Errorf("%d NICs, want the API's 64", len(st.NICs))
	}
	if len(st.Unreadable) != 16 {
		t.Fatalf("%d unreadable entries, want 16", len(st.Unreadable))
	}
	if st.Unreadable[0].Field != "truncated" || !strings.Contains(st.Unreadable[0].Reason, "6 more RDMA ports not listed") {
		t.Errorf("first entry %+v should say NICs were cut", st.Unreadable[0])
	}
	if last := st.Unreadable[15]; last.Field != "truncated" || !strings.HasPrefix(last.Reason, "6 more unreadable facts") {
		t.Errorf("last entry %+v should count the facts left out", last)
	}
	for _, u := range st.Unreadable {
		if len(u.Field) > 64 || len(u.Reason) > 256 || !utf8Valid(u.Reason) {
			t.Errorf("entry over the API limits or cut inside a character: %d/%d bytes", len(u.Field), len(u.Reason))
		}
	}
	if len(st.Engines[0].Reason) > 512 {
		t.Errorf("engine reason %d bytes", len(st.Engines[0].Reason))
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// TestStatusKeepsDeclarationsWithinAPILimits: a node named by more declarations than the API keeps reports the
// first ones (oldest first), says how many more there are, and clips what it cannot store.
func TestStatusKeepsDeclarationsWithinAPILimits(t *testing.T) {
	var r topology.Report
	for i := range 20 {
		r.Declarations = append(r.Declarations, topology.DeclarationResult{Name: fmt.Sprintf("vpod-%02d", i), Domain: "ualink:1/2",
			GPUs: []int{0, 1}, Refused: strings.Repeat("x", 2000)})
	}
	r.GPUs = []topology.GPU{{Index: 0, Vendor: "amd", Fabric: &topology.Fabric{Kind: "ualink", Domain: "ualink:1/2",
		Source: topology.SourceDeclared, Declaration: strings.Repeat("n", 300)}}}
	st := nodestatus.FromReport(r, nodestatus.Identity{})
	if len(st.Declarations) != 16 || st.Declarations[0].VPodTopology != "vpod-00" || st.Declarations[15].VPodTopology != "vpod-15" {
		t.Fatalf("declarations %d, first %q", len(st.Declarations), st.Declarations[0].VPodTopology)
	}
	if len(st.Declarations[0].Refused) != 512 || fmt.Sprint(st.Declarations[0].GPUs) != "[0 1]" {
		t.Errorf("refused %d bytes, gpus %v", len(st.Declarations[0].Refused), st.Declarations[0].GPUs)
	}
	if st.Unreadable[0].Field != "truncated" || !strings.Contains(st.Unreadable[0].Reason, "4 more declarations not listed") {
		t.Errorf("unreadable %+v", st.Unreadable)
	}
	if f := st.GPUs[0].Fabric; f.Source != "declared" || len(f.Declaration) != 253 {
		t.Errorf("fabric %+v", f)
	}
	// A domain size past what the API takes is left out rather than written and refused with the whole report.
	for size, want := range map[int]int32{0: 0, 1: 1, 72: 72, topology.MaxDomainSize: topology.MaxDomainSize, topology.MaxDomainSize + 1: 0, -3: 0} {
		r.GPUs[0].Fabric.Size = size
		if got := nodestatus.FromReport(r, nodestatus.Identity{}).GPUs[0].Fabric.DomainSize; got != want {
			t.Errorf("domain size %d reported as %d, want %d", size, got, want)
		}
	}
}
