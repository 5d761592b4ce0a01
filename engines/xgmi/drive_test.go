// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

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
			h := enginetest.NewPollingHost(50)
			start := time.Now()
			tr, src, dst := polledCopy(t, h, false, tc.waited)
			if err := tc.wait(tr); err != nil {
				t.Fatalf("transfer: %v", err)
			}
			if got := h.Polled.Load() > 0; got != tc.wantPolled {
				t.Errorf("polled %d times, want polls: %v", h.Polled.Load(), tc.wantPolled)
			}
			if got := h.Ran.Load() > 0; got != tc.wantRan {
				t.Errorf("blocking waits %d, want one: %v", h.Ran.Load(), tc.wantRan)
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

// lander records what it saw when told that a transfer's bytes landed.
type lander struct {
	tr        engines.Transfer
	landed    func() bool // whether the bytes are in place
	told      atomic.Int64
	doneSeen  bool // Done was closed when told
	bytesSeen bool
}

func (l *lander) Landed() {
	l.told.Add(1)
	select {
	case <-l.tr.Done():
		l.doneSeen = true
	default:
	}
	l.bytesSeen = l.landed()
}

// TestDriveLandedTellsOfBytesBeforeTheBookkeeping: a waited transfer driven with a Lander tells it once, with
// the bytes in place and before Done closes (before regions are unpinned and the composite counts the part),
// directly and through the composite; a failed copy is not told, and neither is one whose driver gave up, even
// after it ends on the goroutine it was handed to.
func TestDriveLandedTellsOfBytesBeforeTheBookkeeping(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name       string
		composite  bool
		fail       bool
		ctx        context.Context
		wantDone   bool
		wantLanded bool
	}{
		{"engine", false, false, context.Background(), true, true},
		{"composite", true, false, context.Background(), true, true},
		{"engine, the copy fails", false, true, context.Background(), true, false},
		{"composite, the copy fails", true, true, context.Background(), true, false},
		{"engine, the driver gives up", false, false, cancelled, false, false},
		{"composite, the driver gives up", true, false, cancelled, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := enginetest.NewPollingHost(50)
			if tc.fail {
				h.SetFail(errors.New("the copy faulted"))
			}
			tr, src, dst := polledCopy(t, h, tc.composite, true)
			ctx := context.Background()
			l := &lander{tr: tr, landed: func() bool { return dst[5*64] == src[64] && dst[6*64+63] == src[2*64+63] }}
			ld, ok := tr.(engines.LandedDriven)
			if !ok {
				t.Fatalf("a waited block transfer (%T) cannot tell of its bytes landing", tr)
			}
			done, landed := ld.DriveLanded(tc.ctx, l)
			if done != tc.wantDone || landed != tc.wantLanded {
				t.Errorf("DriveLanded = done %v, landed %v; want %v, %v", done, landed, tc.wantDone, tc.wantLanded)
			}
			werr := tr.Wait(ctx) // a driver that gave up handed the copy on: it ends there
			if (werr != nil) != tc.fail {
				t.Errorf("transfer ended with %v, want a failure: %v", werr, tc.fail)
			}
			if want := map[bool]int64{true: 1, false: 0}[tc.wantLanded]; l.told.Load() != want {
				t.Errorf("lander told %d times, want %d", l.told.Load(), want)
			}
			if tc.wantLanded && (l.doneSeen || !l.bytesSeen) {
				t.Errorf("lander told with Done closed %v and the bytes in place %v; want false, true", l.doneSeen, l.bytesSeen)
			}
		})
	}
}

// polledCopy submits a copy of blocks 1 and 2 of a source of 8 blocks of 64 bytes to blocks 5 and 6 of a
// destination, through the xgmi engine over h (and a composite in front of it when asked).
func polledCopy(t *testing.T, h *enginetest.PollingHost, composite, waited bool) (tr engines.Transfer, src, dst []byte) {
	t.Helper()
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	var e engines.Engine = x
	if composite {
		if e, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x); err != nil {
			t.Fatal(err)
		}
	}
	src, dst = make([]byte, 8*64), make([]byte, 8*64)
	for i := range src {
		src[i] = byte(i + 1)
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
	if tr, err = e.Submit(ctx, plan.Build(), engines.SubmitOptions{Timeout: 10 * time.Second, Waited: waited}); err != nil {
		t.Fatal(err)
	}
	return tr, src, dst
}
