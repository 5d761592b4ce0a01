// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"runtime"
	"sync/atomic"
	"time"
)

// handoffSpin is how long a goroutine of a running staged transfer polls for its next piece of work before it
// parks. Waking a parked goroutine took 80 µs at the 90th percentile and 250-300 µs at the 99th on a virtualized
// GPU host (the OS must wake an idle CPU), as long as a chunk's time on the wire, while the next chunk of a
// running transfer is usually microseconds away.
const handoffSpin = 200 * time.Microsecond

// firstChunkSpin is how long a sending lane polls for its first chunk: that one comes only once the producer
// gathered it on the GPU, which for a block list's chunk (thousands of blocks, one kernel) took 190-300 µs on
// the H200 VM, past handoffSpin; lanes that had parked by then started sending 80 µs late. Bounded, since a
// GPU shared with a computing process can take milliseconds to gather.
const firstChunkSpin = 2 * time.Millisecond

// recvSpinning receives from ch like <-ch, polling it for up to spin first (yielding the processor between polls).
func recvSpinning[T any](ch <-chan T, spin time.Duration) (T, bool) {
	until := time.Now().Add(spin)
	for i := 1; ; i++ {
		select {
		case v, ok := <-ch:
			return v, ok
		default:
		}
		if i%16 == 0 && !time.Now().Before(until) {
			break
		}
		runtime.Gosched()
	}
	v, ok := <-ch
	return v, ok
}

// countdown counts a staged transfer's outstanding work and closes zero once it reaches nothing, on the
// goroutine that finished the last piece (a WaitGroup would need another goroutine to wait and hand over).
// The count must not reach zero before every piece was added: the transfer holds one until it has started
// its goroutines.
type countdown struct {
	n    atomic.Int64
	zero chan struct{}
}

func newCountdown() *countdown { return &countdown{zero: make(chan struct{})} }

func (c *countdown) Add(k int) { c.n.Add(int64(k)) }

func (c *countdown) Done() {
	switch n := c.n.Add(-1); {
	case n == 0:
		close(c.zero)
	case n < 0:
		panic("tcp: countdown below zero")
	}
}
