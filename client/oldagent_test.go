// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// olderAgent answers as an agent that predates the fast path and ResolveSegment's layout field: it reads every
// ResolveSegment as a region's (the field is unknown to it) and answers OpenFastPath Unimplemented.
type olderAgent struct {
	agentv1.UnimplementedAgentServer
}

func (olderAgent) GetInfo(context.Context, *agentv1.GetInfoRequest) (*agentv1.GetInfoResponse, error) {
	return &agentv1.GetInfoResponse{NodeName: "old-node", ApiVersion: "v1"}, nil
}

func (olderAgent) ResolveSegment(_ context.Context, req *agentv1.ResolveSegmentRequest) (*agentv1.ResolveSegmentResponse, error) {
	return &agentv1.ResolveSegmentResponse{Desc: []byte("a region's descriptor"), Node: "old-node", Length: 4096}, nil
}

// serveFakeAgent serves agent on a fresh agent.sock until the test ends, and returns its path.
func serveFakeAgent(t *testing.T, agent agentv1.AgentServer) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServer(srv, agent)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return path
}

// TestAnOlderAgentIsToldApart: a client of an agent without the fast path goes through gRPC, and a layout lookup
// the agent answered as a region's is refused as Unimplemented, not returned as a nil geometry with no error
// (reading its fields panicked, and a name published as a region looked like an empty layout).
func TestAnOlderAgentIsToldApart(t *testing.T) {
	path := serveFakeAgent(t, olderAgent{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, path)
	if err != nil {
		t.Fatalf("dialling an agent without the fast path: %v", err)
	}
	defer c.Close()
	g, err := c.ResolveLayoutSegment(ctx, "", "kv")
	if client.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), "upgrade") || g != nil {
		t.Fatalf("a layout lookup an older agent answered as a region's: %v, %v; want Unimplemented saying to upgrade", g, err)
	}
	if desc, err := c.ResolveSegment(ctx, "", "kv"); err != nil || string(desc) != "a region's descriptor" {
		t.Fatalf("a region lookup of the older agent: %q, %v", desc, err)
	}
}

// TestDialWaitsForAnAgentThatAnswersLate: an agent whose socket is there but that answers late (starting, or
// paused for a moment) is waited for until the caller's deadline; Dial gave up after gRPC's first connect
// timeout (1 s) with "error reading server preface", not a deadline error. One that never answers ends at the
// deadline, as a deadline error that says what was found.
func TestDialWaitsForAnAgentThatAnswersLate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServer(srv, olderAgent{})
	defer srv.Stop()
	time.AfterFunc(1500*time.Millisecond, func() { srv.Serve(ln) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, path)
	if err != nil {
		t.Fatalf("dialling an agent that answers 1.5 s late: %v", err)
	}
	c.Close()

	silent := filepath.Join(t.TempDir(), "agent.sock")
	quiet, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer quiet.Close()
	short, cancelShort := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	_, err = client.Dial(short, silent)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took < 1400*time.Millisecond || !strings.Contains(err.Error(), "nothing answered") {
		t.Fatalf("dialling a socket nothing answers on: %v after %v, want a deadline error at 1.5 s saying nothing answered", err, took)
	}
}

// stallingAgent answers GetInfo and never OpenFastPath (an agent paused right after it answered).
type stallingAgent struct{ olderAgent }

func (stallingAgent) OpenFastPath(ctx context.Context, _ *agentv1.OpenFastPathRequest) (*agentv1.OpenFastPathResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDialWithoutADeadlineIsBounded: Dial with a context without deadline gives up after dialReadyWait (10 s)
// on an agent that stops answering after GetInfo; only GetInfo was bounded, and the fast path's setup waited for
// good.
func TestDialWithoutADeadlineIsBounded(t *testing.T) {
	path := serveFakeAgent(t, stallingAgent{})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := client.Dial(context.Background(), path)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Dial of an agent that does not open the fast path: %v after %v, want a deadline error", err, time.Since(start))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Dial without a deadline still waited after 20 s")
	}
}

// slowEndingAgent answers EndSession only when the call's deadline ends (a session whose transfers in flight do
// not settle in time).
type slowEndingAgent struct{ olderAgent }

func (slowEndingAgent) EndSession(ctx context.Context, _ *agentv1.EndSessionRequest) (*agentv1.EndSessionResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// TestCloseSaysWhenTheSessionDidNotEndInTime: Close returns an error when the agent had not ended the session
// within its wait (it returned nil, and the names it held were still taken), and nil for an agent too old to have
// EndSession, which frees them once the connection goes.
func TestCloseSaysWhenTheSessionDidNotEndInTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		agent agentv1.AgentServer
		want  codes.Code
	}{{"an agent still ending it", slowEndingAgent{}, codes.DeadlineExceeded}, {"an older agent", olderAgent{}, codes.OK}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := client.Dial(ctx, serveFakeAgent(t, tc.agent))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = c.Close()
		if client.Code(err) != tc.want || time.Since(start) > 5*time.Second {
			t.Errorf("%s: Close after %v: %v, want %v", tc.name, time.Since(start), err, tc.want)
		}
		if tc.want == codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Close's %v does not match context.DeadlineExceeded, as every call's deadline does", tc.name, err)
		}
	}
}

// blockingAgent answers ResolveSegment only when the call ends (an agent busy when it dies).
type blockingAgent struct {
	olderAgent
	called chan struct{}
}

func (a blockingAgent) ResolveSegment(ctx context.Context, _ *agentv1.ResolveSegmentRequest) (*agentv1.ResolveSegmentResponse, error) {
	a.called <- struct{}{}
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// TestACallCutByTheAgentsEndIsALostSession: a call in flight when the agent goes (its connection closed under
// it) fails with ErrSessionLost, as a stream's end and the fast path's do: it read as gRPC's Unavailable ("error
// reading from server: EOF"), which a "Recover on ErrSessionLost" loop never met. The agent's own Unavailable
// answers (marked in the trailer) stay what they are.
func TestACallCutByTheAgentsEndIsALostSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	agent := blockingAgent{called: make(chan struct{}, 1)}
	srv := grpc.NewServer()
	agentv1.RegisterAgentServer(srv, agent)
	go srv.Serve(ln)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.ResolveSegment(ctx, "", "kv")
		done <- err
	}()
	<-agent.called
	srv.Stop() // closes the connection under the call
	if err := <-done; !errors.Is(err, client.ErrSessionLost) || client.Code(err) != codes.Aborted {
		t.Fatalf("a call whose agent went under it: %v (code %v), want ErrSessionLost, Aborted", err, client.Code(err))
	}
	// Closing the client then has no session left to end: nil, not "its regions and names are freed once ...".
	if err := c.Close(); err != nil {
		t.Fatalf("closing a client whose agent went: %v, want nil", err)
	}
}
