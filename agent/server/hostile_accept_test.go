// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/fdtest"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// A local process can leave the agent without descriptors (connections it holds open anywhere): every accept
// then fails with EMFILE. Once descriptors are free again, every socket accepts again. The fast socket's accept
// loop used to end at that error and stayed dead until the agent restarted, while gRPC and the fd socket
// recovered. The agent is left no descriptor (its limit lowered to its lowest free one) while another process
// connects to each socket; when both the fd and the fast socket have counted an exhausted accept, the limit
// is restored and the hostile bed's check dials a new client, which binds a fast connection.
func TestHostileDescriptorExhaustion(t *testing.T) {
	b := newHostileBed(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.a.srv.Collector())
	exhausted := func(socket string) float64 {
		return promtest.Gather(t, reg)["fabricxfer_agent_edge_refusals_total{reason=accept_emfile,socket="+socket+"}"]
	}
	paths := b.sockets()
	peer := fdtest.StartPeer(t, `for p in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(p)
    held.append(s)`, paths["agent.fd.sock"], paths["agent.fast.sock"], paths["agent.sock"])
	restore := peer.ConnectExhausted(t)
	deadline := time.Now().Add(10 * time.Second)
	for exhausted("fd") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the fd socket counted no exhausted accept within 10 s: the test did not exhaust descriptors")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for deadline = time.Now().Add(2 * time.Second); exhausted("fast") == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	restore()
	b.check(t)
	if exhausted("fast") == 0 {
		t.Error("the fast socket counted no exhausted accept")
	}
}

// stalledPods answers no question about a pod until the asker gives up: an API server that does not answer.
type stalledPods struct{}

func (stalledPods) PodByUID(ctx context.Context, _ string) (identity.PodRef, error) {
	<-ctx.Done()
	return identity.PodRef{}, ctx.Err()
}

// A connection to the fast socket from a pod the agent must ask the API server about, while the API server does
// not answer, is refused within the bind's deadline, saying why; identifying it used to wait for the API server
// with the agent's own context, holding the connection and its goroutine for as long as the stall lasted.
func TestFastBindWaitsForNoStalledAPIServer(t *testing.T) {
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: stalledPods{}}
	a := startAgent(t, opts)
	proc.setPod(t, podInfer)
	conn := rawDial(t, a.srv.FastSocketPath())
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	if err := sockio.WriteFrame(conn, make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	frame, err := sockio.ReadFrame(conn, 1<<16)
	if took := time.Since(start); err != nil || took > 8*time.Second {
		t.Fatalf("the bind was answered after %v: %v", took, err)
	}
	var r agentv1.FastReply
	if err := proto.Unmarshal(frame, &r); err != nil || codes.Code(r.Code) != codes.PermissionDenied || !strings.Contains(r.Message, "deadline") {
		t.Fatalf("the bind's answer: %v (%v), want PermissionDenied naming the deadline", &r, err)
	}
}
