// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"bufio"
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestASetupFrameWithoutAReplyFailsTheConnection: memory handed to the agent whose setup frame (a mailbox, an
// id arena) gets no reply in time leaves the connection out of step: the agent's late reply would be read as
// the next call's. It was swallowed (the connection went on without the memory); now it is an error, and the
// connection is not used.
func TestASetupFrameWithoutAReplyFailsTheConnection(t *testing.T) {
	dir := t.TempDir()
	fdSock := filepath.Join(dir, FDSocketName)
	l, err := net.Listen("unix", fdSock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // a descriptor socket that takes every descriptor
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			line, _ := bufio.NewReader(conn).ReadString('\n')
			if line != "" {
				_, _ = conn.Write([]byte("OK token-1\n"))
			}
			conn.Close()
		}
	}()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "client end"), os.NewFile(uintptr(fds[1]), "silent agent end")
	defer theirs.Close()
	raw, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := &Client{socketPath: filepath.Join(dir, "agent.sock")}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	mem, err := c.openArena(ctx, raw.(*net.UnixConn))
	if err == nil || mem != nil {
		t.Fatalf("an id arena whose setup frame got no reply: memory %v, error %v; want an error and no memory", mem != nil, err)
	}
}
