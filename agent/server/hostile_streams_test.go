// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/h2stall"
)

// stalledCalls opens one connection to the agent's socket and starts n stalled calls on it (h2stall.Calls),
// returning how the agent ended those it ended within a second (by stream id) and the connection, which is closed
// when the test ends.
func stalledCalls(t *testing.T, path string, n int) (net.Conn, map[uint32]string) {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ended, err := h2stall.Calls(conn, agentv1.Agent_GetInfo_FullMethodName, n, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return conn, ended
}

// TestHostileCallFloodIsBounded: every call on agent.sock has its request buffered by gRPC as it arrives (up to 4
// MiB) before any handler runs, and a connection took any number of them, so one process could hold the agent's
// memory with stalled requests. A connection takes 32 calls at once and a pod has at most 128 open over all its
// connections: the next is refused RESOURCE_EXHAUSTED at once, another pod's calls go on, and the pod calls again
// once some end. A process the agent refuses has at most 4 open.
func TestHostileCallFloodIsBounded(t *testing.T) {
	const victimPod, hostilePod = "00000000-0000-4000-8000-00000000000c", "00000000-0000-4000-8000-00000000000d"
	b := newFloodBed(t, victimPod)
	a, proc, ctx := b.a, b.proc, ctxT(t)

	// One connection takes 32 calls at once: HTTP/2 refuses the 33rd stream (a client queues it instead).
	proc.setPod(t, victimPod)
	one, ended := stalledCalls(t, a.srv.SocketPath(), 33)
	if len(ended) != 1 || ended[65] != "reset REFUSED_STREAM" {
		t.Fatalf("33 stalled calls on one connection: %v, want the 33rd (stream 65) alone refused", ended)
	}
	one.Close()

	proc.setPod(t, hostilePod)
	hostile := dial(t, a)
	// The calls of the client's dial end before it returns, but the agent uncounts them just after.
	for deadline := time.Now().Add(5 * time.Second); a.srv.OpenCalls("pod/"+hostilePod) != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the pod's dial left calls counted")
		}
	}
	var stalled []net.Conn
	for range 4 {
		conn, ended := stalledCalls(t, a.srv.SocketPath(), 32)
		if len(ended) != 0 {
			t.Fatalf("32 stalled calls on one of the pod's first 4 connections: %d ended, want all open (%v)", len(ended), ended)
		}
		stalled = append(stalled, conn)
	}
	_, err := hostile.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if client.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "128 calls open") {
		t.Fatalf("the pod's 129th call: %v, want RESOURCE_EXHAUSTED naming the 128 calls", err)
	}
	if _, ended := stalledCalls(t, a.srv.SocketPath(), 3); len(ended) != 3 || !strings.HasPrefix(ended[1], "8 ") {
		t.Fatalf("more stalled calls of the pod: %v, want each refused at once with grpc-status 8", ended)
	}

	// Another pod is served meanwhile, old connection and new.
	b.victimMoves(t, "during the flood")
	proc.setPod(t, victimPod)
	late := dial(t, a)
	if _, err := late.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); err != nil {
		t.Fatalf("another pod's new client during the flood: %v", err)
	}

	// A refused process (in no pod, local callers not admitted): 4 calls open, the 5th refused.
	proc.setLocal(t)
	_, ended = stalledCalls(t, a.srv.SocketPath(), 5)
	if len(ended) != 1 || !strings.HasPrefix(ended[9], "8 ") || !strings.Contains(ended[9], "refused process") {
		t.Fatalf("a refused process's 5 stalled calls: %v, want the 5th (stream 9) alone refused", ended)
	}

	// The pod's stalled calls end with their connection, and the pod calls again.
	stalled[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := hostile.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
		if err == nil {
			break
		}
		if client.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("the pod's call after one of its stalled calls' connections closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
