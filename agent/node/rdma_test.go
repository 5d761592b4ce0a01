// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/rdma/fakeverbs"
	"github.com/fabricxfer/fabricxfer/topology"
)

// freePort returns a loopback address nothing listens on now (the stacks must know each other's endpoints
// before either listens).
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestTwoStacksMoveBytesOverRDMA runs two agents' transfer sides whose rdma engines (on one fake RDMA network,
// Deps.RDMAProvider) are built as the agent builds them, from a report with a usable RDMA port: pods' host memory is registered on the NIC, the queue pairs are exchanged over the
// agents' peer channel, a write (with its notification through the channel) and a read go through the rdma
// engine, ahead of tcp, and land byte for byte.
func TestTwoStacksMoveBytesOverRDMA(t *testing.T) {
	a, b := peerConfigs(t, 16)
	fabric := fakeverbs.NewNetwork()
	rep := topology.Report{NICs: []topology.NIC{{Name: "mlx5_0", Port: 1, State: "ACTIVE", LinkLayer: "InfiniBand"}},
		Engines: []topology.Engine{{Name: engines.EngineRDMA, Available: true, Reason: "1 of 1 ports usable"}}}
	withRDMA := func(node string) Deps { return Deps{RDMAProvider: fabric.Provider(node)} }
	runStackOn(t, a, rep, withRDMA("node-a"))
	runStackOn(t, b, rep, withRDMA("node-b"))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cA, cB := dialNode(ctx, t, a), dialNode(ctx, t, b)
	const size = 1 << 20
	ma, _ := client.NewSharedMemory("a", size)
	mb, _ := client.NewSharedMemory("b", size)
	defer ma.Close()
	defer mb.Close()
	copy(ma.Bytes, bytes.Repeat([]byte("node-a  "), size/8))
	copy(mb.Bytes, bytes.Repeat([]byte("node-b  "), size/8))
	ra, err := cA.RegisterHost(ctx, ma.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := cB.RegisterHost(ctx, mb.File, 0, size, client.Segment("b"))
	if err != nil {
		t.Fatal(err)
	}
	notes, _, err := cB.Notifications(ctx, rb)
	if err != nil {
		t.Fatal(err)
	}

	// Node A writes its first half into node B's second half, notifying node B's client.
	tr, err := cA.Submit(ctx, client.Write, []client.Item{{Local: ra, Remote: client.ToSegment("node-b", "b"),
		RemoteOffset: size / 2, Length: size / 2, Tag: "w"}}, client.TransferOptions{Notify: []byte("half landed")})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Engines) != 1 || tr.Engines[0] != engines.EngineRDMA {
		t.Fatalf("write planned on %v, want rdma", tr.Engines)
	}
	if _, err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mb.Bytes[size/2:], ma.Bytes[:size/2]) {
		t.Fatal("node B's second half differs from node A's first half after the rdma write")
	}
	select {
	case n := <-notes:
		if string(n.Payload) != "half landed" || n.SourceNode != "node-a" {
			t.Fatalf("notification on node B: %v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("node B's client got no notification of the rdma write")
	}
	// Node A reads node B's first half into its second half.
	tr, err = cA.Submit(ctx, client.Read, []client.Item{{Local: ra, LocalOffset: size / 2, Remote: client.ToSegment("node-b", "b"),
		Length: size / 2, Tag: "r"}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Engines) != 1 || tr.Engines[0] != engines.EngineRDMA {
		t.Fatalf("read planned on %v, want rdma", tr.Engines)
	}
	if _, err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ma.Bytes[size/2:], mb.Bytes[:size/2]) {
		t.Fatal("node A's second half differs from node B's first half after the rdma read")
	}
	if fabric.Connected != 4 {
		t.Fatalf("%d queue pairs connected, want one set of 2 per side", fabric.Connected)
	}
}
