// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
)

// stalledPeers is a peer channel whose peers never answer: every call waits for its context.
type stalledPeers struct{}

func (stalledPeers) ResolveSegment(ctx context.Context, _, _, _ string) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (stalledPeers) ResolveLayout(ctx context.Context, _, _, _ string) (*agentv1.LayoutDescriptor, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (stalledPeers) ForgetLayout(ctx context.Context, _, _, _ string) error {
	<-ctx.Done()
	return ctx.Err()
}

func (stalledPeers) ConfirmDescriptor(ctx context.Context, _ string, _ uint64, _ []byte) ([]byte, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// withPeers starts an agent whose peer channel is peers, with a client that registered 4 KiB of host memory.
func withPeers(t *testing.T, peers server.SegmentResolver) (*agent, *client.Client, *client.Region, *client.SharedMemory) {
	t.Helper()
	opts := baseOptions(t, newProcFixture(t))
	opts.Peers = peers
	a := startAgent(t, opts)
	c := dial(t, a)
	m := shm(t, 4096)
	r, err := c.RegisterHost(ctxT(t), m.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	return a, c, r, m
}

// TestStalledPeerIsBoundedByTheTransfersTimeout: a transfer naming a segment of a peer that never answers
// fails within its own timeout, not the call's.
func TestStalledPeerIsBoundedByTheTransfersTimeout(t *testing.T) {
	a, c, r, m := withPeers(t, stalledPeers{})
	var err error
	for name, fast := range map[string]bool{"fast socket": true, "grpc": false} {
		cc := c
		if !fast {
			cc = dialNoFast(t, a)
			if r, err = cc.RegisterHost(ctxT(t), m.File, 0, 4096); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		_, err := cc.Do(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToSegment("node-z", "kv"), Length: 4096}},
			client.TransferOptions{Timeout: 300 * time.Millisecond})
		cancel()
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("%s: a 300 ms transfer towards a stalled peer returned after %s", name, took)
		}
		if err == nil || client.Code(err).String() != "DeadlineExceeded" {
			t.Fatalf("%s: want DeadlineExceeded, got %v", name, err)
		}
		// A transfer naming a descriptor of the stalled peer's memory likewise: the agent asks the peer to confirm it.
		start = time.Now()
		_, err = cc.Do(ctxT(t), client.Write, []client.Item{{Local: r, Remote: client.ToDescriptor(nodeZDescriptor(t)), Length: 4096}},
			client.TransferOptions{Timeout: 300 * time.Millisecond})
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("%s: a 300 ms transfer to a stalled peer's descriptor returned after %s", name, took)
		}
		if client.Code(err).String() != "DeadlineExceeded" {
			t.Fatalf("%s: descriptor: want DeadlineExceeded, got %v", name, err)
		}
		// A block transfer to the stalled peer's layout likewise.
		l, err := cc.RegisterLayout(ctxT(t), []*client.Region{r}, 1024)
		if err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		_, err = cc.TransferBlocks(ctxT(t), client.Write, l, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{1},
			client.TransferOptions{Timeout: 300 * time.Millisecond})
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("%s: a 300 ms block transfer towards a stalled peer returned after %s", name, took)
		}
		if client.Code(err).String() != "DeadlineExceeded" {
			t.Fatalf("%s: block transfer: want DeadlineExceeded, got %v", name, err)
		}
	}
}

