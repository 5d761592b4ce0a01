// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fabricxfer/fabricxfer/agent/peers"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
	"github.com/fabricxfer/fabricxfer/internal/syncbuf"
)

// listDir is a directory whose membership the test changes, as TransferNodes come and go.
type listDir struct {
	mu    sync.Mutex
	nodes map[string]string
}

func (d *listDir) Endpoint(_ context.Context, node string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ep, ok := d.nodes[node]; ok {
		return ep, nil
	}
	return "", context.DeadlineExceeded
}

func (d *listDir) Nodes(context.Context) (map[string]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.nodes), nil
}

func (d *listDir) remove(node string) {
	d.mu.Lock()
	delete(d.nodes, node)
	d.mu.Unlock()
}

// TestDataConnectionsFollowTheDirectory: once a peer appears, the channel opens the tcp engine's data
// connections to the address the peer's Hello names, retrying while they cannot open; the first transfer then
// dials nothing; a peer that leaves the directory loses its data connections.
func TestDataConnectionsFollowTheDirectory(t *testing.T) {
	certs := newPoolCerts(t, "infer", "kv")
	a, b := newNode(t, "node-a", certs), newNode(t, "node-b", certs)
	gate := &enginetest.Gate{}
	release := gate.Shut(t) // node-b's data path answers nothing at first: pre-connecting fails until it opens
	defer release()
	teA, err := tcp.New(tcp.Options{Node: "node-a", TLS: a.tls.Config(), DialTimeout: 200 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teA.Close() })
	teB, err := tcp.New(tcp.Options{Node: "node-b", Listener: gate.Listener(b.dataLn), TLS: b.tls.Config(), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { teB.Close() })

	dir := &listDir{nodes: map[string]string{"node-a": a.peerLn.Addr().String(), "node-b": b.peerLn.Addr().String()}}
	logs := &syncbuf.Buffer{}
	serve := func(n *node, te *tcp.Engine, dir peers.Directory, log *slog.Logger) *peers.Peers {
		p, err := peers.New(peers.Options{Node: n.name, PoolNamespace: "infer", PoolName: "kv", AgentVersion: "test",
			Listener: n.peerLn, TLS: n.tls, Directory: dir, Refresh: 50 * time.Millisecond, Logger: log,
			DataEndpoint: te.Addr(), Data: te})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- p.Serve(ctx, nil) }()
		t.Cleanup(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: %v", n.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("%s did not stop", n.name)
			}
		})
		return p
	}
	// node-b knows nobody, so only node-a reaches out.
	serve(b, teB, peers.StaticDirectory{}, nil)
	pa := serve(a, teA, dir, slog.New(slog.NewTextHandler(logs, nil)))

	waitFor(t, func() bool { return strings.Contains(logs.String(), "pre-connecting data connections") }, "a logged pre-connect failure")
	if n := teA.PeerConns()["node-b"]; n != 0 {
		t.Fatalf("%d data connections open to node-b while its data path answers nothing", n)
	}
	release()
	waitFor(t, func() bool { return teA.PeerConns()["node-b"] == 4 }, "4 data connections to node-b")
	waitFor(t, func() bool { return teB.Stats().Accepted == 4 }, "node-b accepting 4 data connections")
	// The channel's gauge shows the connection to node-b by its state, labelled by state only.
	waitFor(t, func() bool { return peerStates(t, pa)["ready"] == 1 }, "fabricxfer_agent_peers{state=ready} = 1")
	if st := peerStates(t, pa); len(st) != 5 {
		t.Errorf("peer states %v, want all five, every one exported", st)
	}
	dialed := teA.Stats().Dialed

	src, dst := make([]byte, 1<<20), make([]byte, 1<<20)
	for i := range src {
		src[i] = byte(i % 253)
	}
	ld, err := teA.Register(context.Background(), engines.MemoryDesc{ID: "node-a/src", Node: "node-a",
		Location: engines.Location{Kind: engines.LocationHost}, Size: uint64(len(src)), Handles: engines.Handles{Host: src}})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := teB.Register(context.Background(), engines.MemoryDesc{ID: "node-b/dst", Node: "node-b",
		Location: engines.Location{Kind: engines.LocationHost}, Size: uint64(len(dst)), Handles: engines.Handles{Host: dst}})
	if err != nil {
		t.Fatal(err)
	}
	rd.Handles.Host = nil // what crosses the wire
	if err := teA.Import(context.Background(), rd); err != nil {
		t.Fatal(err)
	}
	pb := teA.NewPlan()
	if err := pb.Add(engines.Item{Src: ld.ID, Dst: rd.ID, Size: uint64(len(src)), Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := teA.Submit(ctx, pb.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatalf("first transfer: %v", err)
	}
	if s := teA.Stats(); s.Dialed != dialed || teB.Stats().Accepted != 4 {
		t.Fatalf("the first transfer opened connections: %d dialed (%d before it), node-b accepted %d", s.Dialed, dialed, teB.Stats().Accepted)
	}
	view, unpin, err := teB.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	same := bytes.Equal(view, src)
	unpin()
	if !same {
		t.Fatal("bytes written over the pre-opened connections differ")
	}

	dir.remove("node-b")
	waitFor(t, func() bool { return teA.PeerConns()["node-b"] == 0 }, "data connections to node-b closed")
	waitFor(t, func() bool { return !slices.Contains(pa.Connected(), "node-b") }, "channel to node-b closed")
}

// peerStates scrapes fabricxfer_agent_peers of p: state -> connections.
func peerStates(t *testing.T, p *peers.Peers) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(p.Collector())
	out := map[string]float64{}
	for _, s := range promtest.Samples(t, reg) {
		if len(s.Labels) != 1 || s.Labels[0].Name != "state" {
			t.Fatalf("%s has labels %v, want state alone", s.Name, s.Labels)
		}
		out[s.Labels[0].Value] = s.Value
	}
	return out
}
