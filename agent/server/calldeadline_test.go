// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/tcp"
)

// peerWork is a peer channel that never answers and records, for each call made to it, how long after the call
// began its context ended: how long the agent kept working for a caller on a peer that does not answer.
type peerWork struct {
	stalledPeers
	held chan time.Duration
}

func (p peerWork) hold(ctx context.Context) error {
	start := time.Now()
	<-ctx.Done()
	p.held <- time.Since(start)
	return ctx.Err()
}

func (p peerWork) ResolveSegment(ctx context.Context, _, _, _ string) ([]byte, error) {
	return nil, p.hold(ctx)
}

func (p peerWork) ForgetLayout(ctx context.Context, _, _, _ string) error { return p.hold(ctx) }

// TestCallsOnAStalledPeerEndAtTheCallersDeadline: what the agent does for a call towards a peer that does not
// answer ends by the caller's deadline, and the caller hears the agent's own answer, naming what ran out:
//   - an unwaited transfer on the fast socket: a fast connection's context had no deadline, so the agent resolved
//     the peer's segment until the transfer's default timeout (60 s) after the caller gave up, submitted the
//     transfer if the peer answered meanwhile (bytes landed after an error), and the connection counted against
//     the caller's eight;
//   - a layout deregistered while a node that resolved it is told: the telling used the caller's whole deadline,
//     so the answer (success: the layout is gone) came after it, and the caller read a failure.
func TestCallsOnAStalledPeerEndAtTheCallersDeadline(t *testing.T) {
	peers := peerWork{held: make(chan time.Duration, 8)}
	a, c, r, _ := withPeers(t, peers)
	const deadline = 400 * time.Millisecond
	heldFor := func(what string) {
		t.Helper()
		select {
		case d := <-peers.held:
			if d > deadline {
				t.Errorf("%s: the agent waited on the peer %v, past the caller's %v", what, d, deadline)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the agent still waited on the peer 5 s after the caller's %v deadline", what, deadline)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	start := time.Now()
	_, err := c.Submit(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToSegment("node-z", "kv"), Length: 4096}}, client.TransferOptions{})
	cancel()
	took := time.Since(start)
	if err == nil || client.Code(err).String() != "DeadlineExceeded" || !strings.Contains(err.Error(), "node-z") {
		t.Errorf("an unwaited fast transfer towards a stalled peer: %v, want the agent's DeadlineExceeded naming node-z", err)
	}
	if took > deadline+200*time.Millisecond {
		t.Errorf("an unwaited fast transfer towards a stalled peer returned after %v, its deadline %v", took, deadline)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("the agent's answer that the call's deadline ran out does not match context.DeadlineExceeded: %v", err)
	}
	heldFor("an unwaited fast transfer")
	// Through gRPC, a lookup: the agent's answer, before the caller's deadline, reads as the deadline's end too.
	ctx, cancel = context.WithTimeout(context.Background(), deadline)
	_, err = c.ResolveSegment(ctx, "node-z", "kv")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "node node-z") {
		t.Errorf("a segment lookup towards a stalled peer: %v, want the agent's answer naming node-z, matching context.DeadlineExceeded", err)
	}
	heldFor("a segment lookup")
	// The agent answered before the caller gave up: the connection stays in step, and the next call takes it.
	if _, err := c.Write(ctxT(t), r, 0, client.ToRegion(r), 2048, 16); err != nil {
		t.Fatalf("a transfer after: %v", err)
	}

	// A layout that node-z resolved: deregistering tells node-z, which does not answer.
	l, _ := hostLayout(t, c, rand.New(rand.NewPCG(3, 4)), 1, 4, 256, client.PublishLayout("kv-told"))
	if _, err := a.srv.LookupLayout("kv-told", "", "node-z"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), deadline)
	err = c.DeregisterLayout(ctx, l)
	cancel()
	if err != nil {
		t.Errorf("deregistering a layout a stalled node resolved: %v, want it deregistered (the telling is the agent's to bound)", err)
	}
	heldFor("telling a stalled node a layout is gone")
	if _, err := c.ResolveLayoutSegment(ctxT(t), "", "kv-told"); client.Code(err).String() != "NotFound" {
		t.Errorf("the deregistered layout resolves: %v", err)
	}
}

