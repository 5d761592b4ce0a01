// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFramesRoundTripAndAreBounded(t *testing.T) {
	var b bytes.Buffer
	if err := WriteFrame(&b, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFrame(&b, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFrame(&b, 16)
	if err != nil || string(got) != "hello" {
		t.Fatalf("first frame %q, %v", got, err)
	}
	if _, err := ReadFrame(&b, 16); err == nil || !strings.Contains(err.Error(), "at most 16") {
		t.Fatalf("oversized frame: %v", err)
	}
}

func TestSpinReaderReadsAndHonoursDeadlines(t *testing.T) {
	c, peer := unixPair(t)
	go func() {
		time.Sleep(20 * time.Millisecond) // longer than the spin: the reader must park, then wake
		_ = WriteFrame(peer, []byte("late"))
	}()
	r := SpinReader{Conn: c, Spin: 100 * time.Microsecond}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := ReadFrame(r, 64)
	if err != nil || string(got) != "late" {
		t.Fatalf("read %q, %v", got, err)
	}
	_ = c.SetDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := ReadFrame(r, 64); err == nil {
		t.Fatal("read past the deadline succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("deadline of 50 ms took %s", d)
	}
}

func TestFrameReaderTakesWholeFramesAndBoundsMemory(t *testing.T) {
	var b bytes.Buffer
	for _, p := range []string{"one", "", "three"} {
		if err := WriteFrame(&b, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	r := &FrameReader{R: readCounter{&b, &reads}, Max: 16}
	for _, want := range []string{"one", "", "three"} {
		got, err := r.Next()
		if err != nil || string(got) != want {
			t.Fatalf("frame %q, %v; want %q", got, err, want)
		}
	}
	if reads != 1 {
		t.Fatalf("three small frames that had arrived took %d reads, want 1", reads)
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}

	// A peer that announces 4 MiB and sends 10 bytes costs the buffer those bytes need, not 4 MiB.
	big := &FrameReader{R: bytes.NewReader(append([]byte{0, 0x40, 0, 0}, make([]byte, 10)...)), Max: 8 << 20}
	if _, err := big.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated frame: %v, want ErrUnexpectedEOF", err)
	}
	if cap(big.buf) > 64<<10 {
		t.Fatalf("an announced frame with no payload grew the buffer to %d bytes", cap(big.buf))
	}
	over := &FrameReader{R: bytes.NewReader([]byte{0, 0, 1, 0}), Max: 255}
	if _, err := over.Next(); err == nil || !strings.Contains(err.Error(), "at most 255") {
		t.Fatalf("oversized frame: %v", err)
	}
}

type readCounter struct {
	r io.Reader
	n *int
}

func (c readCounter) Read(p []byte) (int, error) {
	*c.n++
	return c.r.Read(p)
}

// A spent budget makes a reader park at once: two readers waiting on quiet connections, one spin allowed, one
// of them spins and the spin ends by its time; both still read what arrives later.
func TestSpinBudgetBoundsSpinningReaders(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	budget := NewSpinBudget(1)
	const spin = 300 * time.Millisecond
	served := make(chan *net.UnixConn, 2)
	go func() {
		for range 2 {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			served <- c
		}
	}()
	got := make(chan string, 2)
	var clients []*net.UnixConn
	for range 2 {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			b, err := ReadFrame(SpinReader{Conn: c, Spin: spin, Budget: budget}, 64)
			if err != nil {
				got <- err.Error()
				return
			}
			got <- string(b)
		}()
	}
	time.Sleep(50 * time.Millisecond) // both readers are waiting: one spins, one parked
	if n := budget.Spinning(); n != 1 {
		t.Fatalf("%d readers spin with a budget of 1", n)
	}
	deadline := time.Now().Add(5 * time.Second)
	for budget.Spinning() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the spin did not end by its time")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for range 2 {
		c := <-served
		defer c.Close()
		if err := WriteFrame(c, []byte("late")); err != nil {
			t.Fatal(err)
		}
	}
	for range clients {
		if s := <-got; s != "late" {
			t.Fatalf("a reader got %q", s)
		}
	}
	if n := budget.Spinning(); n != 0 {
		t.Fatalf("%d spins left taken after the reads", n)
	}
}

// testBell is a doorbell whose ringing and the reader's polling word the test sees.
type testBell struct {
	rung    atomic.Bool
	polling atomic.Int32 // 1 polling, 0 waiting on the socket, -1 never told
}

func (b *testBell) Rung() bool { return b.rung.Load() }
func (b *testBell) Polling(on bool) {
	if on {
		b.polling.Store(1)
	} else {
		b.polling.Store(0)
	}
}

// TestSpinReaderAnswersItsDoorbell: a spinning reader returns ErrRung for a doorbell that rings while it polls,
// says it stops polling before it waits on the socket (where a ring alone no longer reaches it), and reads the
// socket as before; a frame reader keeps a frame it had half read across ErrRung.
func TestSpinReaderAnswersItsDoorbell(t *testing.T) {
	c, peer := unixPair(t)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))

	bell := &testBell{}
	bell.polling.Store(-1)
	fr := FrameReader{R: SpinReader{Conn: c, Spin: time.Second, Doorbell: bell}, Max: 64}
	go func() {
		time.Sleep(10 * time.Millisecond)
		bell.rung.Store(true)
	}()
	if _, err := fr.Next(); err != ErrRung {
		t.Fatalf("a ring while spinning: %v, want ErrRung", err)
	}
	if bell.polling.Load() != 1 {
		t.Fatal("a spinning reader did not say it polls")
	}
	bell.rung.Store(false)

	// Half a frame, a ring, then the rest: the frame survives the ring.
	if _, err := peer.Write([]byte{0, 0, 0, 5, 'h', 'e'}); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(10 * time.Millisecond)
		bell.rung.Store(true)
	}()
	if _, err := fr.Next(); err != ErrRung {
		t.Fatalf("a ring after half a frame: %v, want ErrRung", err)
	}
	bell.rung.Store(false)
	if _, err := peer.Write([]byte("llo")); err != nil {
		t.Fatal(err)
	}
	if got, err := fr.Next(); err != nil || string(got) != "hello" {
		t.Fatalf("the frame around a ring: %q, %v", got, err)
	}

	// A reader that may not spin waits on the socket at once and says so first.
	quiet := FrameReader{R: SpinReader{Conn: c, Doorbell: bell}, Max: 64}
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = WriteFrame(peer, []byte("late"))
	}()
	if got, err := quiet.Next(); err != nil || string(got) != "late" {
		t.Fatalf("a reader that does not spin: %q, %v", got, err)
	}
	bell.polling.Store(-1)
	_ = c.SetDeadline(time.Now().Add(30 * time.Millisecond))
	if _, err := quiet.Next(); err == nil {
		t.Fatal("read past the deadline succeeded")
	}
	if bell.polling.Load() != 0 {
		t.Fatal("a reader waiting on its socket did not say it stopped polling")
	}
}

