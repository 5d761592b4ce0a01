// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// TestServerRefusesBadVectoredParts speaks the protocol directly, as a broken or hostile peer would: a
// vectored write with a part outside the region is refused with its payload consumed, and the connection goes
// on serving.
func TestServerRefusesBadVectoredParts(t *testing.T) {
	b := newEngine(t, "node-b", listen(t))
	mem := make([]byte, 4096)
	d := register(t, b, "node-b/1", mem)
	a := newEngine(t, "node-a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nc, _, err := a.dialConn(ctx, b.Addr(), "node-b")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(5 * time.Second))

	// roundTrip writes payload's parts, of 2 bytes each, at offs.
	roundTrip := func(id uint64, payload string, offs ...uint64) respHeader {
		t.Helper()
		parts := make([]part, len(offs))
		for k, off := range offs {
			parts[k] = part{remoteOff: off, n: 2}
		}
		msg := appendParts(appendReqHeader(nil, reqHeader{op: opWriteV, id: id, length: uint64(len(payload)), mem: d.ID}), parts)
		msg = append(msg, payload...)
		if _, err := nc.Write(msg); err != nil {
			t.Fatal(err)
		}
		hdr := make([]byte, respHeaderSize)
		if _, err := io.ReadFull(nc, hdr); err != nil {
			t.Fatal(err)
		}
		h := parseRespHeader(hdr)
		if _, err := io.CopyN(io.Discard, nc, int64(h.length)); err != nil {
			t.Fatal(err)
		}
		return h
	}
	if h := roundTrip(1, "okxy", 0, 4095); h.status != statusBounds || h.id != 1 {
		t.Fatalf("out-of-bounds part answered %+v, want status %d", h, statusBounds)
	}
	if mem[0] != 0 {
		t.Fatal("a refused vectored write changed memory")
	}
	if h := roundTrip(2, "abcd", 10, 100); h.status != statusOK || h.id != 2 {
		t.Fatalf("valid vectored write answered %+v", h)
	}
	view, unpin, err := b.Pin(d.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	if string(view[10:12]) != "ab" || string(view[100:102]) != "cd" {
		t.Fatal("vectored write did not land")
	}
}

// countingConn is a net.Conn (not a TCP one) that records its writes.
type countingConn struct {
	net.Conn
	writes int
	got    []byte
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes++
	c.got = append(c.got, b...)
	return len(b), nil
}

// TestWriteBuffersGathersSmallParts: over a connection without vectored writes (TLS), 1,024 parts of 720 B go
// as one write, large buffers as their own, and the bytes arrive in order.
func TestWriteBuffersGathersSmallParts(t *testing.T) {
	var pool sync.Pool
	var bufs net.Buffers
	var want []byte
	hdr := []byte("header")
	bufs, want = append(bufs, hdr), append(want, hdr...)
	for i := range 1024 {
		p := bytes.Repeat([]byte{byte(i)}, 720)
		bufs, want = append(bufs, p), append(want, p...)
	}
	big := bytes.Repeat([]byte{7}, coalesceMin)
	bufs, want = append(bufs, big, []byte("tail")), append(append(want, big...), "tail"...)
	c := &countingConn{}
	if err := writeBuffers(c, bufs, &pool); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.got, want) {
		t.Fatal("the bytes written differ from the buffers, in order")
	}
	// header and parts (737 KB) in one write, the large buffer, the tail.
	if c.writes != 3 {
		t.Fatalf("%d writes, want 3", c.writes)
	}
	// More than coalesceMax of small parts is cut, never one write per part.
	bufs, c = nil, &countingConn{}
	for range 4096 {
		bufs = append(bufs, make([]byte, 720))
	}
	if err := writeBuffers(c, bufs, &pool); err != nil || c.writes != 3 || len(c.got) != 4096*720 {
		t.Fatalf("4,096 parts: %d writes of %d bytes (%v), want 3 of %d", c.writes, len(c.got), err, 4096*720)
	}
}

// TestNotificationsFromPeersAreBounded: a peer's notification naming more regions than a transfer has items is
// refused as it is decoded, a region it repeats is delivered once, and a block transfer's many tags pass.
func TestNotificationsFromPeersAreBounded(t *testing.T) {
	many := make([]engines.MemoryID, engines.MaxNotifyEntries+1)
	for i := range many {
		many[i] = "node-b/1"
	}
	if _, err := decodeNotification(encodeNotification(engines.Notification{From: "node-a", Regions: many})); err == nil {
		t.Errorf("a notification of %d regions was decoded", len(many))
	}
	// A block transfer planned item by item has a tag a block and region pair: more than MaxNotifyEntries.
	if n, err := decodeNotification(encodeNotification(engines.Notification{From: "node-a", Regions: many[:1],
		Tags: make([]engines.Tag, 600*128)})); err != nil || len(n.Tags) != 600*128 {
		t.Errorf("a block transfer's notification of %d tags: %d tags, %v", 600*128, len(n.Tags), err)
	}
	n, err := decodeNotification(encodeNotification(engines.Notification{From: "node-a", Regions: many[:engines.MaxNotifyEntries],
		Tags: []engines.Tag{1}, Payload: []byte("p")}))
	if err != nil || len(n.Regions) != 1 || n.Regions[0] != "node-b/1" || string(n.Payload) != "p" {
		t.Fatalf("a region repeated %d times: %d regions, %v", engines.MaxNotifyEntries, len(n.Regions), err)
	}
}
