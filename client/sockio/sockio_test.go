// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"bytes"
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
