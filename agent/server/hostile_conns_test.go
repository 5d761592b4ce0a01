// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// http2Open connects to the agent's socket as a gRPC client would, up to the HTTP/2 preface, and reports whether
// the agent kept the connection (it sent its settings) rather than closing it.
func http2Open(t *testing.T, path string) (net.Conn, bool) {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// The client preface and an empty SETTINGS frame: the connection then outlives the agent's 10 s preface bound.
	if _, err := conn.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil && !errors.Is(err, syscall.EPIPE) {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	head := make([]byte, 9)
	if _, err := io.ReadFull(conn, head); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
			return conn, false
		}
		t.Fatalf("reading the agent's HTTP/2 settings: %v", err)
	}
	if head[3] != 4 {
		t.Fatalf("the agent's first frame is of type %d, want SETTINGS", head[3])
	}
	_ = conn.SetReadDeadline(time.Time{})
	return conn, true
}

// floodBed is an agent that names pods by their UIDs, with a victim pod holding two regions of m, the first
// filled: a test floods the agent from another pod and checks that the victim's transfers go on.
type floodBed struct {
	a        *agent
	proc     *procFixture
	m        *client.SharedMemory
	victim   *client.Client
	src, dst *client.Region
}

func newFloodBed(t *testing.T, victimPod string) *floodBed {
	t.Helper()
	opts, proc := podOptions(t)
	b := &floodBed{a: startAgent(t, opts), proc: proc, m: shm(t, 1<<20)}
	copy(b.m.Bytes[:4096], bytes.Repeat([]byte{0x5a}, 4096))
	proc.setPod(t, victimPod)
	b.victim = dial(t, b.a)
	var err error
	if b.src, err = b.victim.RegisterHost(ctxT(t), b.m.File, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if b.dst, err = b.victim.RegisterHost(ctxT(t), b.m.File, 4096, 4096); err != nil {
		t.Fatal(err)
	}
	return b
}

// victimMoves checks that the victim's transfer lands (when says when, for the failure).
func (b *floodBed) victimMoves(t *testing.T, when string) {
	t.Helper()
	clear(b.m.Bytes[4096:8192])
	if _, err := b.victim.Write(ctxT(t), b.src, 0, client.ToRegion(b.dst), 0, 4096); err != nil || !bytes.Equal(b.m.Bytes[4096:8192], b.m.Bytes[:4096]) {
		t.Fatalf("the other pod's transfer %s: %v", when, err)
	}
}

// TestHostileConnectionFloodIsBounded: each agent.sock connection is a gRPC transport the agent keeps while its
// process idles, and a pod that opened them without end held the agent's memory and descriptors. A pod keeps
// at most 128: the next ones are closed at once, its own client and everyone else's keep working, and it may
// connect again once it lets some go. A process the agent refuses keeps at most 16.
func TestHostileConnectionFloodIsBounded(t *testing.T) {
	const victimPod, hostilePod = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"
	b := newFloodBed(t, victimPod)
	a, proc, m, ctx := b.a, b.proc, b.m, ctxT(t)

	proc.setPod(t, hostilePod)
	hostile := dial(t, a) // one connection of the 128
	var held []net.Conn
	for i := range 127 {
		conn, kept := http2Open(t, a.srv.SocketPath())
		if !kept {
			t.Fatalf("the pod's connection %d of 128 was closed", i+2)
		}
		held = append(held, conn)
	}
	for i := range 3 {
		if _, kept := http2Open(t, a.srv.SocketPath()); kept {
			t.Fatalf("connection %d past the pod's 128 was kept", i+1)
		}
	}

	// The pod's own client, and another pod's, old and new, are served as before.
	hr, err := hostile.RegisterHost(ctx, m.File, 8192, 4096)
	if err != nil {
		t.Fatalf("the flooding pod's own client: %v", err)
	}
	if _, err := hostile.Write(ctx, hr, 0, client.ToRegion(hr), 2048, 1024); err != nil {
		t.Fatalf("the flooding pod's own transfer: %v", err)
	}
	b.victimMoves(t, "during the flood")
	proc.setPod(t, victimPod)
	if _, kept := http2Open(t, a.srv.SocketPath()); !kept {
		t.Fatal("another pod's new connection was closed during the flood")
	}
	late := dial(t, a)
	if _, err := late.RegisterHost(ctx, m.File, 12288, 4096); err != nil {
		t.Fatalf("another pod's new client during the flood: %v", err)
	}

	// Connections let go are uncounted: the pod connects again.
	proc.setPod(t, hostilePod)
	for _, c := range held[:4] {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, kept := http2Open(t, a.srv.SocketPath()); kept {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pod could not connect again after closing 4 of its connections")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A process the agent refuses (in no pod, local callers not admitted) keeps 16 connections to learn why.
	proc.setLocal(t)
	for i := range 16 {
		if _, kept := http2Open(t, a.srv.SocketPath()); !kept {
			t.Fatalf("refused process's connection %d of 16 was closed", i+1)
		}
	}
	if _, kept := http2Open(t, a.srv.SocketPath()); kept {
		t.Fatal("a refused process's 17th connection was kept")
	}
	b.victimMoves(t, "after the floods")
}

// TestOneCallersQueuedCopiesDoNotHoldAnothersBehindThem: the host copy workers are shared by every caller of the
// node, and were handed out in arrival order: a pod that kept long copies queued (within its own memory and
// limits) held every other pod's copy behind all of them, past its deadline. Workers go in turns between callers:
// another pod's copy, submitted behind 24 of them, lands while most of them still wait. (One worker here, so the
// copies leave the machine's other core to the calls.)
func TestOneCallersQueuedCopiesDoNotHoldAnothersBehindThem(t *testing.T) {
	const victimPod, busyPod = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000c"
	opts, proc := podOptions(t)
	x, err := xgmi.New(xgmi.Options{Node: "node-a", Workers: 1}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Engine, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x); err != nil {
		t.Fatal(err)
	}
	a, ctx := startAgent(t, opts), ctxT(t)
	proc.setPod(t, victimPod)
	victim, m := dial(t, a), shm(t, 1<<20)
	vsrc, err := victim.RegisterHost(ctx, m.File, 0, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	vdst, err := victim.RegisterHost(ctx, m.File, 512<<10, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	proc.setPod(t, busyPod)
	busy, mem := dial(t, a), shm(t, 256<<20)
	r, err := busy.RegisterHost(ctx, mem.File, 0, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	const queue = 24 // 128 MiB each
	var queued []*client.Transfer
	for range queue {
		tr, err := busy.Submit(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToRegion(r), RemoteOffset: 128 << 20, Length: 128 << 20}}, client.TransferOptions{})
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, tr)
	}
	copy(m.Bytes[:256<<10], bytes.Repeat([]byte{0x3c}, 256<<10))
	if _, err := victim.Write(ctx, vsrc, 0, client.ToRegion(vdst), 0, 256<<10); err != nil || !bytes.Equal(m.Bytes[512<<10:768<<10], m.Bytes[:256<<10]) {
		t.Fatalf("the other pod's 256 KiB copy behind the busy pod's queue: %v", err)
	}
	info, err := busy.API().GetInfo(ctx, &agentv1.GetInfoRequest{}) // one look: the busy pod's copies go on
	if err != nil {
		t.Fatal(err)
	}
	if settled := queue - int(info.Usage.InFlight); settled >= queue/2 {
		t.Fatalf("the other pod's copy landed after %d of the busy pod's %d queued before it: it waited its turn behind them", settled, queue)
	}
	long, cancel := context.WithTimeout(context.Background(), time.Minute) // 3 GiB of copies on a busy machine
	defer cancel()
	if _, err := busy.WaitAll(long, queued...); err != nil {
		t.Fatalf("the busy pod's own copies: %v", err)
	}
}
