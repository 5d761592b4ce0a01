// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/fabricxfer/fabricxfer/engines"
)

// peer is the client side towards one remote agent: several connections and a budget of bytes in flight.
type peer struct {
	e     *Engine
	node  string
	addr  string
	name  string // "node (addr)", for errors
	conns []*conn
	// maxParts is the most parts a vectored request to this peer may carry (what every connection negotiated).
	maxParts int
	budget   *semaphore.Weighted
	next     atomic.Uint64

	ready   chan struct{} // closed once dialing finished (dialErr says how)
	dialErr error

	dead     chan struct{}
	deadOnce sync.Once
	deadErr  error
}

// request is one chunk (or notification) on a connection. Its buffer is touched by the sender while writing
// and by the receiver while reading a reply into it; done runs once the outcome is known and nobody touches
// the buffer any more.
type request struct {
	op  byte
	mem engines.MemoryID
	off uint64
	buf []byte
	// parts, for a vectored request (opWriteV, opReadV) instead of off and buf, are the plan's parts as they are:
	// their remote offsets and sizes describe the request, and their local offsets index host.
	parts []part
	host  []byte
	// packed, for a vectored request whose parts lie back to back in part order (a staging slot) instead of in
	// host: their bytes, written or read as one buffer instead of one per part. Read so, a record opens straight
	// into the slot; read per part, every record was opened into the stream's buffer and copied out 720 bytes at a
	// time.
	packed []byte
	done   func(error)
	c      *conn // set by send

	// guarded by conn.mu
	id        uint64
	holds     int
	result    error
	hasResult bool
	completed bool
}

type conn struct {
	p  *peer
	nc net.Conn
	// raw is the TCP connection under nc. Failing closes it rather than nc: closing a TLS connection first
	// sends an alert, which can block for seconds behind a full send buffer towards a partitioned peer.
	raw net.Conn
	// wsem serialises writers; a channel so that waiting for it can be abandoned.
	wsem chan struct{}

	mu      sync.Mutex
	pending map[uint64]*request
	lastID  uint64
	failed  bool
}

func (p *peer) lost(err error) error {
	return &engines.PeerLostError{Peer: p.name, Err: err}
}

// kill fails the peer: every connection is closed and every request fails with a PeerLostError.
func (p *peer) kill(err error) {
	p.deadOnce.Do(func() {
		p.deadErr = p.lost(err)
		close(p.dead)
		p.e.forgetPeer(p)
		for _, c := range p.conns {
			c.fail(p.deadErr)
		}
	})
}

// dial opens the peer's connections, all at once, so the handshakes overlap; called once by whoever created
// the peer. The first failure abandons the others.
func (p *peer) dial(ctx context.Context) {
	defer close(p.ready)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type dialed struct {
		nc, raw net.Conn
		err     error
	}
	results := make([]dialed, p.e.opts.ConnsPerPeer)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc, raw, err := p.e.dialConn(ctx, p.addr, p.node)
			if err != nil {
				cancel()
			}
			results[i] = dialed{nc: nc, raw: raw, err: err}
		}()
	}
	wg.Wait()
	var err error
	for _, r := range results {
		// The first error that is not the cancellation caused by another one.
		if r.err != nil && (err == nil || errors.Is(err, context.Canceled)) {
			err = r.err
		}
	}
	if err != nil {
		p.dialErr = p.lost(fmt.Errorf("dialing: %w", err))
		for _, r := range results {
			if r.raw != nil {
				r.raw.Close()
			}
		}
		p.deadOnce.Do(func() { p.deadErr = p.dialErr; close(p.dead) })
		p.e.forgetPeer(p)
		return
	}
	p.maxParts = maxVecPartsWide
	for _, r := range results {
		p.e.stats.dialed.Add(1)
		p.conns = append(p.conns, &conn{p: p, nc: r.nc, raw: r.raw, wsem: make(chan struct{}, 1), pending: map[uint64]*request{}})
		p.maxParts = min(p.maxParts, vecPartsOn(r.nc))
	}
	for _, c := range p.conns {
		go c.recvLoop()
	}
}

