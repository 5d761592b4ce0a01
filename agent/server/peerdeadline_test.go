// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
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

// TestStalledPeerIsBoundedByTheTransfersTimeout: a transfer naming a segment of a peer that never answers
// fails within its own timeout, not the call's.
func TestStalledPeerIsBoundedByTheTransfersTimeout(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Peers = stalledPeers{}
	a := startAgent(t, opts)
	c := dial(t, a)
	m := shm(t, 4096)
	r, err := c.RegisterHost(ctxT(t), m.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
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
