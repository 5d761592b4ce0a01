// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/client"
)

// TestHostileHandshakeFloodIsBounded: anyone who reaches the peer port can open connections that never start
// their TLS handshake, each held until the handshake deadline (10 s). One address holds at most 32 at once (one
// more is closed at once), and a pool node from another address still completes its handshake and its calls.
func TestHostileHandshakeFloodIsBounded(t *testing.T) {
	a, b := startTwoNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cb := dialNode(t, b)
	if _, err := cb.RegisterHost(ctx, randomShm(t, 4096).File, 0, 4096, client.Segment("kv-b")); err != nil {
		t.Fatal(err)
	}
	hostile := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 33 {
		c, err := hostile.Dial("tcp", b.peerLn.Addr().String())
		if err != nil {
			t.Fatalf("hostile connection %d: %v", i+1, err)
		}
		held = append(held, c)
	}
	// One of the 33 from that address (the server takes them up in parallel: not always the last) is closed
	// without waiting for its handshake's deadline; the others are held.
	closed := make(chan bool, len(held))
	for _, c := range held {
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err := c.Read(make([]byte, 1))
			closed <- !errors.Is(err, os.ErrDeadlineExceeded)
		}()
	}
	n := 0
	for range held {
		if <-closed {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d of 33 connections from one address that never authenticate were closed within 2 s, want 1", n)
	}
	// A pool node from another address completes a handshake and is answered.
	cfg := a.tls.Config().Clone()
	cfg.NextProtos = []string{"h2"}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", b.peerLn.Addr().String(), cfg)
	if err != nil {
		t.Fatalf("a pool node's handshake during the flood: %v", err)
	}
	conn.Close()
	if _, err := a.peers.ResolveSegment(ctx, "node-b", "kv-b", ""); err != nil {
		t.Fatalf("node-b's segment during the flood: %v", err)
	}
	// The held connections still count: closing them makes room for that address again.
	for _, c := range held {
		c.Close()
	}
	held = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := hostile.Dial("tcp", b.peerLn.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break // held again, waiting for its handshake
		}
		if time.Now().After(deadline) {
			t.Fatal("the address was still refused 5 s after its connections closed")
		}
	}
}
