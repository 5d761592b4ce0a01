// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

func rawFrame(t *testing.T, conn net.Conn, payload []byte) *agentv1.FastReply {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	hdr := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	if _, err := conn.Write(append(hdr, payload...)); err != nil {
		t.Fatal(err)
	}
	return readReply(t, conn)
}

// TestFastPathAnswersLikeGRPC: the same requests get the same answers over the fast socket and over gRPC.
func TestFastPathAnswersLikeGRPC(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	ctx := ctxT(t)
	fast := dial(t, a)
	slow, err := client.Dial(ctx, a.srv.SocketPath(), client.WithoutFastPath())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for name, c := range map[string]*client.Client{"fast": fast, "grpc": slow} {
		src, dst := shm(t, 8192), shm(t, 8192)
		fill(t, src.Bytes)
		rs, _ := c.RegisterHost(ctx, src.File, 0, 8192)
		rd, err := c.RegisterHost(ctx, dst.File, 0, 8192)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 8192); err != nil || !bytes.Equal(src.Bytes, dst.Bytes) {
			t.Fatalf("%s: write: %v", name, err)
		}
		_, err = c.Write(ctx, rs, 0, client.ToRegion(rd), 4096, 8192)
		if client.Code(err) != codes.OutOfRange {
			t.Errorf("%s: overrun: %v, want OutOfRange", name, err)
		}
	}
}

func TestFastSocketRefusesBadTokensAndFrames(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	ctx := ctxT(t)
	conn, err := net.Dial("unix", a.srv.FastSocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if r := rawFrame(t, conn, []byte("not-a-token")); codes.Code(r.Code) != codes.PermissionDenied {
		t.Fatalf("junk token: %v, want PermissionDenied", r)
	}

	c := dial(t, a)
	resp, err := c.API().OpenFastPath(ctx, &agentv1.OpenFastPathRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conn2, err := net.Dial("unix", a.srv.FastSocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if r := rawFrame(t, conn2, []byte(resp.Token)); r.Code != 0 {
		t.Fatalf("valid token: %v", r)
	}
	if r := rawFrame(t, conn2, []byte{0xff, 0xff, 0xff}); codes.Code(r.Code) != codes.InvalidArgument {
		t.Fatalf("garbage frame: %v, want InvalidArgument", r)
	}
	// The token was one-time.
	conn3, _ := net.Dial("unix", a.srv.FastSocketPath())
	defer conn3.Close()
	if r := rawFrame(t, conn3, []byte(resp.Token)); codes.Code(r.Code) != codes.PermissionDenied {
		t.Fatalf("reused token: %v, want PermissionDenied", r)
	}
	// Closing the session closes its fast connection.
	c.Close()
	_ = conn2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("fast connection after its session ended: %v, want EOF", err)
	}
}
