// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"crypto/cipher"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// sealedPair returns the two ends of a loopback TCP connection speaking sealed records with one secret, as
// newSealedConn sets them up from a TLS session, and the raw client end for writing forged bytes.
func sealedPair(t testing.TB) (client, server *sealedConn, rawClient net.Conn) {
	t.Helper()
	ln := listen(t)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	rc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	rs, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { rc.Close(); rs.Close() })
	secret := bytes.Repeat([]byte{7}, 64)
	keys := func(b []byte) *recordKeys {
		k, err := newRecordKeys(b)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	bufs := &sealBuffers{}
	client = &sealedConn{Conn: rc, bufs: bufs, wk: keys(secret[:32]), rk: keys(secret[32:])}
	server = &sealedConn{Conn: rs, bufs: bufs, wk: keys(secret[32:]), rk: keys(secret[:32])}
	return client, server, rc
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i%251) ^ seed
	}
	return b
}

func TestSealedRecordsRoundTrip(t *testing.T) {
	client, server, _ := sealedPair(t)
	sizes := []int{1, 720, recordMax - 1, recordMax, recordMax + 1, 3*recordMax + 17, 5 << 20}
	go func() {
		for i, n := range sizes {
			if _, err := client.Write(pattern(n, byte(i))); err != nil {
				t.Errorf("write of %d bytes: %v", n, err)
				return
			}
		}
	}()
	for i, n := range sizes {
		got := make([]byte, n)
		// Odd read sizes take records apart (copies out of the record buffer) and whole (opened in place).
		step := []int{1, 100, recordMax, n}[i%4]
		for off := 0; off < n; {
			m, err := server.Read(got[off:min(n, off+step)])
			if err != nil {
				t.Fatalf("reading %d bytes at %d: %v", n, off, err)
			}
			off += m
		}
		if !bytes.Equal(got, pattern(n, byte(i))) {
			t.Fatalf("write %d (%d bytes) arrived altered", i, n)
		}
	}
	if client.wseq != server.rseq || client.wseq == 0 {
		t.Fatalf("records sealed %d, opened %d", client.wseq, server.rseq)
	}
}

// A Read larger than what the peer wrote returns at the end of the peer's Write: the reader waits for another
// record only while the last one said more follow.
func TestSealedRecordsReadReturnsAtWriteEnd(t *testing.T) {
	client, server, _ := sealedPair(t)
	for _, n := range []int{recordMax, 2*recordMax + 5, recordsPerFlush*recordMax + 1} {
		msg := pattern(n, byte(n))
		if _, err := client.Write(msg); err != nil {
			t.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 0, n)
		buf := make([]byte, 64<<20)
		for len(got) < n {
			m, err := server.Read(buf)
			if err != nil {
				t.Fatalf("reading a %d-byte write into a larger buffer: %v after %d bytes", n, err, len(got))
			}
			got = append(got, buf[:m]...)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("a %d-byte write arrived altered", n)
		}
	}
}

func TestSealedRecordsRekeyAcrossEpochs(t *testing.T) {
	client, server, _ := sealedPair(t)
	client.wseq, server.rseq = rekeyEvery-2, rekeyEvery-2
	msg := pattern(5*recordMax, 3) // records rekeyEvery-2 .. rekeyEvery+2
	go client.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(server, got); err != nil {
		t.Fatalf("reading across a key change: %v", err)
	}
	if !bytes.Equal(got, msg) || server.rk.epoch != 1 || client.wk.epoch != 1 {
		t.Fatalf("equal %v, epochs %d/%d, want 1/1", bytes.Equal(got, msg), client.wk.epoch, server.rk.epoch)
	}
	// A reader one epoch behind cannot open the writer's records.
	client.wseq = 3 * rekeyEvery
	go client.Write([]byte("late"))
	if _, err := server.Read(make([]byte, 16)); !errors.Is(err, errRecord) {
		t.Fatalf("record of another epoch: %v, want a record error", err)
	}
}

