// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio_test

import (
	"net"
	"strings"
	"testing"

	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// TestHandshakesAreBoundedInAllAndPerSource: one address gets MaxPerSource connections authenticating at
// once, all addresses Max; a connection that left makes room again, and leaving twice uncounts once.
func TestHandshakesAreBoundedInAllAndPerSource(t *testing.T) {
	h := &sockio.Handshakes{Max: 5, MaxPerSource: 3}
	from := func(ip string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: port} }
	var leaves []func()
	for i := range 3 {
		leave, err := h.Enter(from("10.0.0.1", 4000+i))
		if err != nil {
			t.Fatalf("connection %d from 10.0.0.1: %v", i+1, err)
		}
		leaves = append(leaves, leave)
	}
	if _, err := h.Enter(from("10.0.0.1", 5000)); err == nil || !strings.Contains(err.Error(), "from 10.0.0.1") {
		t.Fatalf("a fourth connection from one address: %v, want refused naming it", err)
	}
	for i := range 2 {
		if _, err := h.Enter(from("10.0.0.2", 4000+i)); err != nil {
			t.Fatalf("connection %d from another address: %v", i+1, err)
		}
	}
	if _, err := h.Enter(from("10.0.0.3", 4000)); err == nil || !strings.Contains(err.Error(), "limit 5") {
		t.Fatalf("a sixth connection in all: %v, want refused naming the total limit", err)
	}
	leaves[0]()
	leaves[0]()
	if _, err := h.Enter(from("10.0.0.3", 4000)); err != nil {
		t.Fatalf("after one left: %v", err)
	}
	if _, err := h.Enter(from("10.0.0.3", 4001)); err == nil {
		t.Fatal("leaving twice made room for two")
	}
}
