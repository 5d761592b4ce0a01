// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// bindFast opens a fast connection with a fresh token of c's session and returns it with the bind reply.
func bindFast(t *testing.T, api agentv1.AgentClient, path string) (net.Conn, *agentv1.FastReply) {
	t.Helper()
	tok, err := api.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, rawFrame(t, conn, []byte(tok.Token))
}

// TestFastSocketLimits: a frame announced beyond the cap is refused without the memory being taken, a caller's
// fast connections and unused tokens are capped with clear errors, and the agent keeps serving.
func TestFastSocketLimits(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	api := c.API()
	path := a.srv.FastSocketPath()

	conn, r := bindFast(t, api, path)
	if r.Code != 0 {
		t.Fatalf("binding: %v", r.Message)
	}
	// 1 GiB announced, nothing sent: refused at once.
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30)); err != nil {
		t.Fatal(err)
	}
	r = readReply(t, conn)
	if codes.Code(r.Code) != codes.InvalidArgument || !strings.Contains(r.Message, "at most") {
		t.Fatalf("oversized frame: got %v %q", codes.Code(r.Code), r.Message)
	}

	// The client holds one fast connection; 31 more bind (a pod of 8 GPUs' processes and more, each with a
	// client), the 33rd is refused.
	var refused *agentv1.FastReply
	bound := 1
	for i := 0; i < 40 && refused == nil; i++ {
		if _, r := bindFast(t, api, path); r.Code != 0 {
			refused = r
		} else {
			bound++
		}
	}
	if bound != 32 || refused == nil || codes.Code(refused.Code) != codes.ResourceExhausted || !strings.Contains(refused.Message, "fast connections") {
		t.Fatalf("%d fast connections bound, then %v; want 32, then ResourceExhausted naming the limit", bound, refused)
	}

	// Unused tokens: at most 32 held by a caller, 4 by one of its sessions, which then gives up its oldest.
	var tokErr error
	tokens := 0
	for i := 0; i < 12 && tokErr == nil; i++ {
		others := dialNoFast(t, a).API()
		for range 4 {
			if _, tokErr = others.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{}); tokErr != nil {
				break
			}
			tokens++
		}
	}
	if tokens != 32 || tokErr == nil || !strings.Contains(tokErr.Error(), "unused fast path tokens") {
		t.Fatalf("%d unused tokens, then %v; want 32, then the refusal", tokens, tokErr)
	}
	// Still serving: the caller's own fast path works.
	if _, err := api.GetInfo(ctxT(t), &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("agent stopped answering: %v", err)
	}
}

// TestASessionsUnusedTokensCannotCrowdOutItsCaller: a session that asks for fast path tokens and never binds them
// (a client interrupted between asking and binding, again and again) holds at most 4: each later one replaces its
// oldest, which no longer binds, and the caller's other processes still open fast connections. A session that
// ended holds none.
func TestASessionsUnusedTokensCannotCrowdOutItsCaller(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	path := a.srv.FastSocketPath()
	leaky := dialNoFast(t, a).API()
	var toks []string
	for i := range 100 {
		tok, err := leaky.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{})
		if err != nil {
			t.Fatalf("token %d of a session that binds none: %v", i, err)
		}
		toks = append(toks, tok.Token)
	}
	bindToken := func(tok string) *agentv1.FastReply {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return rawFrame(t, conn, []byte(tok))
	}
	if r := bindToken(toks[95]); codes.Code(r.Code) != codes.PermissionDenied || !strings.Contains(r.Message, "unknown, expired, used") {
		t.Fatalf("a token given up for later ones bound: %v %q", codes.Code(r.Code), r.Message)
	}
	if r := bindToken(toks[99]); r.Code != 0 {
		t.Fatalf("the session's last token: %v %q", codes.Code(r.Code), r.Message)
	}
	// Another process of the same caller: its client dials (it asks for a token and binds it) and moves bytes.
	other := dial(t, a)
	src, dst := shm(t, 4096), shm(t, 4096)
	rs, err := other.RegisterHost(ctxT(t), src.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := other.RegisterHost(ctxT(t), dst.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	copy(src.Bytes, "landed")
	if _, err := other.Write(ctxT(t), rs, 0, client.ToRegion(rd), 0, 4096); err != nil || !bytes.Equal(dst.Bytes[:6], []byte("landed")) {
		t.Fatalf("the caller's other client: %v, %q", err, dst.Bytes[:6])
	}

	// The leaky session holds 3; seven sessions holding 4 each and one more token fill the caller's 32, and
	// ending those sessions frees their tokens at once.
	var held []*client.Client
	for i := range 8 {
		c := dialNoFast(t, a)
		held = append(held, c)
		for range min(4, 29-4*i) {
			if _, err := c.API().OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{}); err != nil {
				t.Fatalf("session %d: %v", i, err)
			}
		}
	}
	if _, err := leaky.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{}); err == nil || !strings.Contains(err.Error(), "unused fast path tokens") {
		t.Fatalf("a token past the caller's 32: %v", err)
	}
	for _, c := range held {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leaky.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{}); err != nil {
		t.Fatalf("a token once the sessions holding the caller's others ended: %v", err)
	}
}

