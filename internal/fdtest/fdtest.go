// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fdtest leaves a test process without descriptors, as a hostile peer that holds connections open
// does, so that its accept loops meet EMFILE.
package fdtest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Exhaust lowers the process's descriptor limit to its lowest free descriptor (the kernel hands out the lowest
// free number, so the first open after it fails with EMFILE) and returns restore, which the caller calls once
// the exhaustion was seen; the test's cleanup restores it too. The test must not run in parallel with others
// of its package.
func Exhaust(t *testing.T) (restore func()) {
	t.Helper()
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	saved := limit
	restore = func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
			t.Errorf("restoring the descriptor limit: %v", err)
		}
	}
	t.Cleanup(restore)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	lowest := f.Fd()
	f.Close()
	limit.Cur = uint64(lowest)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	return restore
}

// Peer is another process that opens connections when told, while this one has no descriptor to spare.
type Peer struct {
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// StartPeer starts python3 running connect once told (Python statements that append the connections they open
// to the list held; the args are sys.argv[1:]), and kills it when the test ends or after 20 s, so no read of it
// waits longer. Starting a process takes descriptors: start it before Exhaust. Without python3 the test is
// skipped.
func StartPeer(t *testing.T, connect string, args ...string) *Peer {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 for a second process that connects while this one has no descriptor left")
	}
	script := "import socket, sys\nsys.stdin.readline()\nheld = []\n" + connect + "\nprint(\"connected\", flush=True)\nsys.stdin.readline()\n"
	cmd := exec.Command(python, append([]string{"-c", script}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := time.AfterFunc(20*time.Second, func() { _ = cmd.Process.Kill() })
	t.Cleanup(func() { stop.Stop(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &Peer{stdin: stdin, stdout: bufio.NewReader(stdout)}
}

// ConnectExhausted leaves this process without descriptors (Exhaust), tells the peer to connect and waits until
// it did; restore gives the descriptors back and lets the peer close its connections.
func (p *Peer) ConnectExhausted(t *testing.T) (restore func()) {
	t.Helper()
	giveBack := Exhaust(t)
	if _, err := p.stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := p.stdout.ReadString('\n'); err != nil || line != "connected\n" {
		t.Fatalf("the other process did not connect: %q, %v", line, err)
	}
	return func() {
		giveBack()
		_, _ = p.stdin.Write([]byte("done\n"))
	}
}
