// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"testing"
	"time"
)

// TestStagedChunkBytes: a staged plan is cut into about two chunks per connection, within the bounds: never below stageChunkMin (unless the plan is smaller), never above a slot, always aligned.
func TestStagedChunkBytes(t *testing.T) {
	for _, tc := range []struct {
		total uint64
		conns int
		want  int
	}{
		{total: 1 << 30, conns: 4, want: stageSlot},               // large: whole slots
		{total: 11059200, conns: 4, want: 1408 << 10},             // 11 MB: 8 chunks of 1.375 MiB
		{total: 11059200, conns: 1, want: stageSlot},              // one connection: halves would exceed a slot
		{total: 4096, conns: 4, want: stageChunkMin},              // tiny: the minimum (one chunk carries it)
		{total: 8 * stageChunkMin, conns: 4, want: stageChunkMin}, // exactly two minimum chunks per connection
		{total: 100 << 20, conns: 64, want: 832 << 10},            // many connections: 100 MiB / 128, aligned up
	} {
		got := stagedChunkBytes(tc.total, tc.conns)
		if got != tc.want {
			t.Errorf("stagedChunkBytes(%d, %d) = %d, want %d", tc.total, tc.conns, got, tc.want)
		}
		if got%stageChunkAlign != 0 || got > stageSlot || got < stageChunkMin {
			t.Errorf("stagedChunkBytes(%d, %d) = %d: outside [%d, %d] or not a multiple of %d", tc.total, tc.conns, got, stageChunkMin, stageSlot, stageChunkAlign)
		}
	}
}

// TestRecvSpinning: a value sent while the receiver polls, one sent after it parked, and a closed channel are
// all received as <-ch would.
func TestRecvSpinning(t *testing.T) {
	ch := make(chan int, 1)
	go func() { ch <- 1 }()
	if v, ok := recvSpinning(ch, time.Second); v != 1 || !ok {
		t.Fatalf("got %d, %v while polling; want 1, true", v, ok)
	}
	go func() { time.Sleep(20 * time.Millisecond); ch <- 2 }()
	if v, ok := recvSpinning(ch, time.Microsecond); v != 2 || !ok {
		t.Fatalf("got %d, %v after parking; want 2, true", v, ok)
	}
	close(ch)
	if v, ok := recvSpinning(ch, time.Millisecond); v != 0 || ok {
		t.Fatalf("got %d, %v from a closed channel; want 0, false", v, ok)
	}
}

// TestCountdown: zero closes exactly when the last piece is done, and not before.
func TestCountdown(t *testing.T) {
	c := newCountdown()
	c.Add(1)
	c.Add(2)
	c.Done()
	c.Done()
	select {
	case <-c.zero:
		t.Fatal("zero closed with one piece outstanding")
	default:
	}
	c.Done()
	select {
	case <-c.zero:
	default:
		t.Fatal("zero not closed once every piece was done")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a Done below zero did not panic")
		}
	}()
	c.Done()
}
