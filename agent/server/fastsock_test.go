// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
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
	// A call_timeout that is no positive duration, on a block frame (read by hand) and on any other: refused, and
	// the connection answers the next frame.
	for _, d := range []*durationpb.Duration{{Seconds: -1}, {}, {Nanos: -5}, {Seconds: 1, Nanos: 2e9}, {Seconds: 1 << 62}} {
		for kind, req := range map[string]*agentv1.FastRequest{
			"blocks": {Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{LayoutId: 1, IdBytes: 4}}},
			"wait":   {Request: &agentv1.FastRequest_Wait{Wait: &agentv1.FastWait{TransferIds: []uint64{1}}}},
		} {
			req.CallTimeout = d
			payload, err := proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			if r := rawFrame(t, conn2, payload); codes.Code(r.Code) != codes.InvalidArgument || !strings.Contains(r.Message, "call_timeout") {
				t.Errorf("a %s frame with call_timeout %v: %v, want InvalidArgument naming call_timeout", kind, d, r)
			}
		}
	}
	wait, _ := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Wait{Wait: &agentv1.FastWait{TransferIds: []uint64{1}}},
		CallTimeout: durationpb.New(time.Second)})
	if r := rawFrame(t, conn2, wait); codes.Code(r.Code) != codes.NotFound {
		t.Fatalf("a wait for a transfer nobody submitted, after the refusals: %v, want NotFound", r)
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

// podsByUID resolves every pod UID to a pod of that name in namespace infer.
type podsByUID struct{}

func (podsByUID) PodByUID(_ context.Context, uid string) (identity.PodRef, error) {
	return identity.PodRef{Namespace: "infer", Name: uid}, nil
}

// fastConn opens c's fast socket by hand, for frames the client does not send.
func fastConn(t *testing.T, a *agent, c *client.Client) net.Conn {
	t.Helper()
	resp, err := c.API().OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", a.srv.FastSocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if r := rawFrame(t, conn, []byte(resp.Token)); r.Code != 0 {
		t.Fatalf("binding the fast connection: %v", r)
	}
	return conn
}

func waitFrame(t *testing.T, timeout time.Duration, ids ...uint64) []byte {
	t.Helper()
	b, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Wait{Wait: &agentv1.FastWait{
		TransferIds: ids, Timeout: durationpb.New(timeout)}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestFastWaitIsTheCallersOwn: a wait on the fast socket settles the caller's own unwaited transfer and
// answers NotFound for another pod's transfer or an unknown id, leaving the connection serving and the other
// pod's transfer as it was.
func TestFastWaitIsTheCallersOwn(t *testing.T) {
	opts, proc := podOptions(t)
	a := startAgent(t, opts)
	ctx := ctxT(t)

	proc.setPod(t, "0a0a0a0a-0000-4000-8000-00000000000a")
	owner := dial(t, a)
	src, dst := shm(t, 1<<20), shm(t, 1<<20)
	fill(t, src.Bytes)
	rs, err := owner.RegisterHost(ctx, src.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := owner.RegisterHost(ctx, dst.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	ownerConn := fastConn(t, a, owner)
	proc.setPod(t, "0b0b0b0b-0000-4000-8000-00000000000b")
	intruder := dial(t, a)
	intruderConn := fastConn(t, a, intruder)

	var ids []uint64
	for half := uint64(0); half < 2; half++ {
		resp, err := owner.API().Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{
			LocalRegionId: rs.ID(), LocalOffset: half << 19, RemoteOffset: half << 19, Length: 1 << 19,
			Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: rd.ID()}}}}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, resp.TransferId)
	}
	tooMany := make([]uint64, 1025)
	for i := range tooMany {
		tooMany[i] = ids[0]
	}
	for _, c := range []struct {
		name string
		conn net.Conn
		ids  []uint64
		want codes.Code
	}{
		{"another pod's transfer", intruderConn, ids[:1], codes.NotFound},
		{"an unknown id", intruderConn, []uint64{ids[1] + 99}, codes.NotFound},
		{"the owner's ids with an unknown one", ownerConn, []uint64{ids[0], ids[1] + 99}, codes.NotFound},
		{"no ids", ownerConn, nil, codes.InvalidArgument},
		{"1,025 ids", ownerConn, tooMany, codes.InvalidArgument},
	} {
		if r := rawFrame(t, c.conn, waitFrame(t, time.Second, c.ids...)); codes.Code(r.Code) != c.want {
			t.Errorf("waiting for %s: %v, want %v", c.name, r, c.want)
		}
	}
	r := rawFrame(t, ownerConn, waitFrame(t, 10*time.Second, ids...))
	if r.Code != 0 || r.Response.GetTransferId() != ids[1] ||
		r.Response.GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("the owner's wait for both: %v, want the last SUCCEEDED", r)
	}
	if !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatal("the transfers' bytes did not land")
	}
	// The intruder's connection still serves it.
	if r := rawFrame(t, intruderConn, waitFrame(t, time.Second, 1<<40)); codes.Code(r.Code) != codes.NotFound {
		t.Errorf("a later wait on the intruder's connection: %v, want NotFound", r)
	}
}
