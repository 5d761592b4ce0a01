// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdsocket

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket/fdsockettest"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
)

func openFDCount(t *testing.T) int { return fdsockettest.OpenFDCount(t) }

// startFDSocket serves an fd socket whose callers are identified by identify.
func startFDSocket(t *testing.T, s *Socket) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	if s.tokens == nil {
		s.tokens = NewTokens(time.Minute, 64)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		ln.Close()
		<-done
		s.tokens.CloseAll()
	})
	return path
}

func anyone(context.Context, *net.UnixConn) (identity.Caller, error) {
	return identity.Caller{Local: true, Key: "local/uid=0"}, nil
}

// An fd-socket connection that sends nothing is closed at its deadline and counted; the agent stays up.
func TestFDSocketClosesAndCountsIdleConnections(t *testing.T) {
	s := &Socket{identify: anyone, timeout: 200 * time.Millisecond, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	before := s.edge.Value("fd", "deadline")
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "ERR") || time.Since(start) > 3*time.Second {
		t.Fatalf("idle connection got %q after %s", line, time.Since(start))
	}
	if after := s.edge.Value("fd", "deadline"); after != before+1 {
		t.Fatalf("deadline refusals %v -> %v", before, after)
	}
	// Half a request, then silence: the same.
	c2, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = c2.Write([]byte("PU"))
	_ = c2.SetDeadline(time.Now().Add(5 * time.Second))
	if line, _ := bufio.NewReader(c2).ReadString('\n'); !strings.HasPrefix(line, "ERR") {
		t.Fatalf("half a request got %q", line)
	}
	// A normal PUT still works.
	f, _ := os.CreateTemp(t.TempDir(), "m")
	defer f.Close()
	if token := put(t, path, f); token == "" {
		t.Fatal("no token after idle connections")
	}
}

func put(t *testing.T, path string, f *os.File) string {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.WriteMsgUnix([]byte("PUT\n"), syscall.UnixRights(int(f.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "OK ") {
		t.Fatalf("PUT answered %q", line)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "OK "))
}

// Many connections pushing descriptors as fast as they can leave the agent holding a bounded number of them,
// whether the callers are admitted or refused (slowly, as an API-server lookup would).
func TestFDSocketFloodKeepsDescriptorsBounded(t *testing.T) {
	refuseSlowly := func(ctx context.Context, _ *net.UnixConn) (identity.Caller, error) {
		time.Sleep(100 * time.Millisecond)
		return identity.Caller{}, errors.New("pid 1 is not in a Kubernetes pod")
	}
	for name, identify := range map[string]func(context.Context, *net.UnixConn) (identity.Caller, error){
		"admitted": anyone, "refused": refuseSlowly,
	} {
		t.Run(name, func(t *testing.T) {
			const conns, maxConns = 30, 8
			s := &Socket{identify: identify, timeout: time.Second, maxConns: maxConns, maxPerHolder: maxConns,
				maxPerCaller: maxConns, maxIdentified: maxConns}
			peak := fdsockettest.FloodPeak(t, startFDSocket(t, s), conns, 200, 2*time.Second)
			// Clients: one connection each. Agent: at most maxConns connections waiting to be identified and
			// maxConns identified ones, each with one message's descriptors in hand and one kept.
			if bound := conns + 2*maxConns*(2+4) + 16; peak > bound {
				t.Fatalf("%d descriptors above the baseline at the peak, bound %d", peak, bound)
			}
			t.Logf("peak %d descriptors above the baseline", peak)
		})
	}
}

func TestFDSocketConnectionCaps(t *testing.T) {
	s := &Socket{maxConns: 3, maxPerHolder: 2}
	for i := range 2 {
		if why := s.enter("pod/a"); why != "" {
			t.Fatalf("connection %d of pod a refused: %s", i+1, why)
		}
	}
	if why := s.enter("pod/a"); !strings.Contains(why, "pod/a has 2") {
		t.Fatalf("third connection of pod a: %q", why)
	}
	if s.enter("pod/b") != "" {
		t.Fatal("first connection of pod b (its processes of the same uid) refused")
	}
	if why := s.enter("uid=3"); !strings.Contains(why, "limit 3") {
		t.Fatalf("fourth connection: %q", why)
	}
	s.leave("pod/a")
	if s.enter("uid=3") != "" {
		t.Fatal("a connection after one left was refused")
	}
	// Identified connections count per caller: one caller at its limit does not refuse another.
	s.maxPerCaller = 1
	if s.enterCaller("pod/a") != "" || s.enterCaller("pod/a") == "" || s.enterCaller("pod/b") != "" {
		t.Fatal("per-caller limit")
	}
	s.leaveCaller("pod/a")
	if s.enterCaller("pod/a") != "" {
		t.Fatal("a caller's connection after one left was refused")
	}
}

// Over the connection cap a caller is told RESOURCE_EXHAUSTED, which clients retry.
func TestFDSocketBusyIsResourceExhausted(t *testing.T) {
	s := &Socket{identify: anyone, timeout: 2 * time.Second, maxConns: 1, maxPerHolder: 1, maxPerCaller: 1}
	path := startFDSocket(t, s)
	hold, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	time.Sleep(50 * time.Millisecond)
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "ERR RESOURCE_EXHAUSTED: ") {
		t.Fatalf("over the cap: %q", line)
	}
}
