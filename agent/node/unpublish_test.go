// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package node

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/topology"
)

// TestAnUnpublishedLayoutIsNotReachedThroughWhatPeersKept: node-b writes to a layout node-a published (and keeps
// what it resolved); node-a's pod deregisters the layout but keeps its regions. node-b's next write, at once, is
// refused (the layout is gone) and leaves node-a's memory as it was; published again over other memory, the
// name's next write lands there and not in the old regions. Before node-a told node-b, node-b wrote into the
// unpublished memory for up to 2 s and reported success.
func TestAnUnpublishedLayoutIsNotReachedThroughWhatPeersKept(t *testing.T) {
	ctx, ca, cb := twoPeerNodes(t)

	const bs, blocks = 4096, 16
	old, _, memOld := hostLayout(ctx, t, ca, "kv-old", bs, blocks, client.PublishLayout("kv-u"))
	lb, _, memB := hostLayout(ctx, t, cb, "kv-u-b", bs, blocks)
	remote := client.ToLayoutSegment("node-a", "kv-u")
	write := func(src, dst uint32) error {
		_, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{src}, remote, []uint32{dst}, client.TransferOptions{})
		return err
	}
	if err := write(0, 1); err != nil {
		t.Fatalf("writing to node-a's layout: %v", err)
	}
	if err := ca.DeregisterLayout(ctx, old); err != nil {
		t.Fatal(err)
	}
	kept := [][]byte{bytes.Clone(memOld[0].Bytes), bytes.Clone(memOld[1].Bytes)}
	unpublished := time.Now()
	if err := write(2, 3); client.Code(err).String() != "NotFound" || !strings.Contains(err.Error(), "kv-u") {
		t.Fatalf("writing to node-a's layout %v after it was deregistered (its regions kept): %v, want NotFound naming it",
			time.Since(unpublished), err)
	}
	for k := range 2 {
		if !bytes.Equal(memOld[k].Bytes, kept[k]) {
			t.Fatalf("region %d of the unpublished layout was written after node-a deregistered it", k)
		}
	}

	_, _, memNew := hostLayout(ctx, t, ca, "kv-new", bs, blocks, client.PublishLayout("kv-u"))
	if err := write(4, 5); err != nil {
		t.Fatalf("writing to node-a's layout published again: %v", err)
	}
	for k := range 2 {
		if !bytes.Equal(memNew[k].Bytes[5*bs:6*bs], memB[k].Bytes[4*bs:5*bs]) {
			t.Fatalf("region %d: the write after the layout was published again is not in its new memory", k)
		}
		if !bytes.Equal(memOld[k].Bytes, kept[k]) {
			t.Fatalf("region %d of the old layout was written after the name was published over other memory", k)
		}
	}
}

// TestWritesToAPeerLayoutLandWhileItsAnswerIsAskedAgain: node-b writes to node-a's layout across more than the
// 2 s its answer is kept, past the age at which it is asked again in the background; every write lands in
// node-a's memory, and a write after node-a deregistered the layout is refused (a refreshed answer does not
// outlive the layout).
func TestWritesToAPeerLayoutLandWhileItsAnswerIsAskedAgain(t *testing.T) {
	ctx, ca, cb := twoPeerNodes(t)
	const bs, blocks = 4096, 16
	la, _, memA := hostLayout(ctx, t, ca, "kv-r", bs, blocks, client.PublishLayout("kv-r"))
	lb, _, memB := hostLayout(ctx, t, cb, "kv-r-b", bs, blocks)
	remote := client.ToLayoutSegment("node-a", "kv-r")
	start := time.Now()
	for k, at := range []time.Duration{0, 1100 * time.Millisecond, 1600 * time.Millisecond, 2300 * time.Millisecond, 3500 * time.Millisecond} {
		time.Sleep(time.Until(start.Add(at)))
		if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{uint32(k)}, remote, []uint32{uint32(k + 8)}, client.TransferOptions{}); err != nil {
			t.Fatalf("write %d, %v after the first: %v", k, time.Since(start), err)
		}
		for r := range 2 {
			if !bytes.Equal(memA[r].Bytes[(k+8)*bs:(k+9)*bs], memB[r].Bytes[k*bs:(k+1)*bs]) {
				t.Fatalf("write %d did not land in region %d of node-a's layout", k, r)
			}
		}
	}
	time.Sleep(1100 * time.Millisecond) // the kept answer is due to be asked again
	if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{6}, remote, []uint32{14}, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ca.DeregisterLayout(ctx, la); err != nil {
		t.Fatal(err)
	}
	kept := bytes.Clone(memA[0].Bytes)
	time.Sleep(200 * time.Millisecond) // a background question under way has answered
	if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{7}, remote, []uint32{15}, client.TransferOptions{}); client.Code(err).String() != "NotFound" {
		t.Fatalf("a write after node-a deregistered the layout: %v, want NotFound", err)
	}
	if !bytes.Equal(memA[0].Bytes, kept) {
		t.Fatal("the deregistered layout's memory was written")
	}
}

