// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"net"
	"sync"
	"syscall"
	"time"
)

// hangupWatchAfter is how long a fast call runs before the agent watches its connection for the caller going away:
// calls shorter than that (nearly all) never start the watch.
const hangupWatchAfter = 2 * time.Millisecond

// hangupWatch tells when the caller of a fast call that lasts closes its connection (an interrupted or cancelled
// call: both clients drop the connection then), so the agent stops the call's waited transfer instead of copying
// for nobody. The connection's goroutine serves the call and does not read the socket meanwhile; the watch peeks
// at it (MSG_PEEK: nothing is consumed) from the timer's goroutine, parked in the runtime's poller until the socket
// turns readable. Anything other than the end of the connection (bytes the caller sent) ends the watch and leaves
// the call alone.
type hangupWatch struct {
	conn  *net.UnixConn
	gone  func()
	timer *time.Timer

	mu        sync.Mutex
	armed     bool          // a call is being served, and the socket's next byte starts a frame
	doorbells bool          // the connection has a mailbox: empty frames are its doorbells
	running   chan struct{} // a watch runs; closed when it returned
}

func newHangupWatch(conn *net.UnixConn, gone func()) *hangupWatch {
	w := &hangupWatch{conn: conn, gone: gone}
	w.timer = time.AfterFunc(time.Hour, w.fire)
	w.timer.Stop()
	return w
}

// arm starts the watch's clock for a call: it watches once the call lasts hangupWatchAfter. atFrame says the
// socket's next byte starts a frame (the connection's reader holds none of the next one: a caller that sent it is
// there, and the watch would read the middle of it); doorbells, that empty frames are doorbells to read (a
// connection with a mailbox; without one an empty frame is a request, answered in its turn).
func (w *hangupWatch) arm(atFrame, doorbells bool) {
	if !atFrame {
		return
	}
	w.mu.Lock()
	w.armed, w.doorbells = true, doorbells
	w.mu.Unlock()
	w.timer.Reset(hangupWatchAfter)
}

// disarm ends the watch when the call ends, before the connection's goroutine reads the socket again: a watch
// still parked on the socket is woken by a read deadline in the past, waited for, and the deadline cleared.
func (w *hangupWatch) disarm() {
	w.timer.Stop()
	w.mu.Lock()
	w.armed = false
	running := w.running
	w.mu.Unlock()
	if running == nil {
		return
	}
	_ = w.conn.SetReadDeadline(time.Unix(1, 0))
	<-running
	_ = w.conn.SetReadDeadline(time.Time{})
	w.mu.Lock()
	w.running = nil
	w.mu.Unlock()
}

// fire runs on the timer's goroutine: it watches the socket while the call is still served.
func (w *hangupWatch) fire() {
	w.mu.Lock()
	if !w.armed || w.running != nil {
		w.mu.Unlock()
		return
	}
	done := make(chan struct{})
	w.running = done
	doorbells := w.doorbells
	w.mu.Unlock()
	defer close(done)
	if w.closed(doorbells) {
		w.gone()
	}
}

// closed parks until the socket is readable and reports whether that is its end (or a reset); false when a frame
// waits there, or the watch was ended (disarm's deadline). With doorbells, empty frames (four zero bytes) are read
// and the watch goes on: a mailbox caller rings before the agent takes its request, and after an early reply, for
// its next request, which the connection's reader finds in the mailbox without them.
func (w *hangupWatch) closed(doorbells bool) bool {
	rc, err := w.conn.SyscallConn()
	if err != nil {
		return false
	}
	var (
		buf  [64]byte
		gone bool
	)
	_ = rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				return false // park until readable, or the deadline
			case err != nil || n == 0:
				gone = true // reset, or the caller closed its end
				return true
			case !doorbells:
				return true // a frame: the connection's reader's
			}
			bells := 0
			for bells+4 <= n && buf[bells]|buf[bells+1]|buf[bells+2]|buf[bells+3] == 0 {
				bells += 4
			}
			switch {
			case bells > 0:
				if _, err := syscall.Read(int(fd), buf[:bells]); err != nil && err != syscall.EINTR && err != syscall.EAGAIN {
					gone = true
					return true
				}
			case n < 4 && buf[0]|buf[n-1] == 0 && (n < 3 || buf[1] == 0):
				return false // part of a doorbell: the rest makes the socket readable again
			default:
				return true // a frame: the connection's reader's
			}
		}
	})
	return gone
}
