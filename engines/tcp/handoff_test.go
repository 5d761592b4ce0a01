// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// TestStagedChunkBytes: a staged plan is cut into about two chunks per connection (a block list whose chunks would
// be half a slot or more into whole slots), within the bounds: never below stageChunkMin (unless the plan is
// smaller), never above a slot, always aligned.
func TestStagedChunkBytes(t *testing.T) {
	for _, tc := range []struct {
		total  uint64
		conns  int
		blocks bool
		want   int
	}{
		{total: 1 << 30, conns: 4, want: stageSlot},                                                      // large: whole slots
		{total: 11059200, conns: 4, want: 1408 << 10},                                                    // 11 MB: 8 chunks of 1.375 MiB
		{total: 11059200, conns: 4, blocks: true, want: 1408 << 10},                                      // a block list of 11 MB: the same 8
		{total: 11059200, conns: 1, want: stageSlot},                                                     // one connection: halves would exceed a slot
		{total: 16 << 20, conns: 4, blocks: true, want: stageSlot},                                       // a layer's 1,024 x 16 KiB: 4 slots
		{total: 16 << 20, conns: 4, want: stageSlot / 2},                                                 // the same bytes contiguous: 8 halves
		{total: 16<<20 - 8*stageChunkAlign, conns: 4, blocks: true, want: stageSlot/2 - stageChunkAlign}, // just under
		{total: 4096, conns: 4, want: stageChunkMin},                                                     // tiny: the minimum (one chunk carries it)
		{total: 8 * stageChunkMin, conns: 4, want: stageChunkMin},                                        // exactly two minimum chunks per connection
		{total: 8 * stageChunkMin, conns: 4, blocks: true, want: stageChunkMin},                          // small block lists as contiguous
		{total: 100 << 20, conns: 64, want: 832 << 10},                                                   // many connections: 100 MiB / 128, aligned up
	} {
		got := stagedChunkBytes(tc.total, tc.conns, tc.blocks)
		if got != tc.want {
			t.Errorf("stagedChunkBytes(%d, %d, %v) = %d, want %d", tc.total, tc.conns, tc.blocks, got, tc.want)
		}
		if got%stageChunkAlign != 0 || got > stageSlot || got < stageChunkMin {
			t.Errorf("stagedChunkBytes(%d, %d, %v) = %d: outside [%d, %d] or not a multiple of %d", tc.total, tc.conns, tc.blocks, got, stageChunkMin, stageSlot, stageChunkAlign)
		}
	}
}

// TestRecvSpinning: a value sent while the receiver polls, one sent after it parked, and a closed channel are
// all received as <-ch would.
func TestRecvSpinning(t *testing.T) {
	ch := make(chan int, 1)
	go func() { ch <- 1 }()
	if v, ok := recvSpinning(ch, time.Second); v != 1 || !ok {
		t.Fatalf("got %d, %v while polling; want 1, true", v, ok)
	}
	go func() { time.Sleep(20 * time.Millisecond); ch <- 2 }()
	if v, ok := recvSpinning(ch, time.Microsecond); v != 2 || !ok {
		t.Fatalf("got %d, %v after parking; want 2, true", v, ok)
	}
	close(ch)
	if v, ok := recvSpinning(ch, time.Millisecond); v != 0 || ok {
		t.Fatalf("got %d, %v from a closed channel; want 0, false", v, ok)
	}
}

// TestCountdown: zero closes exactly when the last piece is done, and not before.
func TestCountdown(t *testing.T) {
	c := newCountdown()
	c.Add(1)
	c.Add(2)
	c.Done()
	c.Done()
	select {
	case <-c.zero:
		t.Fatal("zero closed with one piece outstanding")
	default:
	}
	c.Done()
	select {
	case <-c.zero:
	default:
		t.Fatal("zero not closed once every piece was done")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a Done below zero did not panic")
		}
	}()
	c.Done()
}