// nodeZDescriptor is a descriptor of host memory on node-z, as node-z would issue it.
func nodeZDescriptor(t *testing.T) []byte {
	t.Helper()
	mem, err := engines.MarshalDesc(engines.MemoryDesc{ID: "node-z/00112233445566778899aabbccddeeff", Node: "node-z",
		Location: engines.Location{Kind: engines.LocationHost}, Size: 4096, Handles: engines.Handles{TCP: "10.0.0.9:7443"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&agentv1.SegmentDescriptor{Node: "node-z", PoolNamespace: "infer", PoolName: "kv", RegionId: 7,
		Key: bytes.Repeat([]byte{1}, 16), Kind: agentv1.MemoryKind_MEMORY_KIND_HOST, Length: 4096, Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func dialNoFast(t *testing.T, a *agent) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.srv.SocketPath(), client.WithoutFastPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// describingPeers answers every layout question with one descriptor.
type describingPeers struct{ ld *agentv1.LayoutDescriptor }

func (describingPeers) ResolveSegment(context.Context, string, string, string) ([]byte, error) {
	return nil, status.Error(codes.NotFound, "no segment")
}

func (describingPeers) ConfirmDescriptor(context.Context, string, uint64, []byte) ([]byte, error) {
	return nil, status.Error(codes.NotFound, "no region")
}

func (describingPeers) ForgetLayout(context.Context, string, string, string) error { return nil }

func (p describingPeers) ResolveLayout(context.Context, string, string, string) (*agentv1.LayoutDescriptor, error) {
	return p.ld, nil
}

// TestHostilePeerLayoutsAreRefused: a peer that describes its layout wrongly (no regions, garbage, memory of
// another node, regions of another length than its geometry) fails the block transfer with a clear error and
// moves nothing on this node.
func TestHostilePeerLayoutsAreRefused(t *testing.T) {
	desc := func(node string, length uint64) []byte {
		mem, err := engines.MarshalDesc(engines.MemoryDesc{ID: engines.MemoryID(node + "/m"), Node: node, Size: length,
			Location: engines.Location{Kind: engines.LocationHost}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := proto.Marshal(&agentv1.SegmentDescriptor{Node: node, PoolNamespace: "infer", PoolName: "kv", Length: length, Memory: mem})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, c := range map[string]struct {
		ld   *agentv1.LayoutDescriptor
		says string
	}{
		"no regions":               {&agentv1.LayoutDescriptor{BlockBytes: 1024, Blocks: 4}, "not a layout"},
		"no block size":            {&agentv1.LayoutDescriptor{Blocks: 4, Regions: [][]byte{desc("node-z", 4096)}}, "not a layout"},
		"garbage region":           {&agentv1.LayoutDescriptor{BlockBytes: 1024, Blocks: 4, Regions: [][]byte{{0xff, 0xff, 0xff}}}, "malformed"},
		"another node's":           {&agentv1.LayoutDescriptor{BlockBytes: 1024, Blocks: 4, Regions: [][]byte{desc("node-a", 4096)}}, `of node "node-a"`},
		"another length":           {&agentv1.LayoutDescriptor{BlockBytes: 1024, Blocks: 4, Regions: [][]byte{desc("node-z", 1<<30)}}, "not 4096 bytes"},
		"a size past 64 bits":      {&agentv1.LayoutDescriptor{BlockBytes: 1 << 33, Blocks: 1 << 31, Regions: [][]byte{desc("node-z", 4096)}}, "not a layout"},
		"more blocks than 32 bits": {&agentv1.LayoutDescriptor{BlockBytes: 1, Blocks: 1 << 33, Regions: [][]byte{desc("node-z", 1<<33)}}, "not a layout"},
	} {
		opts := baseOptions(t, newProcFixture(t))
		opts.Peers = describingPeers{c.ld}
		a := startAgent(t, opts)
		cc := dial(t, a)
		m := shm(t, 4096)
		fill(t, m.Bytes)
		before := bytes.Clone(m.Bytes)
		r, err := cc.RegisterHost(ctxT(t), m.File, 0, 4096)
		if err != nil {
			t.Fatal(err)
		}
		l, err := cc.RegisterLayout(ctxT(t), []*client.Region{r}, 1024)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cc.TransferBlocks(ctxT(t), client.Read, l, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{1}, client.TransferOptions{})
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
		if !bytes.Equal(m.Bytes, before) {
			t.Errorf("%s: the local layout changed", name)
		}
	}
}