func readReply(t *testing.T, conn net.Conn) *agentv1.FastReply {
	t.Helper()
	var n [4]byte
	if _, err := io.ReadFull(conn, n[:]); err != nil {
		t.Fatalf("reading a reply: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(n[:]))
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatal(err)
	}
	var r agentv1.FastReply
	if err := proto.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// TestInFlightBytesPerCaller: a transfer that would bring a caller's bytes in flight past its limit is refused
// with the figures, and bytes are counted back when transfers settle.
func TestInFlightBytesPerCaller(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Limits = server.DefaultLimits
	opts.Limits.MaxInFlightBytes = 1 << 20
	a := startAgent(t, opts)
	c := dial(t, a)
	src, dst := shm(t, 2<<20), shm(t, 2<<20)
	rs, err := c.RegisterHost(ctxT(t), src.File, 0, src.Size())
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctxT(t), dst.File, 0, dst.Size())
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Write(ctxT(t), rs, 0, client.ToRegion(rd), 0, 2<<20)
	if client.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "bytes in flight") {
		t.Fatalf("2 MiB over a 1 MiB limit: %v", err)
	}
	for i := range 3 { // each settles before the next: the limit is never reached
		if _, err := c.Write(ctxT(t), rs, 0, client.ToRegion(rd), 0, 1<<20); err != nil {
			t.Fatalf("write %d of 1 MiB: %v", i, err)
		}
	}
}

// TestFastSocketDropsACallerThatStopsReading: a caller that sends requests and never reads the replies fills its
// socket; the agent waits for room at most Options.FastReplyTimeout, then ends that fast connection, and the
// caller's session and its other fast connections go on.
func TestFastSocketDropsACallerThatStopsReading(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.FastReplyTimeout = 300 * time.Millisecond
	a := startAgent(t, opts)
	c := dial(t, a)
	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	payload := waitFrame(t, time.Millisecond, 1<<40) // an unknown id: a NotFound reply, at once
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	frame = append(frame, payload...)
	burst := bytes.Repeat(frame, 256)
	sent := 0
	for sent < 1<<20 {
		_ = conn.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
		n, err := conn.Write(burst)
		sent += n / len(frame)
		if err != nil {
			break // the agent stopped reading: it waits to write a reply nobody reads
		}
	}
	if sent >= 1<<20 {
		t.Fatal("a million requests went in without the agent ever waiting on its replies")
	}
	// Past the reply timeout the connection has ended: what the caller reads now is the replies that fit, then
	// the end (EOF, or a reset since the agent closed with requests unread).
	time.Sleep(time.Second)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the agent kept the connection of a caller that stopped reading for a second: %v", err)
	}
	other, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("another fast connection of the same caller: %v", r)
	}
	if r := rawFrame(t, other, payload); codes.Code(r.Code) != codes.NotFound {
		t.Fatalf("a wait on the caller's other fast connection: %v, want NotFound", r)
	}
	if _, err := c.API().GetInfo(ctxT(t), &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("the caller's session after it lost a fast connection: %v", err)
	}
}

