// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/topology"
)

// TestAssembledAgentHasOneRegistry: the agent builds its engines on the composite's registry, so a region
// registered through the composite is kept once, in the table every engine plans and submits against, with
// the handles of every engine; deregistered, it is gone from all of them at once.
func TestAssembledAgentHasOneRegistry(t *testing.T) {
	tlsDir := poolCertDir(t, "infer", "kv")
	cfg := Config{NodeName: "node-a", SocketDir: t.TempDir(), PoolNamespace: "infer", PoolName: "kv", HostRoot: "/",
		AllowLocal: true, SocketGID: -1, TLSDir: tlsDir, PeerListen: "127.0.0.1:0", DataListen: "127.0.0.1:0",
		MaxRegions: 16, MaxRegisteredBytes: 1 << 30, MaxInFlight: 16}
	ready := make(chan struct{})
	ts := newTransferSide(TransferOptions{Config: cfg}, topology.Report{},
		Deps{AgentVersion: "test", Ready: func(string) { close(ready) }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ts.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("transfer side stopped with %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("transfer side did not stop")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("transfer side ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("transfer side not ready")
	}
	comp := ts.composite.Load()
	if comp == nil {
		t.Fatal("no composite assembled")
	}
	table := comp.Registry()
	var names []string
	for _, e := range comp.Engines() {
		names = append(names, e.Name())
		pe, ok := e.(engines.Planned)
		if !ok || pe.Registry() != table {
			t.Fatalf("engine %s has a registry of its own beside the composite's", e.Name())
		}
	}
	if !slices.Equal(names, []string{engines.EngineXGMI, engines.EngineTCP}) {
		t.Fatalf("engines %v, want xgmi and tcp", names)
	}

	buf := make([]byte, 4096)
	d, err := comp.Register(ctx, engines.MemoryDesc{ID: "node-a/one", Node: "node-a", Size: uint64(len(buf)),
		Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: buf}})
	if err != nil {
		t.Fatal(err)
	}
	kept, _, err := table.Lookup(d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if kept.Handles.TCP == "" || kept.Handles.TCP != d.Handles.TCP {
		t.Fatalf("the table's descriptor has tcp handle %q, registration returned %q", kept.Handles.TCP, d.Handles.TCP)
	}
	for _, e := range comp.Engines() {
		if got, _, err := e.(engines.Planned).Registry().Lookup(d.ID); err != nil || got != kept {
			t.Fatalf("engine %s sees %p (%v), want the one descriptor %p", e.Name(), got, err, kept)
		}
	}
	if err := comp.Deregister(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := table.Describe(d.ID); !errors.Is(err, engines.ErrUnknownMemory) {
		t.Fatalf("deregistered region still in the table: %v", err)
	}
}

// TestAHealthAddressInUseFailsTheAgentAtOnce: an agent whose health address another process holds stops at once
// with an error naming it, serving no socket, instead of running with its probes answered by that process.
func TestAHealthAddressInUseFailsTheAgentAtOnce(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg := Config{NodeName: "node-a", SocketDir: dir, PoolNamespace: "infer", PoolName: "kv", HostRoot: "/",
		AllowLocal: true, SocketGID: -1, PeerListen: "127.0.0.1:0", DataListen: "127.0.0.1:0",
		MaxRegions: 16, MaxRegisteredBytes: 1 << 30, MaxInFlight: 16}
	ts := newTransferSide(TransferOptions{Config: cfg, HealthAddr: taken.Addr().String()}, topology.Report{},
		Deps{AgentVersion: "test", Ready: func(string) { t.Error("the agent got ready beside a health address in use") }})
	done := make(chan error, 1)
	go func() { done <- ts.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), taken.Addr().String()) || !strings.Contains(err.Error(), "--health-addr") {
			t.Fatalf("Run with its health address in use: %v, want an error naming the address and the flag", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the agent ran on with its health address in use")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("the agent left %d entries in its socket directory", len(entries))
	}
}
