// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// TestWaitAllSaysHowTheTransfersEnded: WaitAll answers as Wait would for each transfer, in order: the last one's
// status when all succeeded, the first that did not succeed (its status and a TransferError) otherwise, the
// context's end for one still running when it ended; it refuses no transfers and another client's. Through the
// fast socket and without it.
func TestWaitAllSaysHowTheTransfersEnded(t *testing.T) {
	a := unreachablePeerAgent(t, 0)
	for name, c := range map[string]*client.Client{"fast socket": dial(t, a), "grpc": dialNoFast(t, a)} {
		ctx := ctxT(t)
		src, _ := hostLayout(t, c, rand.New(rand.NewPCG(9, 10)), 1, 4, 1024)
		dst, _ := hostLayout(t, c, rand.New(rand.NewPCG(11, 12)), 1, 4, 1024)
		local := func() *client.Transfer {
			t.Helper()
			x, err := c.SubmitBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return x
		}
		stuck := func(timeout time.Duration) *client.Transfer { // pending until its timeout
			t.Helper()
			x, err := c.SubmitBlocks(ctx, client.Write, src, []uint32{0}, client.ToLayoutSegment("node-z", "kv"), []uint32{3},
				client.TransferOptions{Timeout: timeout})
			if err != nil {
				t.Fatal(err)
			}
			return x
		}

		var all []*client.Transfer
		for range 70 {
			all = append(all, local())
		}
		st, err := c.WaitAll(ctx, all...)
		if err != nil || st.GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED || st.GetTransferId() != all[len(all)-1].ID {
			t.Errorf("%s: 70 transfers that landed: %v, %v; want the last one's success", name, st, err)
		}

		failing := stuck(300 * time.Millisecond)
		st, err = c.WaitAll(ctx, local(), failing, local())
		var failed *client.TransferError
		if !errors.As(err, &failed) || st.GetTransferId() != failing.ID || st.GetState() != agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED {
			t.Errorf("%s: a transfer that failed on its timeout between two that landed: %v, %v; want its status and a TransferError", name, st, err)
		}

		running := stuck(10 * time.Second)
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		start := time.Now()
		_, err = c.WaitAll(short, local(), running)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Errorf("%s: a transfer still running at the context's deadline: %v after %v, want context.DeadlineExceeded", name, err, time.Since(start))
		}
		if _, err := running.Cancel(ctx); err != nil {
			t.Errorf("%s: cancelling the transfer still running: %v", name, err)
		}

		if _, err := c.WaitAll(ctx); client.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: WaitAll of nothing: %v, want InvalidArgument", name, err)
		}
		other := dial(t, a)
		if _, err := other.WaitAll(ctx, all[0]); client.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: WaitAll of another client's transfer: %v, want InvalidArgument", name, err)
		}
	}
}

// BenchmarkWaitingFor64Transfers is waiting for 64 block transfers submitted without waiting (a layer each, say)
// that have ended, through the fast socket: WaitAll (one round trip) beside a Wait for each (64), in the same run.
// The submissions are outside the timed part.
func BenchmarkWaitingFor64Transfers(b *testing.B) {
	t := &testing.T{}
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := context.Background()
	src, _ := hostLayout(t, c, rand.New(rand.NewPCG(13, 14)), 1, 64, 720)
	dst, _ := hostLayout(t, c, rand.New(rand.NewPCG(15, 16)), 1, 64, 720)
	submit := func(b *testing.B) []*client.Transfer {
		b.StopTimer()
		defer b.StartTimer()
		xs := make([]*client.Transfer, 64)
		for i := range xs {
			x, err := c.SubmitBlocks(ctx, client.Write, src, []uint32{uint32(i)}, client.ToLayout(dst), []uint32{uint32(i)}, client.TransferOptions{})
			if err != nil {
				b.Fatal(err)
			}
			xs[i] = x
		}
		return xs
	}
	b.Run("WaitAll", func(b *testing.B) {
		for b.Loop() {
			if _, err := c.WaitAll(ctx, submit(b)...); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Wait each", func(b *testing.B) {
		for b.Loop() {
			for _, x := range submit(b) {
				if _, err := x.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}
