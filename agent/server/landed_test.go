// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
)

// TestWaitedTransfersAreAnsweredOnceAsTheirBytesLand: waited transfers whose copies the waiting call sees end
// (as GPU copies are) are answered as their bytes land, before the agent records them (in the mailbox; on the
// socket when the call returns). On both, block and item transfers alike, every call gets its own answer, once:
// the id the agent records, the bytes in place, the status the record keeps. A failed copy is answered as
// failed, a copy that outlives the call's polling is answered when it ends, and one that outlives its timeout
// is answered as such, the copy that ends afterwards answering nobody: the next call's answer is its own.
func TestWaitedTransfersAreAnsweredOnceAsTheirBytesLand(t *testing.T) {
	host := enginetest.NewPollingHost(20)
	a := startOnBackend(t, host)
	ctx := ctxT(t)
	rng := rand.New(rand.NewPCG(7, 8))
	const bs, blocks = 4096, 64

	for _, side := range []struct {
		name string
		c    *client.Client
	}{{"mailbox", dial(t, a)}, {"socket", dial(t, a, client.WithoutMailbox())}} {
		t.Run(side.name, func(t *testing.T) {
			c := side.c
			src, srcMem := hostLayout(t, c, rng, 1, blocks, bs)
			dst, dstMem := hostLayout(t, c, rng, 1, blocks, bs)
			var last uint64
			// answered checks one call's answer: its own id (after the previous call's), recorded with the same
			// status, and the blocks in place.
			answered := func(st *client.Status, err error, from, to int) {
				t.Helper()
				if err != nil {
					t.Fatalf("waited transfer: %v", err)
				}
				if st.GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED || st.TransferId <= last {
					t.Fatalf("answer %v after transfer %d: want a later transfer, succeeded", st, last)
				}
				last = st.TransferId
				rec, err := c.API().Wait(ctx, &agentv1.WaitRequest{TransferId: st.TransferId})
				if err != nil {
					t.Fatal(err)
				}
				if rec.GetState() != st.GetState() || rec.Bytes != st.Bytes || rec.Elapsed.AsDuration() != st.Elapsed.AsDuration() {
					t.Fatalf("transfer %d answered %v, recorded %v", st.TransferId, st, rec)
				}
				if !bytes.Equal(dstMem[0].Bytes[to*bs:(to+1)*bs], srcMem[0].Bytes[from*bs:(from+1)*bs]) {
					t.Fatalf("transfer %d answered before block %d landed in %d", st.TransferId, from, to)
				}
			}
			for i := range 100 {
				from, to := rng.IntN(blocks), rng.IntN(blocks)
				if i%2 == 0 {
					st, err := c.TransferBlocks(ctx, client.Write, src, []uint32{uint32(from)}, client.ToLayout(dst), []uint32{uint32(to)}, client.TransferOptions{})
					answered(st, err, from, to)
				} else {
					st, err := c.Do(ctx, client.Write, []client.Item{{Local: src.Regions()[0], LocalOffset: uint64(from * bs),
						Remote: client.ToRegion(dst.Regions()[0]), RemoteOffset: uint64(to * bs), Length: bs}}, client.TransferOptions{})
					answered(st, err, from, to)
				}
			}
			polled := host.Polled.Load()

			// A failed copy is answered as failed; the next one succeeds with its own answer.
			host.SetFail(errors.New("the copy faulted"))
			_, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
			var te *client.TransferError
			if !errors.As(err, &te) || te.Status.GetState() != agentv1.TransferState_TRANSFER_STATE_FAILED || te.Status.TransferId <= last {
				t.Fatalf("a failed copy answered %v, want a later transfer, failed", err)
			}
			last = te.Status.TransferId
			host.SetFail(nil)
			st, err := c.TransferBlocks(ctx, client.Write, src, []uint32{3}, client.ToLayout(dst), []uint32{4}, client.TransferOptions{})
			answered(st, err, 3, 4)

			// A copy that outlives the call's polling is answered when it ends.
			release := host.Gate.Shut(t)
			time.AfterFunc(20*time.Millisecond, release)
			st, err = c.TransferBlocks(ctx, client.Write, src, []uint32{5}, client.ToLayout(dst), []uint32{6}, client.TransferOptions{})
			answered(st, err, 5, 6)

			// A copy that outlives its timeout is answered so; when it ends afterwards nobody hears of it.
			release = host.Gate.Shut(t)
			_, err = c.TransferBlocks(ctx, client.Write, src, []uint32{7}, client.ToLayout(dst), []uint32{8}, client.TransferOptions{Timeout: 30 * time.Millisecond})
			if status.Code(err) != codes.DeadlineExceeded || !errors.As(err, &te) || te.Status.TransferId <= last {
				t.Fatalf("a copy past its timeout answered %v, want DeadlineExceeded for a later transfer", err)
			}
			last = te.Status.TransferId
			release()
			for i := range 20 {
				st, err := c.TransferBlocks(ctx, client.Write, src, []uint32{uint32(i)}, client.ToLayout(dst), []uint32{uint32(40 + i)}, client.TransferOptions{})
				answered(st, err, i, 40+i)
			}
			if host.Polled.Load() <= polled {
				t.Error("no copy was seen done by its waiting call's polls")
			}
		})
	}
}
