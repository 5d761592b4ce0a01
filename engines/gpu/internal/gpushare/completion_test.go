// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gpushare

import (
	"context"
	"errors"
	"testing"
	"time"
)

type fakePending struct {
	end   Completion
	calls int
}

func (p *fakePending) ended(err error) (error, time.Duration) {
	p.calls++
	return err, time.Millisecond
}

func TestCompletionEndsOnce(t *testing.T) {
	p := &fakePending{}
	p.end.Start()
	if p.end.Ended() || p.end.DeviceTime() != 0 {
		t.Fatal("a new copy has ended")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := p.end.Block(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Block before the end = %v, want the context's error", err)
	}
	boom := errors.New("illegal address")
	p.end.Finish(boom, p.ended)
	p.end.Finish(nil, p.ended) // a later sighting of the end changes nothing
	if p.calls != 1 || !p.end.Ended() || p.end.Err() != boom || p.end.DeviceTime() != time.Millisecond {
		t.Fatalf("after two Finish: %d ends, err %v, gpu %v", p.calls, p.end.Err(), p.end.DeviceTime())
	}
	if err := p.end.Block(context.Background()); err != boom {
		t.Errorf("Block after the end = %v", err)
	}
	select {
	case <-p.end.Chan():
	default:
		t.Error("the channel is open after the end")
	}
}

// TestCompletionFinishAllocatesNothing: ending a copy (on the copy path, once per submission) allocates nothing.
func TestCompletionFinishAllocatesNothing(t *testing.T) {
	ps := make([]fakePending, 200)
	for i := range ps {
		ps[i].end.Start()
	}
	i := 0
	allocs := testing.AllocsPerRun(100, func() {
		p := &ps[i]
		i++
		p.end.Finish(nil, p.ended)
		_ = p.end.Ended()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per Finish, want 0", allocs)
	}
}