// pick returns the next connection, round robin.
func (p *peer) pick() *conn {
	return p.conns[p.next.Add(1)%uint64(len(p.conns))]
}

// dialConn connects, wraps with TLS when configured and exchanges hellos, all bounded by DialTimeout. It returns
// the connection to use and the TCP connection under it.
func (e *Engine) dialConn(ctx context.Context, addr, node string) (nc, raw net.Conn, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.opts.DialTimeout)
	defer cancel()
	raw, err = e.opts.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	deadline, _ := ctx.Deadline()
	raw.SetDeadline(deadline)
	nc = raw
	if e.opts.TLS != nil {
		cfg := e.opts.TLS.Clone()
		if cfg.ServerName == "" && !cfg.InsecureSkipVerify {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, nil, fmt.Errorf("TLS handshake: %w", err)
		}
		nc = tc
	}
	hello := append([]byte(magic), appendString16(appendString16(nil, e.opts.Node), node)...)
	if _, err := nc.Write(hello); err != nil {
		raw.Close()
		return nil, nil, fmt.Errorf("hello: %w", err)
	}
	var head [5]byte
	if _, err := io.ReadFull(nc, head[:]); err != nil {
		raw.Close()
		return nil, nil, fmt.Errorf("hello: %w", err)
	}
	server, err := readString16(nc, maxNameLen)
	if err != nil || string(head[:4]) != magic {
		raw.Close()
		return nil, nil, fmt.Errorf("hello: malformed answer (%v)", err)
	}
	if server != node {
		raw.Close()
		return nil, nil, fmt.Errorf("hello: %s answers as node %q, expected %q", addr, server, node)
	}
	if head[4] != statusOK {
		raw.Close()
		return nil, nil, fmt.Errorf("hello: node %s at %s refused this node %q (its log says why: a certificate of another node?)", node, addr, e.opts.Node)
	}
	if tc, ok := nc.(*tls.Conn); ok && e.opts.CheckPeer != nil {
		if err := e.opts.CheckPeer(tc.ConnectionState(), node); err != nil {
			raw.Close()
			return nil, nil, fmt.Errorf("hello: node %s at %s: %w", node, addr, err)
		}
	}
	if tc, ok := nc.(*tls.Conn); ok && sealedNegotiated(tc) {
		if nc, err = newSealedConn(raw, tc, true, &e.sealBufs); err != nil {
			raw.Close()
			return nil, nil, fmt.Errorf("hello: node %s at %s: %w", node, addr, err)
		}
	}
	raw.SetDeadline(time.Time{})
	return nc, raw, nil
}

// send writes r on the connection, on the caller's goroutine, after the writers before it (waiting for them
// can be abandoned through ctx). On nil, r.done will be called exactly once, when r's answer arrived, it was
// cancelled, or the peer was lost; on an error, r was not sent and done will not be called.
func (c *conn) send(ctx context.Context, r *request) error {
	r.c = c
	select {
	case c.wsem <- struct{}{}:
	case <-c.p.dead:
		return c.p.deadErr
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.wsem }()
	c.mu.Lock()
	if c.failed {
		c.mu.Unlock()
		return c.p.deadErr
	}
	c.lastID++
	r.id = c.lastID
	r.holds++
	c.pending[r.id] = r
	if len(c.pending) == 1 {
		c.nc.SetReadDeadline(time.Now().Add(c.p.e.opts.Liveness))
	}
	c.mu.Unlock()

	length := r.length()
	hdr := make([]byte, 0, reqHeaderSize+256+4+12*len(r.parts))
	hdr = appendReqHeader(hdr, reqHeader{op: r.op, id: r.id, off: r.off, length: length, mem: r.mem})
	bufs := net.Buffers{}
	switch r.op {
	case opWriteV:
		bufs = append(bufs, appendParts(hdr, r.parts))
		if r.packed != nil {
			bufs = append(bufs, r.packed)
			break
		}
		for _, p := range r.parts {
			bufs = append(bufs, r.hostPart(p))
		}
	case opReadV:
		bufs = append(bufs, appendParts(hdr, r.parts))
	case opRead:
		bufs = append(bufs, hdr)
	default:
		bufs = append(bufs, hdr, r.buf)
	}
	c.nc.SetWriteDeadline(time.Now().Add(c.p.e.opts.PeerTimeout))
	err := writeBuffers(c.nc, bufs, &c.p.e.scratch)
	if err == nil && (r.op == opWrite || r.op == opWriteV) {
		c.p.e.stats.sent.Add(length)
	}
	c.mu.Lock()
	r.holds--
	f := r.settleIfReady()
	c.mu.Unlock()
	run(f)
	if err != nil {
		c.p.kill(fmt.Errorf("sending: %w", err)) // fails r, which is pending
	}
	return nil
}

