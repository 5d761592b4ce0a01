// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
)

func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func newEngine(t testing.TB, node string, ln net.Listener) *Engine {
	t.Helper()
	e, err := New(Options{Node: node, Listener: ln, ChunkBytes: 64 << 10, PeerTimeout: 5 * time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// register adds size bytes of host memory to e and returns its descriptor as peers see it.
func register(t testing.TB, e *Engine, id string, buf []byte) engines.MemoryDesc {
	t.Helper()
	d, err := e.Register(context.Background(), engines.MemoryDesc{ID: engines.MemoryID(id), Node: e.opts.Node,
		Location: engines.Location{Kind: engines.LocationHost}, Size: uint64(len(buf)), Handles: engines.Handles{Host: buf}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// moveWithin plans on e what add adds, submits it and waits for it, all within limit.
func moveWithin(e *Engine, limit time.Duration, add func(engines.PlanBuilder) error) error {
	pb := e.NewPlan()
	if err := add(pb); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	tr, err := e.Submit(ctx, pb.Build(), engines.SubmitOptions{})
	if err != nil {
		return err
	}
	return tr.Wait(ctx)
}

// item is a plan's add of one item, for moveWithin.
func item(it engines.Item) func(engines.PlanBuilder) error {
	return func(pb engines.PlanBuilder) error { return pb.Add(it) }
}

// imp ships a descriptor the way agents do (wire encoding) and imports it.
func imp(t testing.TB, e *Engine, d engines.MemoryDesc) {
	t.Helper()
	b, err := engines.MarshalDesc(d)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := engines.UnmarshalDesc(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Import(context.Background(), remote); err != nil {
		t.Fatal(err)
	}
}

func TestContract(t *testing.T) {
	g := &enginetest.Gate{}
	a := newEngine(t, "node-a", listen(t))
	b := newEngine(t, "node-b", g.Listener(listen(t)))
	var next atomic.Uint64
	h := enginetest.Harness{
		Engine:     a,
		Directions: []engines.Direction{engines.DirWrite, engines.DirRead},
		NewPair: func(t testing.TB, dir engines.Direction, size uint64) enginetest.Pair {
			n := next.Add(1)
			local, remote := make([]byte, size), make([]byte, size)
			ld := register(t, a, fmt.Sprintf("node-a/%d", n), local)
			rd := register(t, b, fmt.Sprintf("node-b/%d", n), remote)
			imp(t, a, rd)
			// The peer's memory is touched by its serving goroutines, ordered with this test only through
			// the socket, which the race detector does not see; pinning the region there orders them.
			onPeer := func(f func()) {
				_, unpin, err := b.reg.Pin(rd.ID)
				if err != nil {
					t.Fatalf("pinning %s on the peer: %v", rd.ID, err)
				}
				defer unpin()
				f()
			}
			p := enginetest.Pair{Src: ld.ID, Dst: rd.ID, Size: size,
				Fill: func(off uint64, data []byte) { copy(local[off:], data) },
				Read: func(off, n uint64) (out []byte) {
					onPeer(func() { out = append([]byte(nil), remote[off:off+n]...) })
					return out
				}}
			if dir == engines.DirRead {
				p = enginetest.Pair{Src: rd.ID, Dst: ld.ID, Size: size,
					Fill: func(off uint64, data []byte) { onPeer(func() { copy(remote[off:], data) }) },
					Read: func(off, n uint64) []byte { return append([]byte(nil), local[off:off+n]...) }}
			}
			return p
		},
		Gate: g.Shut,
		SetDstNotify: func(dir engines.Direction, fn engines.NotifyFunc) {
			if dir == engines.DirWrite {
				b.SetNotifyHandler(fn)
			} else {
				a.SetNotifyHandler(fn)
			}
		},
	}
	enginetest.Run(t, h)
}

func TestCanHandle(t *testing.T) {
	a := newEngine(t, "node-a", nil)
	host := engines.MemoryDesc{ID: "node-a/1", Node: "node-a", Location: engines.Location{Kind: engines.LocationHost}, Size: 8,
		Handles: engines.Handles{Host: make([]byte, 8)}}
	gpu := engines.MemoryDesc{ID: "node-a/2", Node: "node-a", Size: 8,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}}
	remote := engines.MemoryDesc{ID: "node-b/1", Node: "node-b", Location: engines.Location{Kind: engines.LocationHost}, Size: 8,
		Handles: engines.Handles{TCP: "127.0.0.1:9"}}
	noTCP := remote
	noTCP.Handles.TCP = ""
	rdmaLocal, rdmaRemote := host, remote
	rdmaLocal.Handles.RDMA = []engines.RDMAKey{{Device: "mlx5_0", Addr: 1, RKey: 2}}
	rdmaRemote.Handles.RDMA = []engines.RDMAKey{{Device: "mlx5_1", Addr: 1, RKey: 2}}
	for _, c := range []struct {
		src, dst engines.MemoryDesc
		ok       bool
		why      string
	}{
		{host, remote, true, ""},
		{remote, host, true, ""},
		{host, host, false, "both regions are on this node"},
		{gpu, remote, false, "GPU memory this node does not stage through host memory: no GPU copy backend"},
		{host, noTCP, false, "no TCP endpoint"},
		{rdmaLocal, rdmaRemote, false, "rdma engine"},
		{rdmaLocal, remote, true, ""},
	} {
		ok, why := a.CanHandle(&c.src, &c.dst)
		if ok != c.ok || !strings.Contains(why, c.why) {
			t.Errorf("CanHandle(%s, %s) = %v %q, want %v %q", c.src.ID, c.dst.ID, ok, why, c.ok, c.why)
		}
	}
}

// TestPeerRestartsAndWrongNode: a transfer to a peer that answers as another node fails with PeerLostError
// naming it, and nothing hangs.
func TestRefusesImpostorPeer(t *testing.T) {
	a := newEngine(t, "node-a", nil)
	other := newEngine(t, "node-c", listen(t))
	local := register(t, a, "node-a/1", make([]byte, 1024))
	fake := engines.MemoryDesc{ID: "node-b/1", Node: "node-b", Location: engines.Location{Kind: engines.LocationHost}, Size: 1024,
		Handles: engines.Handles{TCP: other.Addr()}}
	imp(t, a, fake)
	b := a.NewPlan()
	if err := b.Add(engines.Item{Src: local.ID, Dst: fake.ID, Size: 1024, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr, err := a.Submit(ctx, b.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Wait(ctx)
	var pl *engines.PeerLostError
	if !errors.As(err, &pl) || !strings.Contains(pl.Peer, "node-b") || !strings.Contains(err.Error(), "node-c") {
		t.Fatalf("Wait = %v, want PeerLostError naming node-b and the impostor node-c", err)
	}
}

// TestBackPressure: with a budget of one chunk in flight per peer, concurrent transfers of many chunks still
// all complete (submitters wait for budget; nothing deadlocks) and land intact.
func TestBackPressure(t *testing.T) {
	b := newEngine(t, "node-b", listen(t))
	a, err := New(Options{Node: "node-a", ChunkBytes: 64 << 10, MaxInFlightBytes: 64 << 10, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const n, size = 4, 1 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var transfers []engines.Transfer
	var srcs [][]byte
	var dsts []engines.MemoryDesc
	for i := range n {
		src := make([]byte, size)
		for k := range src {
			src[k] = byte(k*7 + i)
		}
		srcs = append(srcs, src)
		ld := register(t, a, fmt.Sprintf("node-a/%d", i), src)
		rd := register(t, b, fmt.Sprintf("node-b/%d", i), make([]byte, size))
		imp(t, a, rd)
		dsts = append(dsts, rd)
		pb := a.NewPlan()
		if err := pb.Add(engines.Item{Src: ld.ID, Dst: rd.ID, Size: size, Tag: engines.Tag(i)}); err != nil {
			t.Fatal(err)
		}
		tr, err := a.Submit(ctx, pb.Build(), engines.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		transfers = append(transfers, tr)
	}
	for i, tr := range transfers {
		if err := tr.Wait(ctx); err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
		view, unpin, err := b.Pin(dsts[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		if string(view) != string(srcs[i]) {
			t.Fatalf("transfer %d landed wrong bytes", i)
		}
		unpin()
	}
}

// TestSilentPeerIsLost: a peer that keeps its connections open but stops answering (a partition, a hung
// agent) fails the transfer after Liveness (here cut to PeerTimeout) with an error naming it.
func TestSilentPeerIsLost(t *testing.T) {
	g := &enginetest.Gate{}
	b := newEngine(t, "node-b", g.Listener(listen(t)))
	a, err := New(Options{Node: "node-a", PeerTimeout: 300 * time.Millisecond, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ld := register(t, a, "node-a/1", make([]byte, 64<<10))
	rd := register(t, b, "node-b/1", make([]byte, 64<<10))
	imp(t, a, rd)
	pb := a.NewPlan()
	if err := pb.Add(engines.Item{Src: ld.ID, Dst: rd.ID, Size: 64 << 10, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	ps := pb.Build()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Connect first (the handshake needs the peer), then silence it.
	tr, err := a.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	release := g.Shut(t)
	defer release()
	start := time.Now()
	tr, err = a.Submit(ctx, ps, engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Wait(ctx)
	var pl *engines.PeerLostError
	if !errors.As(err, &pl) || !strings.Contains(pl.Peer, "node-b") {
		t.Fatalf("silent peer: %v, want a PeerLostError naming node-b", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("silent peer detected after %v, PeerTimeout is 300ms", took)
	}
}
