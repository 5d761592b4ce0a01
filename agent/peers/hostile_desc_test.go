// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package peers_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
)

// TestHostileDescriptorsAreConfirmedByTheirNode: node B's memory is imported on node A once for every caller of
// A, by the memory id its descriptor names. A caller of A that sends a descriptor of that id first, with handles
// of its choosing (here a tcp address), must not have them used for the others' transfers, nor make the real
// descriptor be refused: A imports a caller's descriptor only once B confirms it issued it, byte for byte. A
// wrong key, or a region B does not have, is NotFound, and once the memory is imported any descriptor of it
// other than the issued one is refused. Nothing lands on B from a forged descriptor.
func TestHostileDescriptorsAreConfirmedByTheirNode(t *testing.T) {
	a, b := startTwoNodes(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	const size = 64 << 10
	forger, victim, owner := dialNode(t, a), dialNode(t, a), dialNode(t, b)
	memF, memV, memB := randomShm(t, size), randomShm(t, size), randomShm(t, size)
	rf, err := forger.RegisterHost(ctx, memF.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := victim.RegisterHost(ctx, memV.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := owner.RegisterHost(ctx, memB.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	issued := rb.Descriptor()
	forge := func(change func(*agentv1.SegmentDescriptor, *engines.MemoryDesc)) []byte {
		sd, md := describedMemory(t, issued)
		change(sd, &md)
		var err error
		if sd.Memory, err = engines.MarshalDesc(md); err != nil {
			t.Fatal(err)
		}
		out, err := proto.Marshal(sd)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	redirected := forge(func(_ *agentv1.SegmentDescriptor, md *engines.MemoryDesc) { md.Handles.TCP = "127.0.0.1:9" })
	if bytes.Equal(redirected, issued) {
		t.Fatal("the forged descriptor is the issued one")
	}
	keepB := bytes.Clone(memB.Bytes)
	forged := []struct {
		name string
		desc []byte
		code codes.Code
		says string
	}{
		{"other handles under the real id and key", redirected, codes.FailedPrecondition, "not what node node-b issued"},
		{"a wrong key", forge(func(sd *agentv1.SegmentDescriptor, _ *engines.MemoryDesc) {
			sd.Key = bytes.Repeat([]byte{7}, len(sd.Key))
		}), codes.NotFound, "key does not match"},
		{"a region node B does not have", forge(func(sd *agentv1.SegmentDescriptor, _ *engines.MemoryDesc) { sd.RegionId += 1000 }), codes.NotFound, "not registered"},
	}
	explain := func(c *client.Client, r *client.Region, desc []byte) error {
		_, err := c.API().Explain(ctx, &agentv1.ExplainRequest{
			Source:      &agentv1.Endpoint{Target: &agentv1.Endpoint_RegionId{RegionId: r.ID()}},
			Destination: &agentv1.Endpoint{Node: "node-b", Target: &agentv1.Endpoint_Desc{Desc: desc}}})
		return err
	}
	for _, tc := range forged {
		// Explain imports what it names without moving bytes: the same confirmation applies.
		if err := explain(forger, rf, tc.desc); client.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("explaining %s: %v, want %s saying %q", tc.name, err, tc.code, tc.says)
		}
		_, err := forger.Write(ctx, rf, 0, client.ToDescriptor(tc.desc), 0, size)
		if client.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("%s: %v, want %s saying %q", tc.name, err, tc.code, tc.says)
		}
		if !bytes.Equal(memB.Bytes, keepB) {
			t.Fatalf("%s: node B's memory changed", tc.name)
		}
	}

	// The victim's transfer with the descriptor B's owner shared lands, after the forger went first.
	if _, err := victim.Write(ctx, rv, 0, client.ToDescriptor(issued), 0, size); err != nil {
		t.Fatalf("the issued descriptor after forged ones: %v", err)
	}
	if !bytes.Equal(memB.Bytes, memV.Bytes) {
		t.Fatal("node B's memory is not what the victim wrote")
	}
	// Imported now, every forged descriptor of that memory (another key included) is refused without asking B,
	// and the issued one works for another caller.
	keepB = bytes.Clone(memB.Bytes)
	for _, tc := range forged {
		_, err := forger.Write(ctx, rf, 0, client.ToDescriptor(tc.desc), 0, size)
		if client.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "another descriptor") {
			t.Fatalf("%s once the memory is imported: %v, want FAILED_PRECONDITION", tc.name, err)
		}
		if !bytes.Equal(memB.Bytes, keepB) {
			t.Fatalf("%s once the memory is imported: node B's memory changed", tc.name)
		}
	}
	if _, err := forger.Write(ctx, rf, 0, client.ToDescriptor(issued), 0, size); err != nil || !bytes.Equal(memB.Bytes, memF.Bytes) {
		t.Fatalf("the issued descriptor from another caller of node A: %v", err)
	}
}