// TestFastSocketDropsASleeperThatSendsGarbage: a caller that says it sleeps and never reads fills its socket with
// wake-ups, which the agent writes without waiting; a malformed frame then is answered like every reply, within
// Options.FastReplyTimeout, and the connection ends, rather than holding the agent's goroutine in a write for as
// long as the caller likes. The caller's other connections go on.
func TestFastSocketDropsASleeperThatSendsGarbage(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.FastReplyTimeout = 200 * time.Millisecond
	a := startAgent(t, opts)
	c := dial(t, a)
	src, srcMem, dst, dstMem, frame := oneBlockFrame(t, c, rand.New(rand.NewPCG(11, 12)))
	mb := attachMailbox(t, a, c, 16<<10)
	mb.u32(196).Store(1) // asleep: each reply comes with a wake-up on the socket, which this caller never reads
	for i := range 3000 {
		if r := mb.call(frame); r.Code != 0 {
			t.Fatalf("call %d: %v", i, r)
		}
	}
	_ = mb.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := mb.conn.Write(binary.BigEndian.AppendUint32(nil, 1<<30)); err != nil { // a frame past the cap
		t.Fatal(err)
	}
	// Without reading a byte (reading would make the room the agent waits for): the agent's end closes.
	raw, err := mb.conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var hup bool
	deadline := time.Now().Add(5 * time.Second)
	for !hup && time.Now().Before(deadline) {
		_ = raw.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			if n, _ := unix.Poll(fds, 100); n == 1 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) != 0 {
				hup = true
			}
		})
	}
	if !hup {
		t.Fatal("the agent still holds the connection of a sleeper that sent a malformed frame, 5 s on")
	}
	if _, err := c.TransferBlocks(ctxT(t), client.Write, src, []uint32{3}, client.ToLayout(dst), []uint32{4}, client.TransferOptions{}); err != nil {
		t.Fatalf("the caller's client afterwards: %v", err)
	}
	if !bytes.Equal(dstMem[0].Bytes[4*64:5*64], srcMem[0].Bytes[3*64:4*64]) {
		t.Fatal("the caller's transfer afterwards did not land")
	}
}

// TestFastSocketBoundsConnectionsThatNeverBind: any process that reaches the fast socket can connect and say
// nothing, each connection holding a descriptor and a goroutine until the bind's deadline. At most 64 of one
// holder (a pod, or the uid of a process in none) wait to bind: the next is answered RESOURCE_EXHAUSTED at once,
// a pod of the same uid binds meanwhile, connections bound before serve on, and once the silent ones go a new
// one binds.
func TestFastSocketBoundsConnectionsThatNeverBind(t *testing.T) {
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier.Pods = podsByUID{}
	a := startAgent(t, opts)
	c := dial(t, a)
	api := c.API()
	path := a.srv.FastSocketPath()
	held, r := bindFast(t, api, path)
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.srv.Collector())
	var conns []net.Conn
	for range 80 {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns = append(conns, conn)
	}
	// The agent counts each as it takes it: once it refused 16, every one is counted or refused.
	for deadline := time.Now().Add(10 * time.Second); promtest.Gather(t, reg)["fabricxfer_agent_edge_refusals_total{reason=busy,socket=fast}"] < 16; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("80 silent connections: the agent did not refuse 16 within 10 s")
		}
	}
	var silent []net.Conn
	refused := 0
	for _, conn := range conns {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Millisecond)) // a refusal waits there already
		var n [4]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			silent = append(silent, conn)
			continue
		}
		body := make([]byte, binary.BigEndian.Uint32(n[:]))
		var r agentv1.FastReply
		if _, err := io.ReadFull(conn, body); err != nil || proto.Unmarshal(body, &r) != nil {
			t.Fatalf("a refusal's reply: %v", err)
		}
		if codes.Code(r.Code) != codes.ResourceExhausted || !strings.Contains(r.Message, fmt.Sprintf("uid=%d has 64 connections waiting to bind", os.Getuid())) {
			t.Fatalf("a connection past 64 silent ones: %v, want RESOURCE_EXHAUSTED at once naming the limit", &r)
		}
		refused++
	}
	if refused < 16 || len(silent) > 64 {
		t.Fatalf("80 silent connections of one process: %d refused, %d kept; want at most 64 kept", refused, len(silent))
	}
	if r := rawFrame(t, held, waitFrame(t, time.Millisecond, 1<<40)); codes.Code(r.Code) != codes.NotFound {
		t.Fatalf("a connection bound before the silent ones: %v, want its NotFound answer", r)
	}
	proc.setPod(t, "00000000-0000-4000-8000-0000000000ee") // a pod whose processes run as the same uid
	if _, r := bindFast(t, dial(t, a).API(), path); r.Code != 0 {
		t.Fatalf("a pod binding while a process of its uid holds 64 silent connections: %v", r)
	}
	proc.setLocal(t)
	for _, conn := range silent {
		conn.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, r := bindFast(t, api, path)
		if r.Code == 0 {
			break
		}
		if codes.Code(r.Code) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("binding after the silent connections closed: %v", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
