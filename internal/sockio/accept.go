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

// Accept returns accept's next connection. Running out of descriptors (EMFILE, ENFILE) does not end a
// socket: any local process (any host, for a TCP listener) can open connections until the agent has none left,
// and a listener that gave up then would stay dead after they closed. Accept calls exhausted, waits
// ExhaustedPause for connections to end, and tries again, as it does after a timeout or an aborted connection.
// Any other error (the listener closed) is returned.
func Accept[C net.Conn](accept func() (C, error), exhausted func()) (C, error) {
	for {
		conn, err := accept()
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
			return conn, err
		}
	}
}