// length is the request's payload size (written, or asked for).
func (r *request) length() uint64 {
	if r.packed != nil {
		return uint64(len(r.packed))
	}
	if r.parts == nil {
		return uint64(len(r.buf))
	}
	var n uint64
	for _, p := range r.parts {
		n += p.n
	}
	return n
}

// hostPart is the local bytes of part p of a vectored request over host memory.
func (r *request) hostPart(p part) []byte { return r.host[p.localOff : p.localOff+p.n] }

// settle records r's outcome (first one wins) and completes it when nobody holds its buffer. Caller holds c.mu;
// the returned function, if any, must be called after unlocking.
func (r *request) settle(err error) func() {
	if !r.hasResult {
		r.hasResult, r.result = true, err
	}
	if r.holds > 0 || r.completed {
		return nil
	}
	r.completed = true
	done, result := r.done, r.result
	return func() { done(result) }
}

func run(fns ...func()) {
	for _, f := range fns {
		if f != nil {
			f()
		}
	}
}

// cancel abandons r: it fails with err as soon as no I/O touches its buffer.
func (c *conn) cancel(r *request, err error) {
	c.mu.Lock()
	if r.id != 0 && c.pending[r.id] == r {
		delete(c.pending, r.id)
	}
	f := r.settle(err)
	c.mu.Unlock()
	run(f)
}

// settleIfReady completes r when a result is known and no I/O holds it. Caller holds c.mu.
func (r *request) settleIfReady() func() {
	if !r.hasResult {
		return nil
	}
	return r.settle(nil)
}

// fail closes the connection and fails every request waiting for an answer on it.
func (c *conn) fail(err error) {
	c.raw.Close()
	c.mu.Lock()
	c.failed = true
	var fs []func()
	for id, r := range c.pending {
		delete(c.pending, id)
		fs = append(fs, r.settle(err))
	}
	c.mu.Unlock()
	run(fs...)
}

func (c *conn) recvLoop() {
	br := bufio.NewReaderSize(&progressReader{c: c}, 64<<10)
	hdr := make([]byte, respHeaderSize)
	for {
		n, err := io.ReadFull(br, hdr)
		if err != nil {
			if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && c.idle() {
				continue // the deadline was armed for requests that were abandoned since
			}
			c.p.kill(c.explain(err))
			return
		}
		h := parseRespHeader(hdr)
		if err := c.handle(br, h); err != nil {
			c.p.kill(c.explain(err))
			return
		}
		c.mu.Lock()
		if len(c.pending) > 0 {
			c.nc.SetReadDeadline(time.Now().Add(c.p.e.opts.Liveness))
		} else {
			c.nc.SetReadDeadline(time.Time{})
		}
		c.mu.Unlock()
	}
}

