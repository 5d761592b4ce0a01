// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// TestSettledAnswersWhatTheSignalDidNotSay: the end of a detached (signalled) transfer writes nothing into the
// mailbox when it succeeded, since the signal told the caller, and wakes the caller only when it sleeps; a
// transfer that failed, or a call that ended with an error, is answered in the mailbox under its own request's
// sequence, as a reply written at once would have been.
func TestSettledAnswersWhatTheSignalDidNotSay(t *testing.T) {
	const size = 64 << 10
	mapping, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mapping)
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	fc0, err := net.FileConn(os.NewFile(uintptr(fds[0]), "agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer fc0.Close()
	conn := fc0.(*net.UnixConn)
	peer := os.NewFile(uintptr(fds[1]), "caller")
	defer peer.Close()

	replySeq := func() uint64 { return binary.LittleEndian.Uint64(mapping[128:]) }
	reply := func() *agentv1.FastReply {
		at := 4096 + (size-4096)/2
		n := binary.BigEndian.Uint32(mapping[at:])
		var r agentv1.FastReply
		if err := proto.Unmarshal(mapping[at+4:at+4+int(n)], &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	var fc fastConn
	end := func(seq uint64, resp *agentv1.TransferResponse, err error) {
		fc.detached.Add(1)
		fc.settled(conn, mapping, seq)(resp, err)
	}
	ok := &agentv1.TransferResponse{TransferId: 7, Status: &agentv1.TransferStatus{TransferId: 7, State: agentv1.TransferState_TRANSFER_STATE_SUCCEEDED}}
	end(5, ok, nil)
	if replySeq() != 0 {
		t.Fatalf("a signalled success was answered again (reply sequence %d)", replySeq())
	}
	failed := &agentv1.TransferResponse{TransferId: 8, Status: &agentv1.TransferStatus{TransferId: 8, State: agentv1.TransferState_TRANSFER_STATE_FAILED, Error: "GPU fault"}}
	end(6, failed, nil)
	if r := reply(); replySeq() != 6 || r.Response.GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_FAILED || r.Response.GetTransferId() != 8 {
		t.Fatalf("a failed signalled transfer: reply sequence %d, reply %v", replySeq(), r)
	}
	end(9, nil, status.Error(codes.DeadlineExceeded, "late"))
	if r := reply(); replySeq() != 9 || codes.Code(r.Code) != codes.DeadlineExceeded {
		t.Fatalf("a signalled call that ended in an error: reply sequence %d, reply %v", replySeq(), r)
	}

	// A caller asleep is woken after a success; the mailbox is not written.
	mapping[196] = 1
	end(10, ok, nil)
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	var wake [4]byte
	if _, err := io.ReadFull(peer, wake[:]); err != nil || wake != [4]byte{0xff, 0xff, 0xff, 0xff} || replySeq() != 9 {
		t.Fatalf("a sleeping caller after a signalled success: wake-up % x (%v), reply sequence %d", wake, err, replySeq())
	}
	done := make(chan struct{})
	go func() { fc.detached.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a settled answer kept its hold on the mailbox")
	}
}
