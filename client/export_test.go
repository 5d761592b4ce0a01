// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// MailboxRequests reports whether c's fast connection has a mailbox and how many requests went through it.
func MailboxRequests(c *Client) (attached bool, n uint64) {
	c.lockFastWait()
	defer c.unlockFast()
	if c.mbox == nil {
		return false, 0
	}
	return true, c.mbox.Sequence()
}

// HasIDArena reports whether c's fast connection has an id arena.
func HasIDArena(c *Client) bool {
	c.lockFastWait()
	defer c.unlockFast()
	return c.arena != nil
}

// StallFastPath gives c a fast connection whose agent end reads nothing and answers nothing (an agent stopped),
// without a mailbox; the agent end closes when the test ends.
func StallFastPath(t interface {
	Fatal(...any)
	Cleanup(func())
}, c *Client) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "client end"), os.NewFile(uintptr(fds[1]), "stalled agent end")
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { theirs.Close() })
	c.lockFastWait()
	defer c.unlockFast()
	c.installFastLocked(fastParts{conn: conn.(*net.UnixConn)})
}

// FastPathOpen reports whether c holds a fast connection now.
func FastPathOpen(c *Client) bool {
	c.lockFastWait()
	defer c.unlockFast()
	return c.fast != nil
}

// HoldFastLock holds c's fast connection as a call the agent does not answer would, until the returned
// function is called.
func HoldFastLock(c *Client) (release func()) {
	c.lockFastWait()
	return c.unlockFast
}

// WithIdleAfter lets c's gRPC channel go idle after d without gRPC calls (Dial's clients never do).
func WithIdleAfter(d time.Duration) Option { return func(o *dialOptions) { o.idle = d } }

// Holds reports whether c keeps r to register again on Recover.
func Holds(c *Client, r *Region) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.regions[r]
	return ok
}