func TestSealedRecordsRefuseForgery(t *testing.T) {
	for name, forge := range map[string]func(rec []byte) []byte{
		"flipped ciphertext": func(rec []byte) []byte { rec[recordHeader+3] ^= 1; return rec },
		"flipped tag":        func(rec []byte) []byte { rec[len(rec)-1] ^= 0x80; return rec },
		"length changed":     func(rec []byte) []byte { rec[3]--; return rec[:len(rec)-1] },
		"record replayed":    func(rec []byte) []byte { return append(append([]byte{}, rec...), rec...) },
		"oversized length":   func([]byte) []byte { return []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3} },
		"zero length":        func([]byte) []byte { return make([]byte, 64) },
	} {
		t.Run(name, func(t *testing.T) {
			client, server, raw := sealedPair(t)
			// Seal one record through a capturing writer, then send it forged.
			capture := &sealedConn{Conn: &captureConn{}, bufs: client.bufs, wk: client.wk}
			if _, err := capture.Write([]byte("kv block bytes")); err != nil {
				t.Fatal(err)
			}
			rec := capture.Conn.(*captureConn).buf.Bytes()
			if _, err := raw.Write(forge(rec)); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 64)
			first := true
			var err error
			for range 3 {
				var n int
				n, err = server.Read(got)
				if err != nil {
					break
				}
				if !first || string(got[:n]) != "kv block bytes" || name != "record replayed" {
					t.Fatalf("forged stream read %q", got[:n])
				}
				first = false
			}
			if !errors.Is(err, errRecord) {
				t.Fatalf("forged stream: %v, want a record error", err)
			}
			if _, again := server.Read(got); !errors.Is(again, errRecord) {
				t.Fatalf("the stream stays failed: %v", again)
			}
		})
	}
}

// captureConn keeps what is written to it.
type captureConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *captureConn) Write(p []byte) (int, error) { return c.buf.Write(p) }

func TestSealedRecordsResumeAfterDeadline(t *testing.T) {
	client, server, raw := sealedPair(t)
	capture := &sealedConn{Conn: &captureConn{}, bufs: client.bufs, wk: client.wk}
	msg := pattern(recordMax, 9)
	if _, err := capture.Write(msg); err != nil {
		t.Fatal(err)
	}
	rec := capture.Conn.(*captureConn).buf.Bytes()
	for _, part := range [][]byte{rec[:2], rec[2 : len(rec)/2]} {
		if _, err := raw.Write(part); err != nil {
			t.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if n, err := server.Read(make([]byte, recordMax)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("partial record: %d bytes, %v; want a deadline", n, err)
		}
	}
	server.SetReadDeadline(time.Time{})
	if _, err := raw.Write(rec[len(rec)/2:]); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, recordMax)
	if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("record resumed after two deadlines: %v, equal %v", err, bytes.Equal(got, msg))
	}
}

// writeLog passes writes on and keeps, for each, its size and when it began.
type writeLog struct {
	net.Conn
	mu    sync.Mutex
	sizes []int
	at    []time.Time
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.sizes, w.at = append(w.sizes, len(p)), append(w.at, time.Now())
	w.mu.Unlock()
	return w.Conn.Write(p)
}

// reset forgets the writes logged so far and returns when the first of them began (zero if none).
func (w *writeLog) reset() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var first time.Time
	if len(w.at) > 0 {
		first = w.at[0]
	}
	w.sizes, w.at = w.sizes[:0], w.at[:0]
	return first
}

