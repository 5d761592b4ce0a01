// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// linkProxy stands for the network between two agents: it forwards TCP connections to target until it is
// partitioned, then keeps every socket open but drops the bytes both ways, as a partitioned link does (nothing
// arrives, nothing is refused). Healing forwards again. Throttle slows forwarding to model a slow link.
type linkProxy struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu          sync.Mutex
	partitioned bool
	throttle    time.Duration // pause after every forwarded read (up to 64 KiB)
	accepted    int
	conns       map[net.Conn]struct{}
	wg          sync.WaitGroup
}

func newLinkProxy(t testing.TB, target string) *linkProxy {
	t.Helper()
	p := &linkProxy{t: t, ln: listen(t), target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		p.ln.Close()
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *linkProxy) Addr() string { return p.ln.Addr().String() }

func (p *linkProxy) Partition(on bool) {
	p.mu.Lock()
	p.partitioned = on
	p.mu.Unlock()
}

func (p *linkProxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *linkProxy) Throttle(pause time.Duration) {
	p.mu.Lock()
	p.throttle = pause
	p.mu.Unlock()
}

func (p *linkProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.accepted++
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// pipe forwards src to dst (or drops, while partitioned) until either side fails, then closes both.
func (p *linkProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		drop, pause := p.partitioned, p.throttle
		p.mu.Unlock()
		if n > 0 && !drop {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			if pause > 0 {
				time.Sleep(pause)
			}
		}
		if err != nil {
			return
		}
	}
}

// waitFor polls cond every millisecond until it holds, failing the test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(time.Millisecond)
	}
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// move runs one single-item transfer and returns how it ended and how long it took.
func move(e *Engine, it engines.Item, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	b := e.NewPlan()
	if err := b.Add(it); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+5*time.Second)
	defer cancel()
	tr, err := e.Submit(ctx, b.Build(), engines.SubmitOptions{Timeout: timeout})
	if err != nil {
		return 0, err
	}
	err = tr.Wait(ctx)
	return time.Since(start), err
}

// wantPeerLost fails unless err is a PeerLostError naming node.
func wantPeerLost(t testing.TB, what string, err error, node string) {
	t.Helper()
	var pl *engines.PeerLostError
	if !errors.As(err, &pl) || !errors.Is(err, engines.ErrPeerLost) || !strings.Contains(pl.Peer, node) {
		t.Fatalf("%s ended with %v, want a PeerLostError naming %s", what, err, node)
	}
}

// TestPreconnect: connections opened ahead of use are the ones the first transfer uses (it dials nothing), a
// failed pre-connect leaves nothing behind and can be retried, and Disconnect closes them on both sides.
func TestPreconnect(t *testing.T) {
	ca := newCA(t)
	b := tlsEngine(t, "node-b", ca.config(t, "node-b"), true)
	a := tlsEngine(t, "node-a", ca.config(t, "node-a"), false)
	conns := a.opts.ConnsPerPeer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// A wrong node at the address (a stale directory) is refused and not kept.
	if err := a.Preconnect(ctx, "node-x", b.Addr()); err == nil || !strings.Contains(err.Error(), "node-x") {
		t.Fatalf("pre-connecting node-x at node-b's address: %v, want a refusal naming node-x", err)
	}
	if got := a.PeerConns(); len(got) != 0 {
		t.Fatalf("after a failed pre-connect the engine holds %v", got)
	}

	if err := a.Preconnect(ctx, "node-b", b.Addr()); err != nil {
		t.Fatalf("pre-connecting: %v", err)
	}
	if got := a.PeerConns()["node-b"]; got != conns {
		t.Fatalf("%d connections open to node-b after pre-connecting, want %d", got, conns)
	}
	waitFor(t, 5*time.Second, "node-b counts the pre-connected connections", func() bool { return b.Stats().Accepted == uint64(conns) })
	if err := a.Preconnect(ctx, "node-b", b.Addr()); err != nil {
		t.Fatalf("pre-connecting again: %v", err)
	}
	dialed := a.Stats().Dialed

	src := randomBytes(t, 8<<20)
	dst := make([]byte, len(src))
	ld := register(t, a, "node-a/src", src)
	rd := register(t, b, "node-b/dst", dst)
	imp(t, a, rd)
	if _, err := move(a, engines.Item{Src: ld.ID, Dst: rd.ID, Size: uint64(len(src)), Tag: 1}, 10*time.Second); err != nil {
		t.Fatalf("first transfer: %v", err)
	}
	if s := a.Stats(); s.Dialed != dialed || s.Dialed != uint64(conns) {
		t.Fatalf("the first transfer dialed: %d connections dialed in all, %d before it, want %d", s.Dialed, dialed, conns)
	}
	if s := b.Stats(); s.Accepted != uint64(conns) || s.ServedIn != uint64(len(src)) {
		t.Fatalf("node-b accepted %d connections and took %d bytes, want %d and %d", s.Accepted, s.ServedIn, conns, len(src))
	}

	a.Disconnect("node-b", "node left the pool")
	waitFor(t, 5*time.Second, "connections to node-b closed", func() bool { return a.PeerConns()["node-b"] == 0 })
	waitFor(t, 5*time.Second, "node-b sees its connections closed", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.serverConns) == 0
	})
}

