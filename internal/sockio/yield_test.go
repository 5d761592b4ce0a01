// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/internal/coretest"
)

// TestSpinningReaderLeavesItsCoreToWaitingThreads: a reader spinning on a core that another thread needs (on a
// host whose cores are all busy, the caller's own thread, waiting to see its reply) offers the core often, so
// that thread runs within a fraction of a millisecond rather than when the reader's time slice or its whole spin
// ends: with and without a doorbell.
func TestSpinningReaderLeavesItsCoreToWaitingThreads(t *testing.T) {
	for _, withBell := range []bool{true, false} {
		name := "socket"
		if withBell {
			name = "doorbell"
		}
		t.Run(name, func(t *testing.T) {
			c, _ := unixPair(t)
			const spin = 150 * time.Millisecond
			_ = c.SetDeadline(time.Now().Add(spin + 50*time.Millisecond))
			bell := &testBell{} // never rings: the reader spins for its whole Spin, then waits on the socket
			bell.polling.Store(-1)
			r := SpinReader{Conn: c, Spin: spin, Doorbell: bell}
			var started atomic.Int64 // when the read began, in Unix nanoseconds
			if !withBell {
				r.Doorbell = nil
			}
			b := coretest.RunBeside(t, 100*time.Millisecond, func() {
				started.Store(time.Now().UnixNano())
				_, _ = r.Read(make([]byte, 64)) // nobody writes: it returns at the deadline
			}, func() bool {
				if withBell {
					return bell.polling.Load() == 1
				}
				at := started.Load()
				return at != 0 && time.Since(time.Unix(0, at)) < spin-10*time.Millisecond
			})
			// A reader that never offers its core leaves the other thread its share only at the scheduler's
			// slices (milliseconds each: over ten such waits in 100 ms); a few are left for the host's own noise.
			if b.Kept > 5 {
				t.Errorf("another thread on the spinning reader's CPU waited over 1 ms %d times in 100 ms (longest %v): the reader keeps its core", b.Kept, b.Longest)
			}
		})
	}
}
