// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/rdma"
	"github.com/fabricxfer/fabricxfer/engines/rdma/fakeverbs"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// nics is a node with two GPUs, each with its own NIC behind the same switch.
func nics() rdma.NICs {
	mlx0, mlx1 := rdma.PortName{Device: "mlx5_0", Port: 1}, rdma.PortName{Device: "mlx5_1", Port: 1}
	return rdma.NICs{
		Ports: []rdma.Port{{PortName: mlx0, Usable: true}, {PortName: mlx1, Usable: true}},
		GPUs: []rdma.GPUPorts{
			{Index: 0, PCIBusID: "0000:1a:00.0", Nearest: []rdma.PortName{mlx0, mlx1}},
			{Index: 1, PCIBusID: "0000:3a:00.0", Nearest: []rdma.PortName{mlx1, mlx0}},
		},
	}
}

// cluster is engines on several nodes over one fake network; the agent
// channel is a direct call into the peer engine.
type cluster struct {
	net   *fakeverbs.Network
	mu    sync.Mutex
	nodes map[string]*rdma.Engine
	next  atomic.Uint64
}

func (c *cluster) ExchangeQPs(ctx context.Context, req rdma.ExchangeRequest) ([]verbs.ConnInfo, error) {
	c.mu.Lock()
	e := c.nodes[req.To]
	c.mu.Unlock()
	if e == nil {
		return nil, fmt.Errorf("no route to %s", req.To)
	}
	return e.AcceptQPs(ctx, req)
}

func (c *cluster) SendNotification(_ context.Context, node string, n engines.Notification) error {
	c.mu.Lock()
	e := c.nodes[node]
	c.mu.Unlock()
	if e == nil {
		return fmt.Errorf("no route to %s", node)
	}
	e.Deliver(n)
	return nil
}

// fakeDMABuf hands out a placeholder fd (the fake NIC never reads it).
type fakeDMABuf struct{ calls atomic.Int64 }

func (f *fakeDMABuf) DMABuf(gpu int, addr, length uint64) (int, uint64, error) {
	f.calls.Add(1)
	fds, err := pipeFD()
	return fds, 0, err
}