// unixPair is a connected pair of Unix stream sockets, closed when the test ends.
func unixPair(t testing.TB) (c, peer *net.UnixConn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *net.UnixConn, 1)
	go func() {
		p, err := ln.AcceptUnix()
		if err != nil {
			p = nil
		}
		accepted <- p
	}()
	c, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if peer = <-accepted; peer == nil {
		t.Fatal("accepting the test connection failed")
	}
	t.Cleanup(func() { peer.Close() })
	return c, peer
}

// seqBell rings while its sequence differs from the last one answered.
type seqBell struct{ seq, answered atomic.Int64 }

func (b *seqBell) Rung() bool   { return b.seq.Load() != b.answered.Load() }
func (b *seqBell) Polling(bool) {}

// BenchmarkDoorbellAnswered: how long after a ring a spinning SpinReader returns ErrRung (p50 and p99 as
// metrics), beside a bare loop polling the same word: the floor any poller has.
func BenchmarkDoorbellAnswered(b *testing.B) {
	for _, bare := range []bool{false, true} {
		name := "spin-reader"
		if bare {
			name = "bare-poll"
		}
		b.Run(name, func(b *testing.B) {
			c, _ := unixPair(b)
			bell := &seqBell{}
			r := SpinReader{Conn: c, Spin: time.Minute, Doorbell: bell}
			var rungAt atomic.Int64
			lat := make([]time.Duration, b.N)
			failed := make(chan error, 1)
			go func() {
				buf := make([]byte, 16)
				for i := range lat {
					if bare {
						for !bell.Rung() {
						}
					} else if _, err := r.Read(buf); err != ErrRung {
						failed <- err
						return
					}
					lat[i] = time.Duration(time.Now().UnixNano() - rungAt.Load())
					bell.answered.Store(bell.seq.Load())
				}
			}()
			for i := range lat {
				// Rings land at varied points of the reader's loop; the ringer spins for the answer, as a
				// mailbox caller does.
				for until := time.Now().Add(time.Duration(3+i%7) * time.Microsecond); time.Now().Before(until); {
				}
				rungAt.Store(time.Now().UnixNano())
				seq := bell.seq.Add(1)
				deadline := time.Now().Add(10 * time.Second)
				for spins := 0; bell.answered.Load() != seq; spins++ {
					select {
					case err := <-failed:
						b.Fatal(err)
					default:
					}
					if spins%4096 == 4095 && time.Now().After(deadline) {
						b.Fatalf("ring %d not answered within 10 s", i)
					}
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2]), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
		})
	}
}
