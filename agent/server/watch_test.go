// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestWatchReportsNamedTransfersAndEnds: a watch on named transfers reports each once (settled ones at once)
// and ends; a cancelled transfer reports CANCELLED or, if it beat the cancel, SUCCEEDED.
func TestWatchReportsNamedTransfersAndEnds(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	m := shm(t, 128<<20)
	r1, _ := c.RegisterHost(ctx, m.File, 0, 64<<20)
	r2, err := c.RegisterHost(ctx, m.File, 64<<20, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	small, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: 4096, Tag: "small"}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	big, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: 64 << 20, Tag: "big"}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := big.Cancel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s := st.State; s != agentv1.TransferState_TRANSFER_STATE_CANCELLED && s != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED && s != agentv1.TransferState_TRANSFER_STATE_PENDING {
		t.Fatalf("cancelled transfer state %s", s)
	}
	stream, err := c.API().Watch(ctx, &agentv1.WatchRequest{TransferIds: []uint64{small.ID, big.ID, small.ID}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]agentv1.TransferState{}
	done := make(chan error, 1)
	go func() {
		for {
			st, err := stream.Recv()
			if err != nil {
				done <- err
				return
			}
			seen[st.TransferId] = st.State
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("watch on two transfers did not end")
	}
	if len(seen) != 2 || seen[small.ID] != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("watch reported %v", seen)
	}
	unknown, err := c.API().Watch(ctx, &agentv1.WatchRequest{TransferIds: []uint64{999999}})
	if err == nil {
		_, err = unknown.Recv() // a server stream's error arrives with the first Recv
	}
	if client.Code(err).String() != "NotFound" {
		t.Fatalf("watching an unknown transfer: %v", err)
	}
}
