// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bytes"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/fdtest"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// writeThrough writes 64 KiB from a fresh region of a into a fresh region of b and checks what landed.
func writeThrough(t *testing.T, a, b *Engine, id string) {
	t.Helper()
	src, dst := bytes.Repeat([]byte(id[:1]), 64<<10), make([]byte, 64<<10)
	local := register(t, a, "node-a/"+id, src)
	remote := register(t, b, "node-b/"+id, dst)
	imp(t, a, remote)
	if err := moveWithin(a, 5*time.Second, item(engines.Item{Src: local.ID, Dst: remote.ID, Size: 64 << 10, Tag: 1})); err != nil {
		t.Fatalf("a write to node-b: %v", err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("node-b's region does not hold what was written")
	}
}

// TestHostileConnectionsBeforeHelloAreBounded: anyone who reaches the data port can open connections that never
// say hello, each held until the handshake deadline (10 s). One address holds at most 32 at once (the next is
// closed at once), and a peer from another address still connects and moves bytes.
func TestHostileConnectionsBeforeHelloAreBounded(t *testing.T) {
	a := newEngine(t, "node-a", nil)
	b := newEngine(t, "node-b", listen(t))
	hostile := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range sockio.DefaultMaxHandshakesPerSource {
		c, err := hostile.Dial("tcp", b.Addr())
		if err != nil {
			t.Fatalf("hostile connection %d: %v", i+1, err)
		}
		held = append(held, c)
	}
	extra, err := hostile.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection %d from one address that never says hello was held open", sockio.DefaultMaxHandshakesPerSource+1)
	}
	if n := b.Stats().Refused; n != 1 {
		t.Errorf("Stats().Refused = %d, want 1", n)
	}
	writeThrough(t, a, b, "during")
}

// TestDataListenerSurvivesDescriptorExhaustion: anyone who reaches the data port can leave the agent without
// descriptors; every accept then fails with EMFILE. The listener used to end at that error and stayed dead until
// the agent restarted. The process's limit is lowered to its lowest free descriptor while another process
// connects; once accepts were seen to fail and the limit is restored, a peer connects and moves bytes.
func TestDataListenerSurvivesDescriptorExhaustion(t *testing.T) {
	a := newEngine(t, "node-a", nil)
	b := newEngine(t, "node-b", listen(t))
	host, port, _ := net.SplitHostPort(b.Addr())
	peer := fdtest.StartPeer(t, "held.append(socket.create_connection((sys.argv[1], int(sys.argv[2]))))", host, port)
	restore := peer.ConnectExhausted(t)
	for deadline := time.Now().Add(10 * time.Second); b.Stats().AcceptsExhausted == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no accept failed for want of descriptors within 10 s: the test did not exhaust them")
		}
	}
	restore()
	writeThrough(t, a, b, "after")
}