// A Write of several records makes its first system call with the first record alone, so that the rest is
// sealed while it goes out; later system calls carry up to recordsPerFlush whole records, and the reader gets
// every byte in order.
func TestSealedRecordsFirstRecordWrittenAlone(t *testing.T) {
	client, server, _ := sealedPair(t)
	log := &writeLog{Conn: client.Conn}
	client.Conn = log
	for _, n := range []int{720, recordMax, 737280, 2*recordsPerFlush*recordMax + 5} {
		log.reset()
		msg := pattern(n, byte(n))
		wrote := make(chan error, 1)
		go func() { _, err := client.Write(msg); wrote <- err }()
		got := make([]byte, n)
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("a %d-byte write: %v, equal %v", n, err, bytes.Equal(got, msg))
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		records := (n + recordMax - 1) / recordMax
		log.mu.Lock()
		sizes := append([]int(nil), log.sizes...)
		log.mu.Unlock()
		first := min(n, recordMax) + recordOverhead
		if sizes[0] != first {
			t.Fatalf("a %d-byte write (%d records) made its first system call of %d bytes, want one record of %d (writes %v)",
				n, records, sizes[0], first, sizes)
		}
		wantWrites := 1
		if records > 1 {
			wantWrites += (records - 1 + recordsPerFlush - 1) / recordsPerFlush
		}
		total := 0
		for i, size := range sizes {
			total += size
			if i > 0 && size > recordsPerFlush*(recordMax+recordOverhead) {
				t.Fatalf("a %d-byte write's system call %d carried %d bytes, more than %d records", n, i, size, recordsPerFlush)
			}
		}
		if len(sizes) != wantWrites || total != n+records*recordOverhead {
			t.Fatalf("a %d-byte write: system calls %v, want %d of %d bytes in all", n, sizes, wantWrites, n+records*recordOverhead)
		}
	}
}

// signalAEAD tells each record it opened.
type signalAEAD struct {
	cipher.AEAD
	opened chan<- int
}

func (a signalAEAD) Open(dst, nonce, ciphertext, data []byte) ([]byte, error) {
	out, err := a.AEAD.Open(dst, nonce, ciphertext, data)
	a.opened <- len(out)
	return out, err
}

// A record that arrived whole is opened while the next one of the same Write is still on its way: the reader
// does not wait for the batch.
func TestSealedRecordsOpenedWhileNextArrives(t *testing.T) {
	client, server, raw := sealedPair(t)
	capture := &sealedConn{Conn: &captureConn{}, bufs: client.bufs, wk: client.wk}
	msg := pattern(2*recordMax, 4)
	if _, err := capture.Write(msg); err != nil {
		t.Fatal(err)
	}
	wire := capture.Conn.(*captureConn).buf.Bytes()
	opened := make(chan int, 2)
	server.rk.aead = signalAEAD{server.rk.aead, opened}
	got := make([]byte, len(msg))
	read := make(chan error, 1)
	go func() { _, err := io.ReadFull(server, got); read <- err }()
	if _, err := raw.Write(wire[:recordHeader+recordMax+recordTag]); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-opened:
		if n != recordMax {
			t.Fatalf("opened %d bytes, want the first record's %d", n, recordMax)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first record was not opened while the second had not arrived")
	}
	if _, err := raw.Write(wire[recordHeader+recordMax+recordTag:]); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("two records: %v, equal %v", err, bytes.Equal(got, msg))
	}
}

// sealedConns says how many of an engine's dialed connections to node use sealed records, and how many exist.
func sealedConns(e *Engine, node string) (sealed, all int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.peers {
		if p.node != node {
			continue
		}
		for _, c := range p.conns {
			all++
			if _, ok := c.nc.(*sealedConn); ok {
				sealed++
			}
		}
	}
	return sealed, all
}