// TestPartition puts a link that can partition (sockets stay open, bytes vanish) between two engines speaking
// mutual TLS, with the default timeouts. Large transfers in flight when the link partitions fail within 2 s
// naming the peer; a new transfer during the partition fails fast naming the peer; once the link heals,
// transfers go through again and land the right bytes.
func TestPartition(t *testing.T) {
	const (
		big   = 512 << 20
		small = 8 << 20
	)
	ca := newCA(t)
	bLn := listen(t)
	link := newLinkProxy(t, bLn.Addr().String())
	b, err := New(Options{Node: "node-b", Listener: bLn, Advertise: link.Addr(), TLS: ca.config(t, "node-b"), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Default timeouts. The budget of bytes in flight is what a blackhole swallows before the sender stalls
	// (a real partition stops it sooner, at full socket buffers); a small one keeps the test from spending the
	// partition encrypting bytes nobody receives.
	a, err := New(Options{Node: "node-a", TLS: ca.config(t, "node-a"), MaxInFlightBytes: 32 << 20, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })

	// Untouched anonymous pages read as zero and cost no memory, so the large regions are free.
	aBig, bBig := mapRegion(t, 2*big), mapRegion(t, 2*big)
	t.Cleanup(func() { syscall.Munmap(aBig); syscall.Munmap(bBig) })
	laBig, rbBig := register(t, a, "node-a/big", aBig), register(t, b, "node-b/big", bBig)
	src := randomBytes(t, small)
	back := make([]byte, small)
	laSrc, laBack := register(t, a, "node-a/src", src), register(t, a, "node-a/back", back)
	rbSmall := register(t, b, "node-b/small", make([]byte, small))
	imp(t, a, rbBig)
	imp(t, a, rbSmall)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Preconnect(ctx, "node-b", link.Addr()); err != nil {
		t.Fatal(err)
	}
	if n := link.Accepted(); n != a.opts.ConnsPerPeer {
		t.Fatalf("%d connections crossed the link after pre-connecting, want %d", n, a.opts.ConnsPerPeer)
	}

	// Two large transfers, one each way, in flight when the link partitions.
	var transfers []engines.Transfer
	for _, it := range []engines.Item{
		{Src: laBig.ID, Dst: rbBig.ID, Size: big, Tag: 1},
		{Src: rbBig.ID, Dst: laBig.ID, SrcOffset: big, DstOffset: big, Size: big, Tag: 2},
	} {
		pb := a.NewPlan()
		if err := pb.Add(it); err != nil {
			t.Fatal(err)
		}
		tr, err := a.Submit(ctx, pb.Build(), engines.SubmitOptions{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		transfers = append(transfers, tr)
	}
	waitFor(t, 10*time.Second, "8 MiB moved each way", func() bool {
		for i, tr := range transfers {
			select {
			case <-tr.Done():
				t.Fatalf("transfer %d ended before the partition: %v", i, tr.Wait(ctx))
			default:
			}
		}
		s := a.Stats()
		return s.Sent >= 8<<20 && s.Received >= 8<<20
	})
	link.Partition(true)
	cut := time.Now()
	moved := a.Stats()
	for i, tr := range transfers {
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		err := tr.Wait(wctx)
		wcancel()
		took := time.Since(cut)
		wantPeerLost(t, "in-flight transfer", err, "node-b")
		if took > 2*time.Second {
			t.Fatalf("in-flight transfer %d failed %v after the partition, want within 2 s", i, took)
		}
		t.Logf("in-flight transfer %d failed %v after the partition: %v", i, took.Round(time.Millisecond), err)
	}
	t.Logf("moved before the partition: %d MiB written, %d MiB read", moved.Sent>>20, moved.Received>>20)

	// A new transfer while the link is down: well within its 10 s deadline, and naming the peer.
	took, err := move(a, engines.Item{Src: laSrc.ID, Dst: rbSmall.ID, Size: small, Tag: 3}, 10*time.Second)
	wantPeerLost(t, "transfer submitted during the partition", err, "node-b")
	if took > 3*time.Second {
		t.Fatalf("transfer submitted during the partition failed after %v, want within 3 s (deadline 10 s)", took)
	}
	t.Logf("transfer submitted during the partition failed after %v: %v", took.Round(time.Millisecond), err)

	link.Partition(false)
	if _, err := move(a, engines.Item{Src: laSrc.ID, Dst: rbSmall.ID, Size: small, Tag: 4}, 10*time.Second); err != nil {
		t.Fatalf("write after the link healed: %v", err)
	}
	if _, err := move(a, engines.Item{Src: rbSmall.ID, Dst: laBack.ID, Size: small, Tag: 5}, 10*time.Second); err != nil {
		t.Fatalf("read after the link healed: %v", err)
	}
	view, unpin, err := b.Pin(rbSmall.ID)
	if err != nil {
		t.Fatal(err)
	}
	onB := sha256.Sum256(view)
	unpin()
	if want := sha256.Sum256(src); onB != want || sha256.Sum256(back) != want {
		t.Fatal("bytes moved after the link healed differ from the source")
	}
}

// TestSlowLinkIsNotLost: a transfer whose one chunk takes several Liveness periods to cross the link, but keeps
// moving, is progress, not silence: a read's answer streams in, and a write's payload is acknowledged by the
// serving side's keepalives while it arrives.
func TestSlowLinkIsNotLost(t *testing.T) {
	bLn := listen(t)
	link := newLinkProxy(t, bLn.Addr().String())
	link.Throttle(50 * time.Millisecond) // at most 64 KiB per 50 ms
	b, err := New(Options{Node: "node-b", Listener: bLn, Advertise: link.Addr(), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	// Liveness of a second, not less: the check must tell a slow link from a dead one even when the test shares a
	// loaded machine with other packages' tests and a process can be starved for a few hundred milliseconds.
	const size, live = 4 << 20, time.Second
	a, err := New(Options{Node: "node-a", ConnsPerPeer: 1, ChunkBytes: size, Liveness: live, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	onB := randomBytes(t, size)
	rd := register(t, b, "node-b/mem", onB)
	onA := make([]byte, size)
	ld := register(t, a, "node-a/mem", onA)
	imp(t, a, rd)
	for _, tc := range []struct {
		name string
		it   engines.Item
	}{
		{"read", engines.Item{Src: rd.ID, Dst: ld.ID, Size: size, Tag: 1}},
		{"write", engines.Item{Src: ld.ID, Dst: rd.ID, Size: size, Tag: 2}},
	} {
		if tc.name == "write" {
			copy(onA, randomBytes(t, size))
		}
		took, err := move(a, tc.it, 20*time.Second)
		if err != nil {
			t.Fatalf("%s over a slow link: %v", tc.name, err)
		}
		if took < 2*live {
			t.Fatalf("the %s took %v, not longer than Liveness (%v): the link was not slow enough to test anything", tc.name, took, live)
		}
		view, unpin, err := b.Pin(rd.ID)
		if err != nil {
			t.Fatal(err)
		}
		same := bytes.Equal(view, onA)
		unpin()
		if !same {
			t.Fatalf("bytes of the %s over the slow link differ", tc.name)
		}
		t.Logf("4 MiB %s took %v with Liveness %v", tc.name, took.Round(time.Millisecond), live)
	}
}