// TestStagedCompleterPeerStopsReading: a peer connection that asks for staged reads of GPU memory and never
// reads the answers stalls only itself. Its connection's completer blocks writing an answer, the serving loop
// behind it stops taking requests, and both end within the peer timeout: the connection is closed. Meanwhile
// another peer's staged write into the same GPU region lands, and afterwards the region is still served.
func TestStagedCompleterPeerStopsReading(t *testing.T) {
	const peerTimeout = 500 * time.Millisecond
	sb := newFakeStager(t)
	b := stagedEngine(t, "node-b", true, sb, func(o *Options) { o.PeerTimeout = peerTimeout })
	gpu := make([]byte, 2*stageSlot)
	d := registerGPU(t, b, sb, "b/gpu", gpu)

	stalled := stagedEngine(t, "node-a", false, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, _, err := stalled.dialConn(ctx, b.Addr(), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	// Far more answer bytes than the sockets buffer; each request is a whole slot.
	var reqs []byte
	for id := uint64(1); id <= 32; id++ {
		reqs = appendReqHeader(reqs, reqHeader{op: opRead, id: id, off: 0, length: stageSlot, mem: d.ID})
	}
	nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(reqs); err != nil {
		t.Fatal(err)
	}

	// Another peer writes into the region while that connection is stuck.
	other := stagedEngine(t, "node-c", false, nil, nil)
	src := seq(64<<10, 9)
	sd := register(t, other, "c/src", src)
	imp(t, other, d)
	start := time.Now()
	if _, err := transfer(t, other, []engines.Item{{Src: sd.ID, Dst: d.ID, DstOffset: stageSlot, Size: uint64(len(src))}}, 5*time.Second); err != nil {
		t.Fatalf("a staged write beside a stalled peer connection: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a staged write beside a stalled peer connection took %v", took)
	}
	_, unpin, err := b.reg.Pin(d.ID)
	if err != nil {
		t.Fatal(err)
	}
	landed := bytes.Equal(gpu[stageSlot:stageSlot+len(src)], src)
	unpin()
	if !landed {
		t.Fatal("the other peer's staged write did not land")
	}

	// The stalled connection is closed once an answer could not be written within the peer timeout: reading it
	// after that drains what was sent and then ends.
	time.Sleep(4 * peerTimeout)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the stalled connection was still open after 10 s (%d bytes read)", n)
	}
	if n >= 32*stageSlot {
		t.Fatalf("read %d bytes: every answer was sent, so nothing stalled", n)
	}

	// The region is still served to a new connection of the same peer.
	again := stagedEngine(t, "node-a", false, nil, nil)
	dst := make([]byte, len(src))
	dd := register(t, again, "a/dst", dst)
	imp(t, again, d)
	if _, err := transfer(t, again, []engines.Item{{Src: d.ID, SrcOffset: stageSlot, Dst: dd.ID, Size: uint64(len(dst))}}, 5*time.Second); err != nil {
		t.Fatalf("a staged read after the stalled connection ended: %v", err)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("the staged read after the stalled connection returned other bytes")
	}
}

// TestStagedChunkSentOnceGathered: a staged write sends a chunk as soon as its gather finished, before the
// queue of gathers is full: the first gather finishes while the second is queued, and the third is queued only
// once the peer has received the first chunk (a producer that waits for a full queue before sending anything
// never gets there).
func TestStagedChunkSentOnceGathered(t *testing.T) {
	const size = 16 * stageChunkMin
	w := newStagedWriteBed(t, size, 5)
	sa, a, b, local, ld, rd := w.sa, w.a, w.b, w.local, w.ld, w.rd
	chunk := uint64(stagedChunkBytes(size, defaultConnsPerPeer, false))
	if size/chunk <= gathersAhead {
		t.Fatalf("%d chunks: the test needs more than %d", size/chunk, gathersAhead)
	}
	sa.queueToHostErr = func(k int) error {
		switch k {
		case 2:
			time.Sleep(50 * time.Millisecond) // the first gather finishes meanwhile
			return nil
		case 3:
		default:
			return nil
		}
		for deadline := time.Now().Add(5 * time.Second); b.Stats().ServedIn < chunk; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("the first chunk was not sent while the third gather was being queued")
			}
		}
		return nil
	}
	if _, err := transfer(t, a, []engines.Item{{Src: ld.ID, Dst: rd.ID, Size: size}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	view, unpin, err := b.Pin(rd.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if !bytes.Equal(view, local) {
		t.Fatal("written bytes differ")
	}
}