func TestSealedRecordsBetweenAgents(t *testing.T) {
	ca := newCA(t)
	for _, tc := range []struct {
		name               string
		oldClient, oldServ bool
		wantSealed         bool
	}{
		{name: "both offer sealed records", wantSealed: true},
		{name: "client predates them", oldClient: true},
		{name: "server predates them", oldServ: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Options{Node: "node-b", Listener: listen(t), TLS: ca.config(t, "node-b"), Logf: t.Logf, tlsRecordsOnly: tc.oldServ})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			a, err := New(Options{Node: "node-a", TLS: ca.config(t, "node-a"), Logf: t.Logf, tlsRecordsOnly: tc.oldClient})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			dstBuf := make([]byte, 9<<20)
			dst := register(t, b, "node-b/dst", dstBuf)
			payload := pattern(len(dstBuf), 5)
			if err := writeOnce(t, a, dst, payload); err != nil {
				t.Fatalf("write: %v", err)
			}
			view, unpin, err := b.Pin(dst.ID)
			if err != nil {
				t.Fatal(err)
			}
			equal := bytes.Equal(view, payload)
			unpin()
			if !equal {
				t.Fatal("bytes written differ")
			}
			// Read them back into a second local region: answers travel the other way.
			back := make([]byte, len(payload))
			local := register(t, a, "node-a/back", back)
			if err := moveWithin(a, 10*time.Second, item(engines.Item{Src: dst.ID, Dst: local.ID, Size: uint64(len(back)), Tag: 2})); err != nil {
				t.Fatalf("read: %v", err)
			}
			if view, unpin, err := a.Pin(local.ID); err != nil || !bytes.Equal(view, payload) {
				t.Fatalf("bytes read back differ (%v)", err)
			} else {
				unpin()
			}
			sealed, all := sealedConns(a, "node-b")
			if all == 0 || (tc.wantSealed && sealed != all) || (!tc.wantSealed && sealed != 0) {
				t.Fatalf("%d of %d connections sealed, want sealed=%v", sealed, all, tc.wantSealed)
			}
		})
	}
}

// Wire says what the engine does with the data: what an admin reads in GetInfo.
func TestWireReported(t *testing.T) {
	ca := newCA(t)
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{Node: "n"}, "plain TCP"},
		{Options{Node: "n", TLS: ca.config(t, "n"), tlsRecordsOnly: true}, "data over mutual TLS"},
		{Options{Node: "n", TLS: ca.config(t, "n")}, "AES-GCM records keyed from the TLS session"},
	} {
		e, err := New(tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.Wire(); !strings.Contains(got, tc.want) {
			t.Errorf("Wire() = %q, want it to say %q", got, tc.want)
		}
		e.Close()
	}
}

// A client with the pool's certificate that negotiates sealed records and then sends garbage loses its own
// connection; the agent keeps serving, and nobody else's memory changes.
func TestSealedRecordsHostileClient(t *testing.T) {
	ca := newCA(t)
	b := tlsEngine(t, "node-b", ca.config(t, "node-b"), true)
	victimBuf := pattern(1<<20, 1)
	victim := register(t, b, "node-b/victim", victimBuf)

	cfg := ca.config(t, "node-a")
	cfg.NextProtos = []string{sealedProto}
	cfg.ServerName = "127.0.0.1"
	raw, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	tc := tls.Client(raw, cfg)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.Write(append([]byte(magic), appendString16(appendString16(nil, "node-a"), "node-b")...)); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 5)
	if _, err := io.ReadFull(tc, head); err != nil || head[4] != statusOK {
		t.Fatalf("hello: %v %v", head, err)
	}
	// A request header for the victim's region in the clear, where a record belongs.
	junk := appendReqHeader(nil, reqHeader{op: opWrite, id: 1, off: 0, length: 4096, mem: victim.ID})
	raw.Write(append(junk, make([]byte, 4096)...))
	raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := raw.Read(make([]byte, 1)); err == nil {
		t.Fatalf("the agent answered %d bytes to garbage; want the connection closed", n)
	}

	view, unpin, err := b.Pin(victim.ID)
	if err != nil {
		t.Fatal(err)
	}
	unchanged := bytes.Equal(view, pattern(1<<20, 1))
	unpin()
	if !unchanged {
		t.Fatal("a hostile stream changed another region")
	}
	// The agent still serves a well-behaved peer.
	a := tlsEngine(t, "node-a", ca.config(t, "node-a"), false)
	dst := register(t, b, "node-b/dst", make([]byte, 64<<10))
	if err := writeOnce(t, a, dst, pattern(64<<10, 2)); err != nil {
		t.Fatalf("write after a hostile client: %v", err)
	}
}
