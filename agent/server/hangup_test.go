// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// TestACallCancelledOrLeftStopsItsWaitedTransfer: a waited transfer whose caller cancels the call, or closes its
// connection, is stopped: nobody waits for it and nobody knows its id. It went on until its own timeout (here
// 30 s, a peer's data address that never answers), holding the caller's in-flight count and, at a session's end,
// the session's teardown. Through the fast socket's mailbox and socket frames (the client drops the connection),
// through gRPC (the call's cancel), and from a bare connection that sends a waited frame and closes.
func TestACallCancelledOrLeftStopsItsWaitedTransfer(t *testing.T) {
	a := unreachablePeerAgent(t, 0)
	watcher := dial(t, a)
	inFlight := func() uint32 {
		t.Helper()
		info, err := watcher.API().GetInfo(ctxT(t), &agentv1.GetInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return info.GetUsage().GetInFlight()
	}
	settles := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); inFlight() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Errorf("%s: the transfer still in flight 3 s after its caller left (its timeout: 30 s)", what)
				return
			}
		}
	}
	for name, c := range map[string]*client.Client{"mailbox": dial(t, a), "socket": dial(t, a, client.WithoutMailbox()), "grpc": dialNoFast(t, a)} {
		l, _ := hostLayout(t, c, rand.New(rand.NewPCG(17, 18)), 1, 4, 1024)
		ctx, cancel := context.WithCancel(ctxT(t))
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		_, err := c.TransferBlocks(ctx, client.Write, l, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{3},
			client.TransferOptions{Timeout: 30 * time.Second})
		if err == nil || time.Since(start) > 2*time.Second {
			t.Errorf("%s: a waited call cancelled after 100 ms: %v after %v", name, err, time.Since(start))
		}
		settles(name + ", cancelled")
	}

	// A bare connection: a waited frame, then the connection closed.
	c := dial(t, a)
	l, _ := hostLayout(t, c, rand.New(rand.NewPCG(19, 20)), 1, 4, 1024)
	conn := fastConn(t, a, c)
	payload, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
		Op: agentv1.Op_OP_WRITE, LayoutId: l.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: "kv"}, Node: "node-z"},
		LocalIds: []byte{0, 0, 0, 0}, RemoteIds: []byte{3, 0, 0, 0}, IdBytes: 4, Wait: true, Timeout: durationpb.New(30 * time.Second)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); inFlight() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the bare connection's transfer is not in flight: the case tests nothing")
		}
	}
	time.Sleep(20 * time.Millisecond) // past the 2 ms after which the agent watches
	conn.Close()
	settles("a bare connection closed")
	// The agent goes on serving the caller.
	if _, err := c.TransferBlocks(ctxT(t), client.Write, l, []uint32{1}, client.ToLayout(l), []uint32{2}, client.TransferOptions{}); err != nil {
		t.Errorf("a transfer after: %v", err)
	}
}

// TestAFrameSentBehindALongCallIsAnswered: a caller may send its next frame before the reply (frames are answered
// in order). The connection's reader can hold the start of that frame while the call is served; the agent must not
// then watch the socket (its next byte is the middle of the frame: a run of four zero bytes there read as a
// doorbell left the frame short, and its reply never came).
func TestAFrameSentBehindALongCallIsAnswered(t *testing.T) {
	a := unreachablePeerAgent(t, 0)
	c := dial(t, a)
	l, _ := hostLayout(t, c, rand.New(rand.NewPCG(21, 22)), 1, 4, 1024)
	conn := fastConn(t, a, c)
	// With a mailbox, whose doorbells (four zero bytes) the agent's watch of a long call reads.
	token, err := fdpass.Put(ctxT(t), a.srv.FDSocketPath(), shm(t, 64<<10).File)
	if err != nil {
		t.Fatal(err)
	}
	if r := setMailbox(t, conn, token, 64<<10); r.Code != 0 {
		t.Fatalf("setting a mailbox: %v", r)
	}
	long, err := proto.Marshal(&agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
		Op: agentv1.Op_OP_WRITE, LayoutId: l.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_Segment{Segment: "kv"}, Node: "node-z"},
		LocalIds: []byte{0, 0, 0, 0}, RemoteIds: []byte{3, 0, 0, 0}, IdBytes: 4, Wait: true, Timeout: durationpb.New(300 * time.Millisecond)}}})
	if err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 100<<10) // past the reader's 64 KiB: the rest of it waits in the socket
	frames := binary.BigEndian.AppendUint32(nil, uint32(len(long)))
	frames = append(frames, long...)
	frames = binary.BigEndian.AppendUint32(frames, uint32(len(zeros)))
	frames = append(frames, zeros...)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(frames); err != nil {
		t.Fatal(err)
	}
	if r := readReply(t, conn); r.GetResponse().GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED {
		t.Errorf("the long call: %v, want its transfer's DEADLINE_EXCEEDED", r)
	}
	if r := readReply(t, conn); codes.Code(r.Code) != codes.InvalidArgument {
		t.Errorf("the frame sent behind it: %v, want InvalidArgument (zeros are no FastRequest)", r)
	}
}
