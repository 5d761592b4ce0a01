// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package enginetest

import (
	"context"
	"net"
	"sync"
	"testing"
)

// Gate stalls a data path while shut. Engines' tests put it in front of what they cannot slow down otherwise:
// a backend's copy (Wait), or the connections a listener accepts (Listener).
type Gate struct {
	mu   sync.Mutex
	shut chan struct{} // nil while open
}

// Shut closes the gate until the returned release is called; it fits Harness.Gate.
func (g *Gate) Shut(testing.TB) (release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch := make(chan struct{})
	g.shut = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			if g.shut == ch {
				g.shut = nil
			}
			g.mu.Unlock()
			close(ch)
		})
	}
}

// Wait blocks while the gate is shut, until it opens or ctx ends (then it returns ctx's error).
func (g *Gate) Wait(ctx context.Context) error {
	g.mu.Lock()
	ch := g.shut
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Listener wraps ln: every Read and Write of an accepted connection waits while the gate is shut (or until
// the connection is closed).
func (g *Gate) Listener(ln net.Listener) net.Listener { return gatedListener{Listener: ln, g: g} }

type gatedListener struct {
	net.Listener
	g *Gate
}

func (l gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &gatedConn{Conn: c, g: l.g, ctx: ctx, cancel: cancel}, nil
}

type gatedConn struct {
	net.Conn
	g      *Gate
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *gatedConn) Read(b []byte) (int, error) {
	if err := c.g.Wait(c.ctx); err != nil {
		return 0, net.ErrClosed
	}
	return c.Conn.Read(b)
}

func (c *gatedConn) Write(b []byte) (int, error) {
	if err := c.g.Wait(c.ctx); err != nil {
		return 0, net.ErrClosed
	}
	return c.Conn.Write(b)
}

func (c *gatedConn) Close() error {
	c.cancel()
	return c.Conn.Close()
}

// shutNow reports whether the gate is shut.
func (g *Gate) shutNow() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut != nil
}
