// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package transfers

import (
	"strings"
	"testing"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// TestTheListenerFurthestBehindLosesItsStream: past a caller's byte budget the listener whose oldest notification
// waits longest loses its stream, not the one holding the most bytes (a listener that reads but lagged a burst,
// beside one that stopped reading long ago), and never another caller's; a
// listener that reaches the count bound loses its own stream.
func TestTheListenerFurthestBehindLosesItsStream(t *testing.T) {
	s := &Service{listeners: map[string]map[*notifyListener]struct{}{}, notifyBytes: map[string]int{}}
	listener := func(key string) *notifyListener {
		l := &notifyListener{wake: make(chan struct{}, 1)}
		if s.listeners[key] == nil {
			s.listeners[key] = map[*notifyListener]struct{}{}
		}
		s.listeners[key][l] = struct{}{}
		return l
	}
	var seq uint64
	deliver := func(key string, payload int, to ...*notifyListener) {
		seq++
		for _, l := range to {
			s.queueLocked(key, l, &agentv1.Notification{Payload: make([]byte, payload), RegionIds: []uint64{1}}, seq)
		}
	}
	const small, large = 16, 64 << 10
	stopped, lagging, other := listener("pod/a"), listener("pod/a"), listener("pod/b")
	deliver("pod/b", small, other) // the oldest notification of all: another caller's
	deliver("pod/a", large, stopped)
	deliver("pod/a", large, stopped)
	for s.notifyBytes["pod/a"]+notificationBytes(&agentv1.Notification{Payload: make([]byte, large), RegionIds: []uint64{1}}) <= maxCallerNotifyBytes {
		deliver("pod/a", large, lagging)
	}
	if stopped.queued >= lagging.queued {
		t.Fatalf("set-up: the stopped listener holds %d bytes, the lagging one %d", stopped.queued, lagging.queued)
	}
	deliver("pod/a", large, lagging)
	switch {
	case stopped.lost == "" || lagging.lost != "" || other.lost != "":
		t.Fatalf("past the budget: stopped lost %q, lagging %q, another caller's %q; want the stopped one alone",
			stopped.lost, lagging.lost, other.lost)
	case !strings.Contains(stopped.lost, "furthest behind") || len(stopped.queue) != 0 || stopped.queued != 0:
		t.Fatalf("the stopped listener: %q, %d notifications (%d bytes) kept", stopped.lost, len(stopped.queue), stopped.queued)
	case s.notifyBytes["pod/a"] != lagging.queued || s.notifyBytes["pod/a"] > maxCallerNotifyBytes:
		t.Fatalf("pod/a holds %d bytes, its lagging listener %d (budget %d)", s.notifyBytes["pod/a"], lagging.queued, maxCallerNotifyBytes)
	}
	// The lagging listener reads one: its own next notification is the oldest of the caller's now, so it goes
	// when the budget is passed again, and the caller holds nothing.
	if n := s.nextLocked("pod/a", lagging); n == nil {
		t.Fatal("the lagging listener had nothing to read")
	}
	for range 8 { // 512 KiB: past what the stopped listener's loss left
		deliver("pod/a", large, lagging)
	}
	if lagging.lost == "" || s.notifyBytes["pod/a"] != 0 {
		t.Fatalf("the caller's one listener past the budget: lost %q, %d bytes held", lagging.lost, s.notifyBytes["pod/a"])
	}
	// The count bound: the listener that reaches it, although another caller's is further behind.
	full := listener("pod/c")
	for range maxListenerBacklog + 1 {
		deliver("pod/c", small, full)
	}
	if !strings.Contains(full.lost, "1024 notifications behind") || other.lost != "" || len(other.queue) != 1 {
		t.Fatalf("past the count: %q; another caller's listener lost %q with %d queued", full.lost, other.lost, len(other.queue))
	}
}

// TestAListenerWhoseClientStoppedReadingIsFurthestBehind: a listener whose send to its client has been held the
// longest (gRPC's flow control: the client does not read) goes before one holding older notifications that is
// sending as its client reads (gRPC's buffers had taken the first few off the first one's queue).
func TestAListenerWhoseClientStoppedReadingIsFurthestBehind(t *testing.T) {
	now := time.Now()
	queued := func(seq uint64, since time.Duration) *notifyListener {
		l := &notifyListener{queue: []queuedNotification{{seq: seq}}, queued: 100}
		if since > 0 {
			l.sendingSince = now.Add(-since)
		}
		return l
	}
	stuck, reading, idleOlder := queued(40, time.Second), queued(9, time.Millisecond), queued(5, 0)
	for _, tc := range []struct {
		name string
		a, b *notifyListener
		want bool
	}{
		{"held a second against sending for a millisecond", stuck, reading, true},
		{"sending for a millisecond against held a second", reading, stuck, false},
		{"held a second against not sending with older ones", stuck, idleOlder, true},
		{"both not sending: the older first", idleOlder, queued(9, 0), true},
		{"against an empty queue", reading, &notifyListener{}, true},
	} {
		if got := furtherBehind(tc.a, tc.b, now); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