// twoPeerNodes runs node-a and node-b of one pool, peers over TLS, and dials each one's socket; the context
// ends 30 s on, or with the test.
func twoPeerNodes(t *testing.T) (ctx context.Context, ca, cb *client.Client) {
	return twoPeerNodesVia(t, nil)
}

// twoPeerNodesVia is twoPeerNodes with node-b reaching node-a's agent channel through a relay behind gate (nil:
// directly), so a test can stall node-a as node-b sees it.
func twoPeerNodesVia(t *testing.T, gate *enginetest.Gate) (ctx context.Context, ca, cb *client.Client) {
	t.Helper()
	a, b := peerConfigs(t, 64)
	if gate != nil {
		b.StaticPeers = "node-a=" + gatedRelay(t, gate, a.PeerListen) + ",node-b=" + b.PeerListen
	}
	runStackOn(t, a, topology.Report{}, Deps{})
	runStackOn(t, b, topology.Report{}, Deps{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx, dialNode(ctx, t, a), dialNode(ctx, t, b)
}

// peerConfigs are node-a's and node-b's configs in one pool, peers over TLS on ports of their own, each holding up
// to maxRegions regions.
func peerConfigs(t *testing.T, maxRegions int) (a, b Config) {
	t.Helper()
	tlsDir := poolCertDir(t, "infer", "kv")
	epA, epB := freePort(t), freePort(t)
	base := Config{PoolNamespace: "infer", PoolName: "kv", HostRoot: "/", AllowLocal: true, SocketGID: -1, TLSDir: tlsDir,
		DataListen: "127.0.0.1:0", MaxRegions: maxRegions, MaxRegisteredBytes: 1 << 30, MaxInFlight: 16,
		StaticPeers: "node-a=" + epA + ",node-b=" + epB}
	a, b = base, base
	a.NodeName, a.SocketDir, a.PeerListen = "node-a", t.TempDir(), epA
	b.NodeName, b.SocketDir, b.PeerListen = "node-b", t.TempDir(), epB
	return a, b
}

// gatedRelay relays connections to target through a listener behind gate and returns its address: while the gate
// is shut, what either side sends waits.
func gatedRelay(t *testing.T, gate *enginetest.Gate, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	gated := gate.Listener(ln)
	go func() {
		for {
			in, err := gated.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	return ln.Addr().String()
}

// TestAStalledOwnerHoldsNoWriteThroughAKeptAnswer: node-b writes into a layout node-a published while node-a, as
// node-b reaches it, stalls. Writes while node-b's kept answer lasts land without waiting for the question asked
// again in the background (which the stall holds); once the answer expired, a write must ask in its own call and
// fails within its timeout instead of waiting for the owner; when node-a answers again, writes land again.
func TestAStalledOwnerHoldsNoWriteThroughAKeptAnswer(t *testing.T) {
	gate := &enginetest.Gate{}
	ctx, ca, cb := twoPeerNodesVia(t, gate)
	const bs, blocks = 4096, 16
	_, _, memA := hostLayout(ctx, t, ca, "kv-s", bs, blocks, client.PublishLayout("kv-s"))
	lb, _, memB := hostLayout(ctx, t, cb, "kv-s-b", bs, blocks)
	remote := client.ToLayoutSegment("node-a", "kv-s")
	write := func(k int, timeout time.Duration) error {
		_, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{uint32(k)}, remote, []uint32{uint32(k + 8)}, client.TransferOptions{Timeout: timeout})
		return err
	}
	landed := func(k int) bool { return bytes.Equal(memA[0].Bytes[(k+8)*bs:(k+9)*bs], memB[0].Bytes[k*bs:(k+1)*bs]) }
	if err := write(0, 0); err != nil || !landed(0) {
		t.Fatalf("the first write: %v (landed: %v)", err, landed(0))
	}
	resolved := time.Now()
	release := gate.Shut(t)
	defer release()
	// Past the age at which the kept answer is asked again, and well before it expires: each write bounded by
	// 1 s, so one that waited for the owner fails as such.
	for k, at := range []time.Duration{1100 * time.Millisecond, 1300 * time.Millisecond, 1500 * time.Millisecond} {
		time.Sleep(time.Until(resolved.Add(at)))
		began := time.Now()
		if err := write(k+1, time.Second); err != nil || !landed(k+1) {
			t.Fatalf("write %d while node-a stalls, %v after it was resolved: %v (landed: %v)", k+1, time.Since(resolved), err, landed(k+1))
		}
		if took := time.Since(began); took > 500*time.Millisecond {
			t.Fatalf("write %d took %v: it waited for the stalled owner", k+1, took)
		}
	}
	time.Sleep(time.Until(resolved.Add(2400 * time.Millisecond))) // the kept answer has expired
	began := time.Now()
	err := write(4, 300*time.Millisecond)
	if client.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a write that had to ask a stalled owner: %v, want DeadlineExceeded", err)
	}
	if took := time.Since(began); took > time.Second {
		t.Fatalf("a write asking a stalled owner took %v with a timeout of 300ms", took)
	}
	release()
	for k := 5; k < 8; k++ {
		if err := write(k, 0); err != nil || !landed(k) {
			t.Fatalf("write %d once node-a answers again: %v (landed: %v)", k, err, landed(k))
		}
	}
}

// TestAPeersLayoutResolvesToItsGeometry: a consumer on node-b that starts before its producer on node-a asks for
// the producer's layout by name: NotFound until it is published, then its geometry (as the block transfer that
// follows finds it), and NotFound again once node-a deregistered it.
func TestAPeersLayoutResolvesToItsGeometry(t *testing.T) {
	ctx, ca, cb := twoPeerNodes(t)
	if _, err := cb.ResolveLayoutSegment(ctx, "node-a", "kv-g"); client.Code(err) != codes.NotFound {
		t.Fatalf("resolving a layout node-a has not published: %v, want NotFound", err)
	}
	start := time.Now()
	if _, err := cb.ResolveLayoutSegment(ctx, "node-nowhere", "kv-g"); err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("resolving a layout on a node that is not in the pool: %v after %v, want a refusal at once", err, time.Since(start))
	}
	const bs, blocks = 4096, 16
	la, _, memA := hostLayout(ctx, t, ca, "kv-g", bs, blocks, client.PublishLayout("kv-g"))
	lb, _, memB := hostLayout(ctx, t, cb, "kv-g-b", bs, blocks)
	g, err := cb.ResolveLayoutSegment(ctx, "node-a", "kv-g")
	if err != nil {
		t.Fatalf("resolving node-a's layout: %v", err)
	}
	if g.GetBlockBytes() != bs || g.GetBlocks() != blocks || g.GetRegions() != uint32(len(memA)) {
		t.Fatalf("node-a's layout resolved to %v, want %d blocks of %d bytes in %d regions", g, blocks, bs, len(memA))
	}
	if _, err := cb.TransferBlocks(ctx, client.Write, lb, []uint32{3}, client.ToLayoutSegment("node-a", "kv-g"), []uint32{7}, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	for r := range memA {
		if !bytes.Equal(memA[r].Bytes[7*bs:8*bs], memB[r].Bytes[3*bs:4*bs]) {
			t.Fatalf("block 3 of node-b's region %d did not land as block 7 of node-a's", r)
		}
	}
	if err := ca.DeregisterLayout(ctx, la); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.ResolveLayoutSegment(ctx, "node-a", "kv-g"); client.Code(err) != codes.NotFound {
		t.Fatalf("resolving the layout node-a deregistered: %v, want NotFound", err)
	}
}
