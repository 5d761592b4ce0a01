// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"io"
	"net"
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
	until := time.Now().Add(r.Spin)
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), p)
			switch {
			case rerr == syscall.EINTR:
				continue
			case rerr != syscall.EAGAIN:
				return true
			case time.Now().After(until):
				return false // park until readable
			}
		}
	})
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
