// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// ExhaustedPause is how long Accept waits after the process ran out of descriptors before accepting again.
const ExhaustedPause = 10 * time.Millisecond

// Accept accepts the listener's next connection. Running out of descriptors (EMFILE, ENFILE) does not end a
// socket: any local process can open connections until the agent has none left, and a listener that gave up
// then would stay dead after they closed. Accept calls exhausted, waits ExhaustedPause for connections to end,
// and tries again, as it does after a timeout or an aborted connection. Any other error (the listener closed)
// is returned.
func Accept(ln *net.UnixListener, exhausted func()) (*net.UnixConn, error) {
	for {
		conn, err := ln.AcceptUnix()
		if err == nil {
			return conn, nil
		}
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout(), errors.Is(err, syscall.ECONNABORTED):
		case errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE):
			exhausted()
			time.Sleep(ExhaustedPause)
		default:
			return nil, err
		}
	}
}
