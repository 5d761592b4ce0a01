// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// SpinReader reads a Unix socket, first polling it without blocking for up to Spin and only then parking in the
// runtime's poller. Waking a parked reader across processes costs tens of microseconds on a typical node; a
// short spin keeps back-to-back small transfers off that path, at the price of a busy core while it spins.
// Deadlines set on the connection still apply.
type SpinReader struct {
	Conn *net.UnixConn
	Spin time.Duration
	// Budget (may be nil: no bound) bounds how many readers spin at once; a reader that finds it spent parks
	// at once.
	Budget *SpinBudget
}

// SpinBudget bounds the readers spinning at one time, and with them the cores a server keeps busy for latency.
type SpinBudget struct {
	size int64
	left atomic.Int64
}

// NewSpinBudget lets n readers spin at once.
func NewSpinBudget(n int) *SpinBudget {
	b := &SpinBudget{size: int64(n)}
	b.left.Store(int64(n))
	return b
}

func (b *SpinBudget) take() bool {
	if b == nil {
		return true
	}
	if b.left.Add(-1) >= 0 {
		return true
	}
	b.left.Add(1)
	return false
}

func (b *SpinBudget) give() {
	if b != nil {
		b.left.Add(1)
	}
}

// Spinning reports how many readers spin now.
func (b *SpinBudget) Spinning() int {
	return int(b.size - b.left.Load())
}

func (r SpinReader) Read(p []byte) (int, error) {
	if r.Spin <= 0 {
		return r.Conn.Read(p)
	}
	rc, err := r.Conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		n    int
		rerr error
	)
	spinning := r.Budget.take()
	until := time.Now().Add(r.Spin)
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr != syscall.EAGAIN:
				return true
			case spinning && time.Now().Before(until):
				// No yield here: a yielding poller wakes idle processors to take it, and the thread hops
				// doubled every phase of a round trip on the H200 VM.
				continue
			}
			if spinning {
				spinning = false
				r.Budget.give()
			}
			return false // park until readable
		}
	})
	if spinning {
		r.Budget.give()
	}
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}