func newCluster(t *testing.T, opts func(*rdma.Options), nodes ...string) *cluster {
	c := &cluster{net: fakeverbs.NewNetwork(), nodes: map[string]*rdma.Engine{}}
	for _, n := range nodes {
		o := c.options(n)
		if opts != nil {
			opts(&o)
		}
		e, err := rdma.New(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		c.nodes[n] = e
	}
	return c
}

// options are an engine's for node on the cluster's network, before a test's own.
func (c *cluster) options(node string) rdma.Options {
	return rdma.Options{Node: node, Provider: c.net.Provider(node), NICs: nics(), Exchanger: c, Notifier: c,
		DMABuf: &fakeDMABuf{}, DrainTimeout: 100 * time.Millisecond, ChunkBytes: 64 << 10}
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// region registers size bytes of "GPU" memory (Go memory standing in) on node's GPU gpu.
func (c *cluster) region(t testing.TB, node string, gpu int, size uint64) (engines.MemoryDesc, []byte) {
	buf := make([]byte, size)
	d := engines.MemoryDesc{ID: engines.MemoryID(fmt.Sprintf("%s/%d", node, c.next.Add(1))), Node: node, Size: size,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA, Device: gpu},
		Handles:  engines.Handles{Ptr: addrOf(buf)}}
	out, err := c.nodes[node].Register(context.Background(), d)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	t.Cleanup(func() { _ = buf[0] }) // keep the memory alive as long as the test
	return out, buf
}

func TestContract(t *testing.T) {
	c := newCluster(t, nil, "node-a", "node-b")
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	h := enginetest.Harness{
		Engine:     a,
		Directions: []engines.Direction{engines.DirWrite, engines.DirRead},
		Limits:     engines.Limits{MaxSegmentBytes: 64 << 10},
		NewPair: func(t testing.TB, dir engines.Direction, size uint64) enginetest.Pair {
			local, lbuf := c.region(t, "node-a", 0, size)
			remote, rbuf := c.region(t, "node-b", 1, size)
			if err := a.Import(context.Background(), remote.Remote()); err != nil {
				t.Fatalf("Import: %v", err)
			}
			src, dst, sbuf, dbuf := local.ID, remote.ID, lbuf, rbuf
			if dir == engines.DirRead {
				src, dst, sbuf, dbuf = remote.ID, local.ID, rbuf, lbuf
			}
			return enginetest.Pair{Src: src, Dst: dst, Size: size,
				Fill: func(off uint64, p []byte) { copy(sbuf[off:], p) },
				Read: func(off, n uint64) []byte { return append([]byte(nil), dbuf[off:off+n]...) }}
		},
		Gate: func(testing.TB) func() { return c.net.Hold() },
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

func TestRegistersOnTheNICNearestTheGPU(t *testing.T) {
	c := newCluster(t, nil, "node-a")
	d0, _ := c.region(t, "node-a", 0, 4096)
	d1, _ := c.region(t, "node-a", 1, 4096)
	if len(d0.Handles.RDMA) != 1 || d0.Handles.RDMA[0].Device != "mlx5_0" {
		t.Errorf("GPU 0 memory keys %+v, want one on mlx5_0", d0.Handles.RDMA)
	}
	if len(d1.Handles.RDMA) != 1 || d1.Handles.RDMA[0].Device != "mlx5_1" {
		t.Errorf("GPU 1 memory keys %+v, want one on mlx5_1", d1.Handles.RDMA)
	}
	if m, _ := c.nodes["node-a"].RegistrationMethod(d0.ID); m != "dma-buf" {
		t.Errorf("registration method %q, want dma-buf", m)
	}
}

func TestFallsBackToPeerMemoryWithoutDMABuf(t *testing.T) {
	c := newCluster(t, nil, "node-a")
	c.net.DMABufFails = true
	d, _ := c.region(t, "node-a", 0, 4096)
	if len(d.Handles.RDMA) != 1 {
		t.Fatalf("no key after the fallback: %+v", d.Handles.RDMA)
	}
	if m, why := c.nodes["node-a"].RegistrationMethod(d.ID); m != "peer-memory" {
		t.Fatalf("registration method %q (%s), want peer-memory", m, why)
	}
}

func TestUnavailableWithoutUsableNIC(t *testing.T) {
	down := nics()
	for i := range down.Ports {
		down.Ports[i].Usable = false
	}
	c := newCluster(t, func(o *rdma.Options) { o.NICs = down }, "node-a")
	e := c.nodes["node-a"]
	ok, why := e.Available()
	if ok || !strings.Contains(why, "no usable RDMA port") {
		t.Fatalf("Available = %v %q", ok, why)
	}
	d, _ := c.region(t, "node-a", 0, 4096)
	if len(d.Handles.RDMA) != 0 {
		t.Fatal("a key was made without a usable NIC")
	}
	remote := engines.MemoryDesc{ID: "node-b/1", Node: "node-b", Size: 4096,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles:  engines.Handles{RDMA: []engines.RDMAKey{{Device: "mlx5_0", Addr: 1, RKey: 2}}}}
	if ok, why := e.CanHandle(&d, &remote); ok || !strings.Contains(why, "no usable RDMA port") {
		t.Fatalf("CanHandle = %v %q", ok, why)
	}
}

func TestYieldsTheFabricEnginesPairs(t *testing.T) {
	c := newCluster(t, func(o *rdma.Options) {
		o.Yield = func(src, dst *engines.MemoryDesc) bool {
			return src.FabricDomain != "" && src.FabricDomain == dst.FabricDomain
		}
	}, "node-a", "node-b")
	local, _ := c.region(t, "node-a", 0, 4096)
	remote, _ := c.region(t, "node-b", 0, 4096)
	local.FabricDomain, remote.FabricDomain = "nvlink:x.1", "nvlink:x.1"
	if ok, why := c.nodes["node-a"].CanHandle(&local, &remote); ok || !strings.Contains(why, "fabric engine") {
		t.Fatalf("CanHandle of a fabric pair = %v %q", ok, why)
	}
	remote.FabricDomain = "nvlink:y.2"
	if ok, why := c.nodes["node-a"].CanHandle(&local, &remote); !ok {
		t.Fatalf("CanHandle of an rdma pair: %s", why)
	}
}

func transfer(t *testing.T, e engines.Engine, items ...engines.Item) error {
	t.Helper()
	b := e.NewPlan()
	for _, it := range items {
		if err := b.Add(it); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr, err := e.Submit(ctx, b.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Wait(ctx)
}

func TestRemoteAccessErrorFailsThatPlanAndTheNextTransferReconnects(t *testing.T) {
	c := newCluster(t, nil, "node-a", "node-b")
	a := c.nodes["node-a"]
	local, lbuf := c.region(t, "node-a", 0, 1<<16)
	remote, rbuf := c.region(t, "node-b", 0, 1<<16)
	stale := remote.Remote()
	stale.ID = "node-b/stale"
	stale.Handles.RDMA = []engines.RDMAKey{{Device: remote.Handles.RDMA[0].Device, Addr: remote.Handles.RDMA[0].Addr, RKey: 0xdead}}
	for _, d := range []engines.MemoryDesc{remote.Remote(), stale} {
		if err := a.Import(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	copy(lbuf, strings.Repeat("kv-block", 1<<13))
	err := transfer(t, a, engines.Item{Src: local.ID, Dst: stale.ID, Size: 4096, Tag: 41})
	var te *engines.TransferError
	if !errors.As(err, &te) || !errors.Is(err, rdma.ErrRemoteAccess) || fmt.Sprint(te.FailedTags()) != "[41]" {
		t.Fatalf("write with a bad key = %v, want ErrRemoteAccess for tag 41", err)
	}
	before := c.net.Connected
	if err := transfer(t, a, engines.Item{Src: local.ID, Dst: remote.ID, Size: 1 << 16, Tag: 42}); err != nil {
		t.Fatalf("transfer after the queue-pair error: %v", err)
	}
	if string(rbuf) != string(lbuf) {
		t.Fatal("bytes differ after reconnecting")
	}
	if c.net.Connected <= before {
		t.Fatal("the broken queue-pair set was reused instead of reconnected")
	}
}

func TestLostPeerFailsPromptlyWithErrPeerLost(t *testing.T) {
	c := newCluster(t, nil, "node-a", "node-b")
	a := c.nodes["node-a"]
	local, _ := c.region(t, "node-a", 0, 1<<20)
	remote, _ := c.region(t, "node-b", 0, 1<<20)
	if err := a.Import(context.Background(), remote.Remote()); err != nil {
		t.Fatal(err)
	}
	if err := transfer(t, a, engines.Item{Src: local.ID, Dst: remote.ID, Size: 1 << 20, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	c.net.Lose("node-b")
	start := time.Now()
	err := transfer(t, a, engines.Item{Src: remote.ID, Dst: local.ID, Size: 1 << 20, Tag: 2})
	if !errors.Is(err, engines.ErrPeerLost) {
		t.Fatalf("read from a lost peer = %v, want ErrPeerLost", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("took %v to report the lost peer", d)
	}
}

func TestSimultaneousDialsMakeOneSetPerPeer(t *testing.T) {
	c := newCluster(t, func(o *rdma.Options) { o.QPsPerPeer = 3 }, "node-a", "node-b")
	a, b := c.nodes["node-a"], c.nodes["node-b"]
	// Separate regions per direction: the two transfers run at once.
	la, _ := c.region(t, "node-a", 0, 1<<16)
	lb, _ := c.region(t, "node-b", 0, 1<<16)
	la2, _ := c.region(t, "node-a", 0, 1<<16)
	lb2, _ := c.region(t, "node-b", 0, 1<<16)
	for _, d := range []engines.MemoryDesc{lb, lb2} {
		if err := a.Import(context.Background(), d.Remote()); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []engines.MemoryDesc{la, la2} {
		if err := b.Import(context.Background(), d.Remote()); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs[0] = transfer(t, a, engines.Item{Src: la.ID, Dst: lb.ID, Size: 1 << 16, Tag: 1})
	}()
	go func() {
		defer wg.Done()
		errs[1] = transfer(t, b, engines.Item{Src: lb2.ID, Dst: la2.ID, Size: 1 << 16, Tag: 2})
	}()
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("transfer %d: %v", i, err)
		}
	}
	// One set of three connected pairs: six queue pairs moved to RTS in all.
	if c.net.Connected != 6 {
		t.Fatalf("%d queue pairs connected, want 6 (one set of 3 per side)", c.net.Connected)
	}
}

// TestRestartedPeerDialsAgainAfterTheTieWindow: node-a (which wins ties) connected to node-b, then node-b
// restarts and dials node-a at once. Within ConnectTimeout of node-a's set that dial is taken for the losing
// half of a simultaneous dial and refused, so node-b's transfer fails after waiting ConnectTimeout for a dial of
// node-a's; once the window passed, node-b's next dial replaces the set and its transfer lands.
func TestRestartedPeerDialsAgainAfterTheTieWindow(t *testing.T) {
	const window = 300 * time.Millisecond
	short := func(o *rdma.Options) { o.ConnectTimeout = window }
	c := newCluster(t, short, "node-a", "node-b")
	a := c.nodes["node-a"]
	la, abuf := c.region(t, "node-a", 0, 1<<16)
	lb, _ := c.region(t, "node-b", 0, 1<<16)
	if err := a.Import(context.Background(), lb.Remote()); err != nil {
		t.Fatal(err)
	}
	if err := transfer(t, a, engines.Item{Src: la.ID, Dst: lb.ID, Size: 1 << 16, Tag: 1}); err != nil {
		t.Fatalf("node-a's first write: %v", err)
	}
	connected := time.Now()

	// node-b restarts: a new engine, new memory, nothing of the old set.
	o := c.options("node-b")
	short(&o)
	b, err := rdma.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	c.mu.Lock()
	old := c.nodes["node-b"]
	c.nodes["node-b"] = b
	c.mu.Unlock()
	old.Close()
	lb2, bbuf := c.region(t, "node-b", 0, 1<<16)
	copy(bbuf, strings.Repeat("restart!", 1<<13))
	if err := b.Import(context.Background(), la.Remote()); err != nil {
		t.Fatal(err)
	}
	dialed := time.Now()
	err = transfer(t, b, engines.Item{Src: lb2.ID, Dst: la.ID, Size: 1 << 16, Tag: 2})
	if early := dialed.Sub(connected); early >= window {
		t.Logf("node-b dialed %v after node-a's set connected, past the %v window: nothing to check there", early, window)
	} else if err == nil {
		t.Fatalf("node-b's dial %v after node-a's set connected was taken: a late losing dial would be taken the same way", early)
	}
	time.Sleep(time.Until(connected.Add(window + 50*time.Millisecond)))
	if err := transfer(t, b, engines.Item{Src: lb2.ID, Dst: la.ID, Size: 1 << 16, Tag: 3}); err != nil {
		t.Fatalf("node-b's write once the window passed: %v", err)
	}
	if string(abuf) != string(bbuf) {
		t.Fatal("node-a's memory does not hold what restarted node-b wrote")
	}
}
