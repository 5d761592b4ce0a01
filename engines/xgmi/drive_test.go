// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

// pollingHost is the host backend posing as a BlockCopier whose copies end after a number of polls, as a GPU
// copy is seen done by polling its event: it copies at start, then Poll reports done on the polls-th call.
// It counts polls and blocking waits.
type pollingHost struct {
	*xgmi.HostBackend
	polls       int64
	polled, ran atomic.Int64
}

func (h *pollingHost) StartBlocks(ctx context.Context, works []engines.Work) (xgmi.Started, error) {
	for _, w := range works {
		if err := h.HostBackend.Copy(ctx, w); err != nil {
			return xgmi.Started{}, err
		}
	}
	var n atomic.Int64
	return xgmi.Started{
		Wait: func(context.Context) error { h.ran.Add(1); return nil },
		Poll: func() (bool, error) { h.polled.Add(1); return n.Add(1) >= h.polls, nil },
	}, nil
}

// TestWaitedTransfersAreSeenDoneByTheirWaiter: a transfer submitted as Waited is completed by its waiter's
// own polls (no goroutine's blocking wait); one nobody waits for, and one whose waiter gives up, are handed
// to a goroutine and complete; without Waited the goroutine takes it at once.
func TestWaitedTransfersAreSeenDoneByTheirWaiter(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name       string
		waited     bool
		wait       func(engines.Transfer) error
		wantPolled bool
		wantRan    bool
	}{
		{"waited, Wait polls", true, func(tr engines.Transfer) error { return tr.Wait(context.Background()) }, true, false},
		{"waited, nobody waits", true, func(tr engines.Transfer) error { <-tr.Done(); return tr.Wait(context.Background()) }, false, true},
		{"waited, the waiter gives up", true, func(tr engines.Transfer) error {
			if tr.(engines.Driven).Drive(cancelled) {
				t.Error("Drive with an ended context reported done before the copy ended")
			}
			<-tr.Done()
			return tr.Wait(context.Background())
		}, true, true},
		{"not waited", false, func(tr engines.Transfer) error { <-tr.Done(); return tr.Wait(context.Background()) }, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &pollingHost{HostBackend: xgmi.NewHostBackend(), polls: 50}
			e, err := xgmi.New(xgmi.Options{Node: "node-a"}, h)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			src, dst := make([]byte, 8*64), make([]byte, 8*64)
			for i := range src {
				src[i] = byte(i)
			}
			ctx := context.Background()
			for id, buf := range map[string][]byte{"node-a/s": src, "node-a/d": dst} {
				if _, err := e.Register(ctx, engines.MemoryDesc{ID: engines.MemoryID(id), Node: "node-a", Size: uint64(len(buf)),
					Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: buf}}); err != nil {
					t.Fatal(err)
				}
			}
			plan := e.NewPlan()
			if err := plan.(engines.BlockAdder).AddBlocks(engines.Blocks{Pairs: []engines.BlockPair{{Src: "node-a/s", Dst: "node-a/d"}},
				BlockBytes: 64, SrcIDs: []uint32{1, 2}, DstIDs: []uint32{5, 6}}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			tr, err := e.Submit(ctx, plan.Build(), engines.SubmitOptions{Timeout: 10 * time.Second, Waited: tc.waited})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.wait(tr); err != nil {
				t.Fatalf("transfer: %v", err)
			}
			if got := h.polled.Load() > 0; got != tc.wantPolled {
				t.Errorf("polled %d times, want polls: %v", h.polled.Load(), tc.wantPolled)
			}
			if got := h.ran.Load() > 0; got != tc.wantRan {
				t.Errorf("blocking waits %d, want one: %v", h.ran.Load(), tc.wantRan)
			}
			if tc.waited && !tc.wantPolled && time.Since(start) < engines.WaitedHandoff {
				t.Errorf("the goroutine took the transfer after %v, before the handoff time %v", time.Since(start), engines.WaitedHandoff)
			}
			if dst[5*64+3] != src[1*64+3] || dst[6*64] != src[2*64] {
				t.Error("blocks not moved")
			}
		})
	}
}
