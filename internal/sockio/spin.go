// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"errors"
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
	// Doorbell (may be nil) is shared memory watched beside the socket while spinning: Read returns ErrRung when
	// it rings.
	Doorbell Doorbell

	// offer is what offers the core while spinning (tests count it); nil is OfferCore.
	offer func()
}

// Doorbell is a request channel in shared memory beside the socket, which a reader polls without system calls.
type Doorbell interface {
	// Rung reports whether a request waits.
	Rung() bool
	// Polling tells the other side whether the reader watches the doorbell (true) or waits on the socket
	// (false), where it must be woken by a write. It is called with false before every wait on the socket, and
	// Rung is read once more after it.
	Polling(on bool)
}

// ErrRung is Read's answer when the doorbell rang: nothing was read from the socket.
var ErrRung = errors.New("the doorbell rang")

// socketEvery is how many doorbell polls pass between two looks at the clock (and at most one read of the socket)
// while spinning: a read is a system call, a poll of the doorbell a load.
const socketEvery = 32

// socketGap is the least time between two reads of the socket while a reader with a doorbell spins.
const socketGap = 5 * time.Microsecond

// YieldGap is how long a spinning reader (or any loop polling for the other side of a call) keeps its core before
// offering it to the kernel for another thread that waits for it (OfferCore): on a host whose cores are all
// busy, the thread waiting may be the other side's, its reply already written, and without the offer it ran only
// when the poller's time slice or spin ended (1.5–2 ms later). With nothing else to run the offer returns at once.
const YieldGap = 50 * time.Microsecond

// CoreOffers paces a polling loop's offers of its core (OfferCore) to one per YieldGap.
type CoreOffers struct {
	offer func()
	next  time.Time
}

// NewCoreOffers paces offer (nil: OfferCore) for a loop that starts polling at start.
func NewCoreOffers(start time.Time, offer func()) CoreOffers {
	if offer == nil {
		offer = OfferCore
	}
	return CoreOffers{offer: offer, next: start.Add(YieldGap)}
}

// Due offers the core when YieldGap has passed since the last offer (or the start); now is the loop's own reading
// of the clock.
func (o *CoreOffers) Due(now time.Time) {
	if now.After(o.next) {
		o.offer()
		o.next = now.Add(YieldGap)
	}
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
	bell := r.Doorbell
	if r.Spin <= 0 && bell == nil {
		return r.Conn.Read(p)
	}
	rc, err := r.Conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var (
		n    int
		rerr error
		rung bool
	)
	spinning := r.Spin > 0 && r.Budget.take()
	start := time.Now()
	until := start.Add(r.Spin)
	var nextRead time.Time
	offers := NewCoreOffers(start, r.offer)
	err = rc.Read(func(fd uintptr) bool {
		if bell != nil {
			bell.Polling(true)
		}
		for i := 0; ; i++ {
			if bell != nil && bell.Rung() {
				rung = true
				return true
			}
			if bell != nil && spinning {
				if i%socketEvery != 0 {
					continue
				}
				// A read of the socket is a system call, hundreds of doorbell polls long: while it runs, a
				// request in the doorbell waits. The socket carries little beside the doorbell (a frame too
				// large for it, the close), so it is read once per socketGap.
				now := time.Now()
				offers.Due(now)
				if now.Before(nextRead) && now.Before(until) {
					continue
				}
				nextRead = now.Add(socketGap)
			}
			n, rerr = syscall.Read(int(fd), p)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr != syscall.EAGAIN:
				return true
			case spinning:
				// No yield to the Go scheduler here: a yielding poller wakes idle processors to take it, and the
				// thread hops doubled every phase of a round trip on the H200 VM. The core is offered to the
				// kernel instead (OfferCore), which keeps the goroutine on its thread.
				if now := time.Now(); now.Before(until) {
					if bell == nil { // with a doorbell, the poll above offers
						offers.Due(now)
					}
					continue
				}
			}
			if spinning {
				spinning = false
				r.Budget.give()
			}
			if bell != nil {
				bell.Polling(false)
				if bell.Rung() { // raised before the caller could see that nobody watched
					rung = true
					return true
				}
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
	if rung {
		return 0, ErrRung
	}
	if rerr != nil {
		return 0, rerr
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}
