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
	"sync/atomic"
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

// waitedCalls counts the client's waited transfer calls in flight in two phases, so that Settle can wait for those
// that started before it without a call paying more than two atomic adds: a goroutine may cancel a call's context
// and call Settle before that call has even noticed (its connection not yet dropped, its request maybe not yet
// read by the agent).
type waitedCalls struct {
	phase  atomic.Uint32
	active [2]atomic.Int64
	turn   chan struct{} // one Settle flips the phase at a time
	// flips counts the drains that flipped the phase; drained is the count of the last one that finished. A
	// Settle that finds a drain which flipped after it arrived finished already shares it, rather than each of
	// many concurrent Settles waiting for a flip of its own behind the others.
	flips, drained atomic.Uint64
}

// enter counts a waited call in the current phase, which it returns for leave.
func (w *waitedCalls) enter() uint32 {
	for {
		p := w.phase.Load() & 1
		w.active[p].Add(1)
		if w.phase.Load()&1 == p {
			return p // counted before any flip that follows: that flip's Settle waits for it
		}
		w.active[p].Add(-1)
	}
}

func (w *waitedCalls) leave(p uint32) { w.active[p].Add(-1) }

// drain flips the phase and waits, within ctx, until every call counted before the flip has left. The phase before
// the current one takes no new calls, but may still hold some when an earlier drain ended with its context: those
// are waited for first.
func (w *waitedCalls) drain(ctx context.Context) error {
	arrived := w.flips.Load()
	select {
	case w.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-w.turn }()
	if w.drained.Load() > arrived {
		return nil // a drain that flipped after this one arrived has finished: it waited for what this one would
	}
	if err := w.awaitNone(ctx, w.phase.Load()+1); err != nil {
		return err
	}
	n := w.flips.Add(1)
	if err := w.awaitNone(ctx, w.phase.Add(1)-1); err != nil {
		return err
	}
	w.drained.Store(n)
	return nil
}

// awaitNone waits until no call of phase p is in flight. A call cut short returns within the time its goroutine
// takes to notice (microseconds to a millisecond): polled, sleeping a little longer each time.
func (w *waitedCalls) awaitNone(ctx context.Context, p uint32) error {
	for pause := 20 * time.Microsecond; w.active[p&1].Load() > 0; pause = min(2*pause, time.Millisecond) {
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Settle returns nil once every call of this client that was cut short before Settle was called (its context
// cancelled or expired while the agent served it) has stopped on the agent: the agent stops such a call's waited
// transfer, and nothing that transfer started lands in this node's memory after Settle returned nil. Call it
// before reusing memory that a cut-short call was writing into; a call cancelled by another goroutine is covered
// from the moment its context was cancelled, whether or not the call has returned. It waits for every waited call
// of this client in flight when it is called (other goroutines' too), and returns ctx's error when ctx ends first;
// an error also when the agent did not stop a call within 40 s, or predates Settle: the memory may then still be
// written to.
// Unwaited transfers (Submit) are not waited for: Transfer.Cancel returns once one stopped.
func (c *Client) Settle(ctx context.Context) error {
	if c.closed.Load() {
		return ErrClosed
	}
	// Waited calls in flight first (those cut short return at once, and drop their fast connections); then the
	// dropped fast connections: once the agent closed one, it had read every frame sent on it, so none of their
	// transfers is submitted after the question below.
	if err := c.waited.drain(ctx); err != nil {
		return fmt.Errorf("settling the calls cut short: waiting for the waited calls in flight: %w", err)
	}
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
