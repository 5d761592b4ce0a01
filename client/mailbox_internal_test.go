// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// mailboxPair is a caller's mailbox and a socket pair, with the agent's side of both left to the test: a second
// mapping of the same memfd (as the agent maps it) and the socket's other end.
type mailboxPair struct {
	mb    *fastwire.CallerMailbox
	agent []byte
	conn  *net.UnixConn
	peer  *os.File
}

func newMailboxPair(t *testing.T) *mailboxPair {
	t.Helper()
	f, err := newSealedMemfd("mailbox-test", mailboxBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mapping := func() []byte {
		m, err := unix.Mmap(int(f.Fd()), 0, mailboxBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	mb, err := fastwire.NewCallerMailbox(mapping(), false)
	if err != nil {
		t.Fatal(err)
	}
	agent := mapping()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	cf := os.NewFile(uintptr(fds[0]), "caller")
	fc, err := net.FileConn(cf)
	cf.Close()
	if err != nil {
		t.Fatal(err)
	}
	p := &mailboxPair{mb: mb, agent: agent, conn: fc.(*net.UnixConn), peer: os.NewFile(uintptr(fds[1]), "agent")}
	t.Cleanup(func() {
		p.conn.Close()
		p.peer.Close()
		mb.Unmap()
		_ = unix.Munmap(agent)
	})
	return p
}

// TestMailboxCallEndsWithinItsDeadline: an agent that never answers (nor takes the request) is rung and the call
// ends at its deadline with a timeout, the caller's sleeping word cleared; a cancelled context ends it as well.
func TestMailboxCallEndsWithinItsDeadline(t *testing.T) {
	p := newMailboxPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := mailboxCall(ctx, p.conn, p.mb, []byte("request"), 100*time.Microsecond, sockio.OfferCore)
	took := time.Since(start)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a call nobody answers: %v, want a timeout", err)
	}
	if took > 2*time.Second {
		t.Fatalf("a call with a 30 ms deadline took %v", took)
	}
	if word32(p.agent, 196).Load() != 0 {
		t.Fatal("the caller's sleeping word stayed set after its call ended")
	}
	// The agent's socket holds the rings: empty frames only.
	_ = p.peer.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 4096)
	n, _ := p.peer.Read(buf)
	if n == 0 || n%4 != 0 || strings.Trim(string(buf[:n]), "\x00") != "" {
		t.Fatalf("the agent's socket got %q, want empty frames (rings)", buf[:n])
	}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := mailboxCall(ctx, p.conn, p.mb, []byte("request"), 0, sockio.OfferCore); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call whose context was cancelled: %v", err)
	}

	// A spin longer than the call's deadline ends with the deadline, as does a cancel during the spin.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := mailboxCall(ctx, p.conn, p.mb, []byte("request"), time.Minute, sockio.OfferCore); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a call spinning past its deadline: %v, want a timeout", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("a call with a 30 ms deadline and a minute's spin took %v", took)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	if _, err := mailboxCall(ctx, p.conn, p.mb, []byte("request"), time.Minute, sockio.OfferCore); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call cancelled during its spin: %v", err)
	}
}

// TestMailboxCallRefusesWhatTheAgentMustNotSend: a reply announcing more bytes than its area, and a frame on
// the socket while the caller sleeps (a stream out of step), end the call with an error instead of a read past
// the mapping or a reply taken for another.
func TestMailboxCallRefusesWhatTheAgentMustNotSend(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	area := (mailboxBytes - 4096) / 2

	long := newMailboxPair(t)
	go func(p *mailboxPair) { // an agent that answers with a length past the reply area
		for word64(p.agent, 0).Load() == 0 {
			time.Sleep(10 * time.Microsecond)
		}
		binary.BigEndian.PutUint32(p.agent[4096+area:], uint32(area))
		word64(p.agent, 128).Store(word64(p.agent, 0).Load())
	}(long)
	if _, err := mailboxCall(ctx, long.conn, long.mb, []byte("request"), time.Second, sockio.OfferCore); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("a reply longer than its area: %v", err)
	}

	framed := newMailboxPair(t)
	go func(p *mailboxPair) { // an agent that writes a reply frame on the socket while the caller sleeps
		for word32(p.agent, 196).Load() == 0 {
			time.Sleep(10 * time.Microsecond)
		}
		_, _ = p.peer.Write([]byte{0, 0, 0, 2, 8, 1})
	}(framed)
	if _, err := mailboxCall(ctx, framed.conn, framed.mb, []byte("request"), 0, sockio.OfferCore); err == nil || !strings.Contains(err.Error(), "out of step") {
		t.Fatalf("a frame on the socket during a mailbox call: %v", err)
	}
}

// word64 and word32 are the mailbox's words as the agent reads and writes them (fastwire.Mailbox).
func word64(mem []byte, off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }
func word32(mem []byte, off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }

// TestMailboxCallOffersItsCore: a call polling its mailbox for a reply offers its core every sockio.YieldGap (on a
// host whose cores are all busy, the agent's thread that is to write the reply may wait for it). The offers are
// counted, not their effect: that depends on the host's load.
func TestMailboxCallOffersItsCore(t *testing.T) {
	p := newMailboxPair(t)
	word32(p.agent, 192).Store(1) // the agent says it polls: no ring, the call spins on the mailbox
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	offers := 0
	if _, err := mailboxCall(ctx, p.conn, p.mb, []byte("request"), time.Minute, func() { offers++ }); err == nil {
		t.Fatal("a call nobody answered returned a reply")
	}
	// 30 ms of polling is 600 gaps of 50 µs; a twentieth of them leaves room for a slow, shared machine.
	if offers < 30 {
		t.Errorf("%d offers of the core while a call polled 30 ms for its reply", offers)
	}
}
