// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"sync"
	"testing"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// domainBackend is the stand-in GPU backend that also records the fabric domain of each registration.
type domainBackend struct {
	*stubGPUBackend
	mu      sync.Mutex
	domains []string
}

func (b *domainBackend) Register(ctx context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	b.mu.Lock()
	b.domains = append(b.domains, d.FabricDomain)
	b.mu.Unlock()
	return b.stubGPUBackend.Register(ctx, d)
}

// TestGPUMemoryTakesTheGPUsDomainAtRegistration: a declared vPOD changes a GPU's domain while the agent runs, so
// each GPU registration takes the domain FabricDomainOf says now, and the detected one where it says nothing.
func TestGPUMemoryTakesTheGPUsDomainAtRegistration(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.GPUs = []server.GPUInfo{{Index: 0, UUID: "GPU-0000", Vendor: engines.VendorNVIDIA, BusID: "0000:c1:00.0", FabricDomain: "ualink:1/1"}}
	var mu sync.Mutex
	now, known := "ualink:77/1", true
	opts.FabricDomainOf = func(gpu int) (string, bool) {
		mu.Lock()
		defer mu.Unlock()
		return now, known && gpu == 0
	}
	be := &domainBackend{stubGPUBackend: &stubGPUBackend{seen: map[engines.MemoryID]vmmSeen{}}}
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, be, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Engine, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	register := func() {
		t.Helper()
		tok, err := fdpass.Put(ctx, a.srv.FDSocketPath(), shm(t, 4096).File)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_GPU, GpuUuid: "GPU-0000",
			HandleType: agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD, FdToken: tok, Length: 4096, AllocationSize: 2 << 20}); err != nil {
			t.Fatalf("registering GPU memory: %v", err)
		}
	}
	register() // declared in ualink:77/1
	mu.Lock()
	now = "" // the declaration was removed
	mu.Unlock()
	register()
	mu.Lock()
	known = false // before the first detection: what the agent detected at start
	mu.Unlock()
	register()
	be.mu.Lock()
	defer be.mu.Unlock()
	if got := len(be.domains); got != 3 || be.domains[0] != "ualink:77/1" || be.domains[1] != "" || be.domains[2] != "ualink:1/1" {
		t.Errorf("registrations saw domains %q, want [ualink:77/1, \"\", ualink:1/1]", be.domains)
	}
}