// progressReader is what recvLoop reads through: every byte that arrives proves the peer alive, so it pushes
// the read deadline (armed while requests wait for answers) Liveness ahead. A large read answer streaming in
// therefore never trips it, and a partition trips it within Liveness whatever was in flight. The deadline
// moves at most every Liveness/8, so a fast stream costs a clock read per Read call.
type progressReader struct {
	c        *conn
	extended time.Time
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.c.nc.Read(b)
	if n > 0 {
		// Only recvLoop's goroutine reads, and it clears the deadline itself once nothing is pending, so
		// pushing it here needs no lock.
		live := r.c.p.e.opts.Liveness
		if now := time.Now(); now.Sub(r.extended) >= live/8 {
			r.extended = now
			r.c.nc.SetReadDeadline(now.Add(live))
		}
	}
	return n, err
}

// explain names a read deadline that passed for what it means.
func (c *conn) explain(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("nothing received for %v while requests waited for answers", c.p.e.opts.Liveness)
	}
	return err
}

// idle reports whether nothing waits for an answer, and clears the read deadline if so.
func (c *conn) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) > 0 {
		return false
	}
	c.nc.SetReadDeadline(time.Time{})
	return true
}

// handle processes one answer; an error means the stream is unusable.
func (c *conn) handle(br *bufio.Reader, h respHeader) error {
	if h.op == opKeepalive {
		if h.id != 0 || h.length != 0 {
			return fmt.Errorf("keepalive with id %d and %d bytes of payload", h.id, h.length)
		}
		return nil // its arrival was the point
	}
	if h.length > maxChunk {
		return fmt.Errorf("answer of %d bytes, at most %d", h.length, maxChunk)
	}
	c.mu.Lock()
	r := c.pending[h.id]
	if r != nil {
		delete(c.pending, h.id)
	}
	if r == nil {
		c.mu.Unlock()
		_, err := io.CopyN(io.Discard, br, int64(h.length)) // an abandoned request's answer
		return err
	}
	// An answer that breaks the stream fails its request here: it left the pending set above, where failing the
	// peer (what the receive loop does next) would not find it, and it would wait for its transfer's deadline.
	broken := func(err error) error {
		c.mu.Lock()
		f := r.settle(c.p.lost(err))
		c.mu.Unlock()
		run(f)
		return err
	}
	if r.op != h.op {
		c.mu.Unlock()
		return broken(fmt.Errorf("answer op %d for request op %d", h.op, r.op))
	}
	if h.status != statusOK {
		c.mu.Unlock()
		text := make([]byte, min(h.length, maxErrText))
		if _, err := io.ReadFull(br, text); err != nil {
			return broken(err)
		}
		if _, err := io.CopyN(io.Discard, br, int64(h.length)-int64(len(text))); err != nil {
			return broken(err)
		}
		c.mu.Lock()
		f := r.settle(statusError(h.status, string(text)))
		c.mu.Unlock()
		run(f)
		return nil
	}
	if r.op == opRead || r.op == opReadV {
		if want := r.length(); h.length != want {
			c.mu.Unlock()
			return broken(fmt.Errorf("read answer of %d bytes for a %d-byte request", h.length, want))
		}
		r.holds++
		c.mu.Unlock()
		var err error
		switch {
		case r.op == opRead:
			_, err = io.ReadFull(br, r.buf)
		case r.packed != nil:
			_, err = io.ReadFull(br, r.packed)
		default:
			for _, p := range r.parts {
				if _, err = io.ReadFull(br, r.hostPart(p)); err != nil {
					break
				}
			}
		}
		c.mu.Lock()
		r.holds--
		if err != nil {
			c.mu.Unlock()
			c.p.kill(c.explain(err))
			c.mu.Lock()
			f := r.settle(c.p.deadErr)
			c.mu.Unlock()
			run(f)
			return err
		}
		c.p.e.stats.received.Add(h.length)
		f := r.settle(nil)
		c.mu.Unlock()
		run(f)
		return nil
	}
	if h.length != 0 {
		c.mu.Unlock()
		return broken(fmt.Errorf("acknowledgement with %d bytes of payload", h.length))
	}
	f := r.settle(nil)
	c.mu.Unlock()
	run(f)
	return nil
}
