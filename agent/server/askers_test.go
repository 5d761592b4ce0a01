// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// forgetRecorder is a peer channel that records which nodes it is asked to tell that a layout is gone.
type forgetRecorder struct {
	mu    sync.Mutex
	nodes map[string]int
}

func (*forgetRecorder) ResolveSegment(context.Context, string, string, string) ([]byte, error) {
	return nil, status.Error(codes.NotFound, "no segment")
}

func (*forgetRecorder) ResolveLayout(context.Context, string, string, string) (*agentv1.LayoutDescriptor, error) {
	return nil, status.Error(codes.NotFound, "no layout")
}

func (*forgetRecorder) ConfirmDescriptor(context.Context, string, uint64, []byte) ([]byte, error) {
	return nil, status.Error(codes.NotFound, "no region")
}

func (r *forgetRecorder) ForgetLayout(_ context.Context, node, _, _ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes[node]++
	return nil
}

// TestHostileNodeCannotCrowdOutALayoutsAskers: a node of the pool that resolves a layout published to every
// namespace under thousands of namespaces is remembered a bounded number of times, and the node that asked after
// it is still told when the layout goes.
func TestHostileNodeCannotCrowdOutALayoutsAskers(t *testing.T) {
	kube := startAPIServer(t)
	podA := createPod(t, kube, "team-a", "prefill-0", "node-a")
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: &identity.APIPodResolver{Reader: kube, NodeName: "node-a"}}
	opts.Policy = identity.StaticPolicy{"team-a"}
	peers := &forgetRecorder{nodes: map[string]int{}}
	opts.Peers = peers
	a := startAgent(t, opts)
	proc.setPod(t, podA)
	ca := dial(t, a)
	l, _ := hostLayout(t, ca, rand.New(rand.NewPCG(23, 24)), 1, 8, 256, client.PublishLayout("kv", "*"))

	for i := range 5000 {
		if _, err := a.srv.LookupLayout("team-a/kv", fmt.Sprintf("ns-%d", i), "node-evil"); err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
	}
	if _, err := a.srv.LookupLayout("team-a/kv", "team-b", "node-b"); err != nil {
		t.Fatal(err)
	}
	if err := ca.DeregisterLayout(ctxT(t), l); err != nil {
		t.Fatal(err)
	}
	peers.mu.Lock()
	defer peers.mu.Unlock()
	if peers.nodes["node-b"] != 1 {
		t.Errorf("node-b was told %d times that the layout it resolved is gone, want 1 (told: %v)", peers.nodes["node-b"], peers.nodes)
	}
	if n := peers.nodes["node-evil"]; n == 0 || n > 64 {
		t.Errorf("node-evil was told %d times, want 1 to 64", n)
	}
}
