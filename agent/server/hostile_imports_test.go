// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
)

// remoteDescriptor is a descriptor of another node's host memory id, reached at endpoint: what a node publishes
// for a segment, or what any caller can write.
func remoteDescriptor(t *testing.T, id engines.MemoryID, endpoint string) []byte {
	t.Helper()
	mem, err := engines.MarshalDesc(engines.MemoryDesc{ID: id, Node: "node-b", Location: engines.Location{Kind: engines.LocationHost},
		Size: 4096, Handles: engines.Handles{TCP: endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&agentv1.SegmentDescriptor{Node: "node-b", PoolNamespace: "infer", PoolName: "kv",
		AgentEndpoint: endpoint, Kind: agentv1.MemoryKind_MEMORY_KIND_HOST, Length: 4096, Memory: mem})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHostileDescriptorCannotTakeAnotherCallersImport: other nodes' memory is imported once for every caller, by
// the id its descriptor names. A caller that sends a descriptor of an id already imported, with other handles
// (where it would like everyone's transfers to that memory to go), is refused FAILED_PRECONDITION; the import and
// the callers using it keep the handles their node published.
func TestHostileDescriptorCannotTakeAnotherCallersImport(t *testing.T) {
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier.Pods = podsByUID{}
	a := startAgent(t, opts)
	ctx := ctxT(t)
	m := shm(t, 64<<10)
	const id = engines.MemoryID("node-b/00112233445566778899aabbccddeeff")
	published, forged := remoteDescriptor(t, id, "10.0.0.2:7443"), remoteDescriptor(t, id, "10.66.6.6:7443")

	proc.setPod(t, "00000000-0000-4000-8000-0000000000a1")
	victim := dial(t, a)
	vr, err := victim.RegisterHost(ctx, m.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	explain := func(c *client.Client, r *client.Region, desc []byte) error {
		_, err := c.API().Explain(ctx, &agentv1.ExplainRequest{
			Source:      &agentv1.Endpoint{Target: &agentv1.Endpoint_RegionId{RegionId: r.ID()}},
			Destination: &agentv1.Endpoint{Node: "node-b", Target: &agentv1.Endpoint_Desc{Desc: desc}}})
		return err
	}
	if err := explain(victim, vr, published); err != nil {
		t.Fatalf("the victim's transfer plan to the published descriptor: %v", err)
	}

	proc.setPod(t, "00000000-0000-4000-8000-0000000000a2")
	hostile := dial(t, a)
	hr, err := hostile.RegisterHost(ctx, m.File, 8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := explain(hostile, hr, forged); client.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "other handles") {
		t.Fatalf("a descriptor of an imported id with other handles: %v, want FAILED_PRECONDITION", err)
	}
	if err := explain(hostile, hr, published); err != nil {
		t.Fatalf("the published descriptor from another caller: %v", err)
	}
	proc.setPod(t, "00000000-0000-4000-8000-0000000000a1")
	if err := explain(victim, vr, published); err != nil {
		t.Fatalf("the victim's plan after the forged descriptor: %v", err)
	}
}
