package fdpass

import (
	"context"
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
