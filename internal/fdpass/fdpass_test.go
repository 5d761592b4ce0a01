// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdpass

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// serveOnce answers one connection with reply (and the given fds) and reports the line it read.
func serveOnce(t *testing.T, reply string, fds []int) (string, <-chan string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() {
		defer ln.Close()
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		line, in, _ := ReadLine(c, true)
		CloseFDs(in)
		got <- line
		var oob []byte
		if len(fds) > 0 {
			oob = syscall.UnixRights(fds...)
		}
		_, _, _ = c.WriteMsgUnix([]byte(reply), oob, nil)
	}()
	return path, got
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestPutSendsTheDescriptorAndReadsTheToken(t *testing.T) {
	path, got := serveOnce(t, "OK abc123\n", nil)
	f, err := os.CreateTemp(t.TempDir(), "m")
	if err != nil {
		t.Fatal(err)
	}
	token, err := Put(ctx(t), path, f)
	if err != nil || token != "abc123" {
		t.Fatalf("Put = %q, %v", token, err)
	}
	if line := <-got; line != "PUT" {
		t.Fatalf("server read %q", line)
	}
}

func TestRefusalsAndMalformedRepliesAreErrors(t *testing.T) {
	f, _ := os.CreateTemp(t.TempDir(), "m")
	path, _ := serveOnce(t, "ERR namespace \"x\" may not use pool\n", nil)
	if _, err := Put(ctx(t), path, f); err == nil || !strings.Contains(err.Error(), "may not use pool") {
		t.Fatalf("refusal: %v", err)
	}
	path, _ = serveOnce(t, "WHAT\n", nil)
	if _, err := Put(ctx(t), path, f); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("malformed reply: %v", err)
	}
	if _, err := Get(ctx(t), path, "has space"); err == nil {
		t.Fatal("a token with a space was sent")
	}
}

func TestGetRefusesTwoDescriptors(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	path, _ := serveOnce(t, "OK\n", []int{int(r.Fd()), int(w.Fd())})
	if _, err := Get(ctx(t), path, "tok"); err == nil || !strings.Contains(err.Error(), "2 descriptors") {
		t.Fatalf("two descriptors: %v", err)
	}
}

func TestNoAgentFailsFast(t *testing.T) {
	start := time.Now()
	_, err := Put(ctx(t), filepath.Join(t.TempDir(), "none.sock"), os.Stdin)
	if err == nil || time.Since(start) > time.Second {
		t.Fatalf("no socket: %v after %s", err, time.Since(start))
	}
}

// pair returns both ends of a connected Unix stream socket.
func pair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// A read that hits its deadline with nothing received is an error, not a panic (recvmsg's -1 once sliced the
// buffer with a negative length).
func TestReadLineDeadlineIsAnError(t *testing.T) {
	a, _ := pair(t)
	_ = a.SetDeadline(time.Now().Add(50 * time.Millisecond))
	line, fds, err := ReadLine(a, true)
	if err == nil || line != "" || fds != nil {
		t.Fatalf("idle peer: %q, %v, %v", line, fds, err)
	}
}

// A client whose agent accepts and then stalls gets an error at its deadline, not a panic.
func TestPutAgainstAStalledAgentTimesOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err == nil {
			defer c.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	c, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Put(c, path, os.Stdin); err == nil {
		t.Fatal("Put against a stalled agent succeeded")
	}
	if _, err := Get(c, path, "tok"); err == nil {
		t.Fatal("Get against a stalled agent succeeded")
	}
}

// Descriptors beyond the ones asked for are closed as they arrive, however many messages bring them.
func TestReadLineFDsClosesExtraDescriptors(t *testing.T) {
	a, b := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before := openFDs(t)
	go func() {
		for i := 0; i < 20; i++ {
			_, _, _ = b.WriteMsgUnix([]byte("P"), syscall.UnixRights(int(r.Fd()), int(w.Fd()), int(r.Fd())), nil)
		}
		_, _, _ = b.WriteMsgUnix([]byte("UT\n"), nil, nil)
	}()
	_ = a.SetDeadline(time.Now().Add(5 * time.Second))
	line, fds, err := ReadLineFDs(a, 1)
	if err != nil || !strings.HasPrefix(line, "PPP") || len(fds) != 1 {
		t.Fatalf("read %q, %v, %v", line, fds, err)
	}
	CloseFDs(fds)
	if after := openFDs(t); after > before {
		t.Fatalf("%d descriptors open before, %d after: extras were kept", before, after)
	}
	// None wanted: every descriptor is closed, the line still comes back.
	go func() { _, _, _ = b.WriteMsgUnix([]byte("GET x\n"), syscall.UnixRights(int(r.Fd())), nil) }()
	line, fds, err = ReadLine(a, false)
	if err != nil || line != "GET x" || len(fds) != 0 {
		t.Fatalf("read %q, %v, %v", line, fds, err)
	}
	if after := openFDs(t); after > before {
		t.Fatalf("%d descriptors open before, %d after an unwanted one", before, after)
	}
}

func TestExhaustedRefusalsAreMarked(t *testing.T) {
	f, _ := os.CreateTemp(t.TempDir(), "m")
	path, _ := serveOnce(t, "ERR RESOURCE_EXHAUSTED: 64 descriptors already wait\n", nil)
	if _, err := Put(ctx(t), path, f); !errors.Is(err, ErrExhausted) || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "64 descriptors") {
		t.Fatalf("exhausted: %v", err)
	}
	path, _ = serveOnce(t, "ERR not yours\n", nil)
	if _, err := Put(ctx(t), path, f); errors.Is(err, ErrExhausted) || !errors.Is(err, ErrRefused) {
		t.Fatalf("plain refusal: %v", err)
	}
}
