// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
)

// cutStopWait bounds how long a fast connection dropped under a call is kept for the agent to close its end. The
// agent closes it once the call's transfer stopped, which its engines bound by 30 s (a launched GPU copy) and the
// agent by 35 s.
const cutStopWait = 40 * time.Second

// cutCalls are the fast connections this client dropped under a call (its context ended, or the stream went out
// of step), each kept half-closed until the agent closes its end: the agent stops a waited transfer whose caller
// left, and closes the connection only once its copies stopped. That close is what Settle waits for.
type cutCalls struct {
	mu   sync.Mutex
	open map[*cutCall]struct{}
}

type cutCall struct {
	conn  *net.UnixConn
	ended chan struct{} // closed once the agent closed its end, or the wait gave up (err says why)
	err   error
}

// drop ends the client's side of conn: it says so to the agent at once (a half-close, which the agent reads as
// the caller gone) and keeps reading until the agent closes its end, within cutStopWait.
func (cc *cutCalls) drop(conn *net.UnixConn) {
	if conn.CloseWrite() != nil {
		conn.Close() // closed already (Close, or the agent's end gone)
		return
	}
	cut := &cutCall{conn: conn, ended: make(chan struct{})}
	cc.mu.Lock()
	if cc.open == nil {
		cc.open = map[*cutCall]struct{}{}
	}
	cc.open[cut] = struct{}{}
	cc.mu.Unlock()
	go func() {
		cut.err = awaitAgentClose(conn, time.Now().Add(cutStopWait))
		conn.Close()
		if cut.err == nil {
			cc.mu.Lock()
			delete(cc.open, cut)
			cc.mu.Unlock()
		}
		close(cut.ended) // one that failed stays until a Settle reported it
	}()
}

// awaitAgentClose reads (and discards: a reply to the cut call, wake-ups) until the agent closes conn, or until
// deadline.
func awaitAgentClose(conn *net.UnixConn, deadline time.Time) error {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("the agent did not close a connection whose call was cut short: %w", err)
	}
	return nil // EOF, or a reset: either way the agent's end is closed
}

// pending returns the cut calls not ended yet.
func (cc *cutCalls) pending() []*cutCall {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	out := make([]*cutCall, 0, len(cc.open))
	for cut := range cc.open {
		out = append(out, cut)
	}
	return out
}

func (cc *cutCalls) forget(cut *cutCall) {
	cc.mu.Lock()
	delete(cc.open, cut)
	cc.mu.Unlock()
}

// abandon stops waiting for every cut call (Close): the agent stops their transfers all the same.
func (cc *cutCalls) abandon() {
	for _, cut := range cc.pending() {
		_ = cut.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// Settle returns nil once every call of this client that was cut short before Settle was called (its context
// cancelled or expired while the agent served it) has stopped on the agent: the agent stops such a call's waited
// transfer, and nothing that transfer started lands in this node's memory after Settle returned nil. Call it
// before reusing memory that a cut-short call was writing into. It waits for every waited call of this client in
// flight when it is called (other goroutines' too), and returns ctx's error when ctx ends first; an error also
// when the agent did not stop a call within 40 s, or predates Settle: the memory may then still be written to.
// Unwaited transfers (Submit) are not waited for: Transfer.Cancel returns once one stopped.
func (c *Client) Settle(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	// Fast connections first: once the agent closed one, it had read every frame sent on it, so none of their
	// transfers is submitted after the question below.
	for _, cut := range c.cuts.pending() {
		select {
		case <-cut.ended:
			if cut.err != nil {
				c.cuts.forget(cut)
				return fmt.Errorf("settling the calls cut short: %w (its transfer's copies may still land)", cut.err)
			}
		case <-ctx.Done():
			return fmt.Errorf("settling the calls cut short: %w", ctx.Err())
		}
	}
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	if _, err := c.api.Settle(ctx, &agentv1.SettleRequest{}); err != nil {
		if status.Code(err) == codes.Unimplemented {
			err = fmt.Errorf("the agent predates Settle, and the copies of a call cut short may still land: %w", err)
		}
		return c.wrap(ctx, "settling the calls cut short", gen, err)
	}
	return nil
}
