// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// Settled transfers stay visible to Wait for the retention (up to 65,536 of them), so what each one keeps is
// memory the agent carries and its collector marks: a caller making tens of thousands of calls a second fills
// the table within seconds. Kept whole (about 1.9 KB each) they made the agent's live heap grow to 80-107 MB
// within 45,000 4 KiB calls on a GPU; a success is now a record of a few words in a preallocated ring (about
// 57 bytes each, its chunks counted). Wait and Cancel by id still answer with the status.
func TestSettledTransfersKeepOnlyTheirStatus(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	rng := rand.New(rand.NewPCG(3, 4))
	const bs, blocks = 720, 64
	src, _ := hostLayout(t, c, rng, 1, blocks, bs)
	dst, _ := hostLayout(t, c, rng, 1, blocks, bs)
	call := func(i int) *client.Status {
		// A deadline of its own for each call, released at once (ctxT's would be kept by the test until it
		// ends, and one for all 22,000 calls runs out on a busy machine).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := c.TransferBlocks(ctx, client.Write, src, []uint32{uint32(i % blocks)}, client.ToLayout(dst),
			[]uint32{uint32((i * 7) % blocks)}, client.TransferOptions{})
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		return st
	}
	for i := range 2000 { // the pools and buffers every call reuses
		call(i)
	}
	first := call(0)
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const n = 20000
	before := heap()
	for i := range n {
		call(i)
	}
	grew := int64(heap()) - int64(before)
	perCall := grew / n
	t.Logf("live heap grew %d bytes over %d settled transfers: %d bytes each", grew, n, perCall)
	if perCall > 128 {
		t.Fatalf("each settled transfer kept %d bytes of live heap, want at most 128 (a record of its status)", perCall)
	}

	api := c.API()
	st, err := api.Wait(ctxT(t), &agentv1.WaitRequest{TransferId: first.TransferId})
	if err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED || st.TransferId != first.TransferId {
		t.Fatalf("Wait on a settled transfer: %v, %v", st, err)
	}
	st, err = api.Cancel(ctxT(t), &agentv1.CancelRequest{TransferId: first.TransferId})
	if err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("Cancel of a settled transfer: %v, %v", st, err)
	}
}
