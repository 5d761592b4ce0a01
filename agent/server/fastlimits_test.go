// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
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

	// The client holds one fast connection; seven more bind, the ninth is refused.
	var refused *agentv1.FastReply
	for i := 0; i < 9 && refused == nil; i++ {
		if _, r := bindFast(t, api, path); r.Code != 0 {
			refused = r
		}
	}
	if refused == nil || codes.Code(refused.Code) != codes.ResourceExhausted || !strings.Contains(refused.Message, "fast connections") {
		t.Fatalf("ninth fast connection: want ResourceExhausted naming the limit, got %v", refused)
	}

	// Unused tokens: at most 16 held.
	var tokErr error
	for i := 0; i < 20 && tokErr == nil; i++ {
		_, tokErr = api.OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{})
	}
	if tokErr == nil || !strings.Contains(tokErr.Error(), "unused fast path tokens") {
		t.Fatalf("17th unused token: got %v", tokErr)
	}
	// Still serving: the caller's own fast path works.
	if _, err := api.GetInfo(ctxT(t), &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("agent stopped answering: %v", err)
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
