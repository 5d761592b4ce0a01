// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// TestStagedServerHostile speaks the protocol to a node serving a staged GPU region, as a broken or hostile
// peer would: a request larger than a staging slot is refused with its payload consumed; a write whose payload
// stops half way (the peer died) leaves the GPU region untouched; other regions are unaffected.
func TestStagedServerHostile(t *testing.T) {
	sb := newFakeStager(t)
	b := stagedEngine(t, "node-b", true, sb, nil)
	gpu := make([]byte, 2*stageSlot)
	d := registerGPU(t, b, sb, "b/gpu", gpu)
	other := make([]byte, 4096)
	od := register(t, b, "b/other", other)
	a := stagedEngine(t, "node-a", false, nil, nil)
	dial := func() io.ReadWriteCloser {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		nc, _, err := a.dialConn(ctx, b.Addr(), "node-b")
		if err != nil {
			t.Fatal(err)
		}
		nc.SetDeadline(time.Now().Add(10 * time.Second))
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	nc := dial()
	answer := func() respHeader {
		t.Helper()
		hdr := make([]byte, respHeaderSize)
		for {
			if _, err := io.ReadFull(nc, hdr); err != nil {
				t.Fatal(err)
			}
			if h := parseRespHeader(hdr); h.op != opKeepalive {
				if _, err := io.CopyN(io.Discard, nc, int64(h.length)); err != nil {
					t.Fatal(err)
				}
				return h
			}
		}
	}
	big := stageSlot + 16
	msg := appendReqHeader(nil, reqHeader{op: opWrite, id: 1, length: uint64(big), mem: d.ID})
	if _, err := nc.Write(append(msg, make([]byte, big)...)); err != nil {
		t.Fatal(err)
	}
	if h := answer(); h.id != 1 || h.status != statusInvalid {
		t.Fatalf("oversized staged write answered %+v, want status %d", h, statusInvalid)
	}
	msg = appendReqHeader(nil, reqHeader{op: opWrite, id: 2, off: 8, length: 4, mem: d.ID})
	if _, err := nc.Write(append(msg, "abcd"...)); err != nil {
		t.Fatal(err)
	}
	if h := answer(); h.id != 2 || h.status != statusOK {
		t.Fatalf("staged write after a refusal answered %+v", h)
	}
	pinned := func(check func()) {
		t.Helper()
		// The pin orders this test after the serving goroutine's copy (it unpins once the copy finished).
		_, unpin, err := b.reg.Pin(d.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer unpin()
		check()
	}
	pinned(func() {
		if string(gpu[8:12]) != "abcd" {
			t.Fatal("staged write did not land")
		}
	})
	// Vectored writes of whole equal blocks go to the GPU by block index; one block past the region refuses the
	// request, nothing of it lands, and the connection goes on. Unaligned parts go as segments.
	vecWrite := func(id uint64, fill byte, offs ...uint64) {
		t.Helper()
		parts := make([]part, len(offs))
		for k, off := range offs {
			parts[k] = part{remoteOff: off, n: 512}
		}
		msg := appendParts(appendReqHeader(nil, reqHeader{op: opWriteV, id: id, length: uint64(512 * len(offs)), mem: d.ID}), parts)
		if _, err := nc.Write(append(msg, bytes.Repeat([]byte{fill}, 512*len(offs))...)); err != nil {
			t.Fatal(err)
		}
	}
	byIndex := sb.blockCalls.Load()
	vecWrite(10, 0xb1, 512*7, uint64(len(gpu)), 512*3)
	if h := answer(); h.id != 10 || h.status != statusBounds {
		t.Fatalf("a vectored write with a block past the region answered %+v, want status %d", h, statusBounds)
	}
	vecWrite(11, 0xb2, 512*9, 512*(1<<40), 512*3)
	if h := answer(); h.id != 11 || h.status != statusBounds {
		t.Fatalf("a vectored write with a block index past 2^32 answered %+v, want status %d", h, statusBounds)
	}
	vecWrite(12, 0xb3, 512*5, 512*2)
	if h := answer(); h.id != 12 || h.status != statusOK {
		t.Fatalf("a vectored write of two blocks answered %+v", h)
	}
	vecWrite(13, 0xb4, 512*20+16, 512*30)
	if h := answer(); h.id != 13 || h.status != statusOK {
		t.Fatalf("a vectored write of unaligned parts answered %+v", h)
	}
	pinned(func() {
		if bytes.Contains(gpu, []byte{0xb1}) || bytes.Contains(gpu, []byte{0xb2}) {
			t.Fatal("a refused vectored write reached the GPU region")
		}
		for _, at := range []int{512 * 5, 512 * 2} {
			if !bytes.Equal(gpu[at:at+512], bytes.Repeat([]byte{0xb3}, 512)) {
				t.Fatalf("block at %d of a vectored write did not land", at)
			}
		}
		for _, at := range []int{512*20 + 16, 512 * 30} {
			if !bytes.Equal(gpu[at:at+512], bytes.Repeat([]byte{0xb4}, 512)) {
				t.Fatalf("part at %d of an unaligned vectored write did not land", at)
			}
		}
		if got := sb.blockCalls.Load() - byIndex; got != 1 {
			t.Fatalf("%d copies by block index, want 1 (the aligned write; the refused ones never reach the stager)", got)
		}
	})
	clear(gpu)
	copy(gpu[8:], "abcd")
	copies := sb.fromHost.Load()
	// Half a payload, then the connection closes: nothing of it may reach the GPU region.
	nc2 := dial()
	msg = appendReqHeader(nil, reqHeader{op: opWrite, id: 3, off: 1 << 20, length: 1 << 20, mem: d.ID})
	if _, err := nc2.Write(append(msg, bytes.Repeat([]byte{0xee}, 512<<10)...)); err != nil {
		t.Fatal(err)
	}
	nc2.Close()
	time.Sleep(100 * time.Millisecond)
	pinned(func() {
		if bytes.Contains(gpu, []byte{0xee}) || sb.fromHost.Load() != copies {
			t.Fatalf("a truncated write reached the GPU region (%d copies in, %d before)", sb.fromHost.Load(), copies)
		}
	})
	if !bytes.Equal(other, make([]byte, 4096)) || od.ID == "" {
		t.Fatal("another region changed")
	}
	// The first connection still serves: a staged read answers from the GPU region.
	msg = appendReqHeader(nil, reqHeader{op: opRead, id: 4, off: 8, length: 4, mem: d.ID})
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, respHeaderSize+4)
	if _, err := io.ReadFull(nc, hdr); err != nil {
		t.Fatal(err)
	}
	if h := parseRespHeader(hdr); h.id != 4 || h.status != statusOK || string(hdr[respHeaderSize:]) != "abcd" {
		t.Fatalf("staged read answered %+v %q", h, hdr[respHeaderSize:])
	}
}

// TestStagedReadAnswerHostile feeds the connection that asked for a staged block chunk answers a broken or
// hostile peer could send: of another length, another op, a payload or refusal that stops half way, an
// acknowledgement of a write with a body. Each is refused at once (the stream is given up) and the chunk fails
// with the peer, so it never reaches the GPU copy and does not wait for its transfer's deadline; a whole answer
// lands in the slot in part order, as the parts were asked for.
func TestStagedReadAnswerHostile(t *testing.T) {
	const bs, blocks = 720, 64
	payload := make([]byte, bs*blocks)
	for i := range payload {
		payload[i] = byte(i*7 + i/bs)
	}
	ch := chunk{n: bs * blocks}
	for k := range blocks {
		ch.parts = append(ch.parts, part{localOff: uint64(k) * bs, remoteOff: uint64((k*37)%blocks) * bs, n: bs})
	}
	for name, c := range map[string]struct {
		write   bool // the request is a staged write, answered by an acknowledgement
		op      byte // the answer's (opReadV, or opWriteV for a write, when 0)
		status  byte
		answer  []byte
		length  uint64
		wantErr string
	}{
		"whole":                       {answer: payload, length: uint64(len(payload))},
		"another length":              {answer: payload[:bs], length: bs, wantErr: "read answer of 720 bytes"},
		"payload cut short":           {answer: payload[:len(payload)/2], length: uint64(len(payload)), wantErr: "EOF"},
		"another op":                  {op: opWriteV, answer: payload, length: uint64(len(payload)), wantErr: "answer op"},
		"refusal cut short":           {status: statusRefused, answer: []byte("no"), length: 100, wantErr: "EOF"},
		"acknowledgement with a body": {write: true, answer: payload[:bs], length: bs, wantErr: "acknowledgement with 720 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			e, err := New(Options{Node: "node-a", Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			local, remote := net.Pipe()
			defer remote.Close()
			p := &peer{e: e, node: "node-b", name: "node-b (hostile)", dead: make(chan struct{})}
			cn := &conn{p: p, nc: local, raw: local, wsem: make(chan struct{}, 1), pending: map[uint64]*request{}}
			p.conns = []*conn{cn}
			slot := make([]byte, 4<<20)
			op, answerOp := byte(opRead), byte(opReadV)
			if c.write {
				op, answerOp = opWrite, opWriteV
			}
			if c.op != 0 {
				answerOp = c.op
			}
			r := slotRequest(op, "node-b/1", ch, slot)
			var got error
			settled := false
			r.done = func(err error) { got, settled = err, true }
			r.id = 1
			cn.pending[1] = r
			br := bufio.NewReader(bytes.NewReader(c.answer))
			herr := cn.handle(br, respHeader{op: answerOp, status: c.status, id: 1, length: c.length})
			if c.wantErr == "" {
				if herr != nil || !settled || got != nil {
					t.Fatalf("a whole answer: handle %v, settled %v with %v", herr, settled, got)
				}
				if !bytes.Equal(slot[:len(payload)], payload) {
					t.Fatal("the answer is not in the slot in part order")
				}
				return
			}
			if herr == nil || !strings.Contains(herr.Error(), c.wantErr) {
				t.Fatalf("handle: %v, want an error with %q", herr, c.wantErr)
			}
			cn.p.kill(herr) // what the receive loop does with it
			if !settled || got == nil {
				t.Fatalf("the chunk settled %v with %v: it must fail, so its copy into the GPU is never queued", settled, got)
			}
			var pl *engines.PeerLostError
			if !errors.As(got, &pl) || pl.Peer != "node-b (hostile)" {
				t.Fatalf("the chunk failed with %v, want a PeerLostError naming the peer", got)
			}
		})
	}
}
