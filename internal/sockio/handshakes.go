// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package sockio

import (
	"cmp"
	"fmt"
	"net"
	"sync"
)

// DefaultMaxHandshakes and DefaultMaxHandshakesPerSource are the agent's TCP ports' bounds: a node dials one
// channel connection and ConnsPerPeer (4) data connections to another, and a thousand nodes starting at once
// finish their handshakes in milliseconds each.
const (
	DefaultMaxHandshakes          = 1024
	DefaultMaxHandshakesPerSource = 32
)

// Handshakes bounds the connections a TCP listener holds before they authenticate, in all and per source
// address: anyone who can reach the port can open them, and each holds a descriptor and a goroutine until its
// handshake deadline. A connection beyond either bound is closed at once; those that authenticated are not
// counted, so a flood from some addresses leaves room for the others' handshakes.
type Handshakes struct {
	// Max and MaxPerSource bound the connections being authenticated in all and from one address (zero:
	// DefaultMaxHandshakes, DefaultMaxHandshakesPerSource).
	Max, MaxPerSource int

	mu     sync.Mutex
	counts Counts[string]
}

// Enter counts a connection from remote as authenticating; leave uncounts it once it authenticated or failed.
// A connection past a bound gets an error that says which.
func (h *Handshakes) Enter(remote net.Addr) (leave func(), err error) {
	source := sourceOf(remote)
	max, perSource := cmp.Or(h.Max, DefaultMaxHandshakes), cmp.Or(h.MaxPerSource, DefaultMaxHandshakesPerSource)
	h.mu.Lock()
	defer h.mu.Unlock()
	total, mine, ok := h.counts.Enter(source, max, perSource)
	if !ok {
		if mine >= perSource {
			return nil, fmt.Errorf("%d connections from %s are being authenticated (limit %d)", mine, source, perSource)
		}
		return nil, fmt.Errorf("%d connections are being authenticated (limit %d)", total, max)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			h.mu.Lock()
			h.counts.Leave(source)
			h.mu.Unlock()
		})
	}, nil
}

// sourceOf is the address a connection came from without its port.
func sourceOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host
	}
	return a.String()
}