// TestAPeersRefusalReadsInItsOwnWords: a peer's answer is quoted as its message under its own code, not as gRPC's
// "rpc error: code = NotFound desc = ..." inside the agent's.
func TestAPeersRefusalReadsInItsOwnWords(t *testing.T) {
	_, c, r, _ := withPeers(t, &forgetRecorder{nodes: map[string]int{}})
	l, _ := hostLayout(t, c, rand.New(rand.NewPCG(5, 6)), 1, 4, 256)
	for what, call := range map[string]func() error{
		"a block transfer to a layout segment": func() error {
			_, err := c.TransferBlocks(ctxT(t), client.Write, l, []uint32{0}, client.ToLayoutSegment("node-z", "gone"), []uint32{0}, client.TransferOptions{})
			return err
		},
		"a layout lookup": func() error { _, err := c.ResolveLayoutSegment(ctxT(t), "node-z", "gone"); return err },
		"a transfer to a segment": func() error {
			_, err := c.Write(ctxT(t), r, 0, client.ToSegment("node-z", "gone"), 0, 16)
			return err
		},
		"a segment lookup": func() error { _, err := c.ResolveSegment(ctxT(t), "node-z", "gone"); return err },
	} {
		err := call()
		if client.Code(err).String() != "NotFound" || strings.Count(err.Error(), "rpc error") > 1 || !strings.Contains(err.Error(), "on node") {
			t.Errorf("%s: %v, want NotFound quoting node-z's answer once", what, err)
		}
	}
}

// slowLayoutPeers answer a layout lookup after delay, with ld.
type slowLayoutPeers struct {
	stalledPeers
	delay time.Duration
	ld    *agentv1.LayoutDescriptor
}

func (p slowLayoutPeers) ResolveLayout(ctx context.Context, _, _, _ string) (*agentv1.LayoutDescriptor, error) {
	select {
	case <-time.After(p.delay):
		return p.ld, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// unreachablePeerAgent starts an agent whose peers publish layout "kv" on node-z (a region of 4 KiB in blocks of
// 1 KiB), answering a lookup after lookup, at a data address the tcp engine never reaches: a transfer to it
// stays pending until its timeout.
func unreachablePeerAgent(t *testing.T, lookup time.Duration) *agent {
	t.Helper()
	desc := nodeZDescriptor(t)
	never, err := tcp.New(tcp.Options{Node: "node-a", DialTimeout: time.Minute,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) { <-ctx.Done(); return nil, ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	opts := baseOptions(t, newProcFixture(t))
	opts.Engine = hostComposite(t, "node-a", never)
	opts.Peers = slowLayoutPeers{delay: lookup, ld: &agentv1.LayoutDescriptor{BlockBytes: 1024, Blocks: 4, Regions: [][]byte{desc}}}
	return startAgent(t, opts)
}

// TestABlockTransfersTimeoutCountsTheLayoutLookup: a waited block transfer to a layout another node published,
// whose lookup took a while and whose copy never ends (a peer's data address that never answers), fails on its own
// timeout, and the caller hears that failure with its state, before its deadline. Its timeout was counted from
// after the lookup: it outlived the caller's deadline, the call ended first, and the caller heard "still pending".
func TestABlockTransfersTimeoutCountsTheLayoutLookup(t *testing.T) {
	a := unreachablePeerAgent(t, 300*time.Millisecond)
	for name, c := range map[string]*client.Client{"fast socket": dial(t, a), "grpc": dialNoFast(t, a)} {
		l, _ := hostLayout(t, c, rand.New(rand.NewPCG(7, 8)), 1, 4, 1024)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.TransferBlocks(ctx, client.Write, l, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{1}, client.TransferOptions{})
		cancel()
		var failed *client.TransferError
		if !errors.As(err, &failed) || failed.Status.State != agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED {
			t.Errorf("%s: %v, want the transfer's own DEADLINE_EXCEEDED status", name, err)
		}
	}
}
