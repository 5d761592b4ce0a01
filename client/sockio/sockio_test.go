// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"strings"
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
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		time.Sleep(20 * time.Millisecond) // longer than the spin: the reader must park, then wake
		_ = WriteFrame(c, []byte("late"))
		time.Sleep(time.Second)
	}()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
