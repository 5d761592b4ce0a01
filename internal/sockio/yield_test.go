// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"testing"
	"time"
)

// TestSpinningReaderOffersItsCore: a reader spinning for its next frame offers its core every YieldGap, with and
// without a doorbell (on a host whose cores are all busy, the thread waiting for that core may be the caller's,
// its reply written: on an H100 VM a reply sat 2 ms in the mailbox until the agent's reader stopped spinning), and
// one that may not spin offers nothing. The offers are counted, not their effect: that depends on the host's load.
func TestSpinningReaderOffersItsCore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bell    bool
		spin    time.Duration
		atLeast int // offers while it spins
		atMost  int
	}{
		{"doorbell", true, 30 * time.Millisecond, 30, 1 << 20},
		{"socket", false, 30 * time.Millisecond, 30, 1 << 20},
		{"no spin", true, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := unixPair(t)
			_ = c.SetDeadline(time.Now().Add(tc.spin + 20*time.Millisecond)) // nobody writes: Read ends here
			offers := 0
			r := SpinReader{Conn: c, Spin: tc.spin, offer: func() { offers++ }}
			if tc.bell {
				r.Doorbell = &testBell{} // never rings
			}
			start := time.Now()
			if _, err := r.Read(make([]byte, 64)); err == nil {
				t.Fatal("a read of a socket nobody wrote to returned")
			}
			t.Logf("%d offers over %v", offers, time.Since(start))
			// 30 ms of spinning is 600 gaps of 50 µs; a twentieth of them leaves room for a slow, shared machine.
			if offers < tc.atLeast || offers > tc.atMost {
				t.Errorf("%d offers of the core over a read of %v spinning %v, want %d to %d", offers, time.Since(start), tc.spin, tc.atLeast, tc.atMost)
			}
		})
	}
}
