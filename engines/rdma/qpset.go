// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package rdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/verbs"
)

// ErrConnectRace: both nodes dialed each other at once; the node whose name
// sorts first keeps its own dial and refuses the other's. The agent channel
// must carry it back as this error (errors.Is) for the loser to wait for the
// winner's connection instead of failing.
var ErrConnectRace = errors.New("queue-pair set being connected from this side")

type setKey struct{ node, local, remote string }

// qpSet is the queue pairs to one peer between two NIC ports.
type qpSet struct {
	key   setKey
	ready chan struct{} // closed once qps or err is set
	qps   []*qpConn
	err   error
	// byAccept marks a set the peer dialed; a dial of ours that lost the race
	// finds it here.
	byAccept bool
	// connected is when the set was finished without error (guarded by the engine's mu).
	connected time.Time
	broken    atomic.Bool
	next      atomic.Uint64
}

func newSet(k setKey) *qpSet { return &qpSet{key: k, ready: make(chan struct{})} }

// pick returns the queue pairs round-robin.
func (s *qpSet) pick() *qpConn { return s.qps[int(s.next.Add(1))%len(s.qps)] }

// qpConn is one connected queue pair, its in-flight budget and its waiters.
type qpConn struct {
	qp    QP
	info  verbs.ConnInfo
	slots chan struct{}
	set   *qpSet

	mu      sync.Mutex
	waiting map[uint64]chan<- verbs.Completion
	failed  error // first error completion: the queue pair is in ERR
	closed  bool
	stop    chan struct{}
	done    chan struct{}
}

func newConn(qp QP, depth int, set *qpSet) *qpConn {
	c := &qpConn{qp: qp, info: qp.Info(), slots: make(chan struct{}, depth), set: set,
		waiting: map[uint64]chan<- verbs.Completion{}, stop: make(chan struct{}), done: make(chan struct{})}
	go c.poll()
	return c
}

// poll reaps completions and hands each to the plan waiting for it; it spins
// while work is outstanding and backs off when the queue pair is idle.
func (c *qpConn) poll() {
	defer close(c.done)
	buf := make([]verbs.Completion, 64)
	idle := time.Duration(0)
	for {
		select {
		case <-c.stop:
			return
		default:
		}
		n, err := c.qp.Poll(buf)
		if err != nil {
			c.failAll(fmt.Errorf("polling the completion queue: %w", err))
			return
		}
		for _, wc := range buf[:n] {
			c.mu.Lock()
			ch, ok := c.waiting[wc.ID]
			delete(c.waiting, wc.ID)
			if wc.Status != verbs.StatusSuccess && wc.Status != verbs.StatusWRFlushErr && c.failed == nil {
				c.failed = statusError(c.set.key.node, c.info.QPN, wc)
				c.set.broken.Store(true)
			}
			c.mu.Unlock()
			if ok { // not already failed by failAll
				<-c.slots
				ch <- wc
			}
		}
		if n > 0 {
			idle = 0
			continue
		}
		c.mu.Lock()
		busy := len(c.waiting) > 0
		c.mu.Unlock()
		switch {
		case busy && idle < 50*time.Microsecond:
			runtime.Gosched()
			idle += time.Microsecond
		default:
			idle = min(max(idle*2, 20*time.Microsecond), time.Millisecond)
			select {
			case <-c.stop:
				return
			case <-time.After(idle):
			}
		}
	}
}

// failAll completes every waiter with a flush: the queue pair can no longer report.
func (c *qpConn) failAll(err error) {
	c.mu.Lock()
	if c.failed == nil {
		c.failed = err
	}
	ws := c.waiting
	c.waiting = map[uint64]chan<- verbs.Completion{}
	c.mu.Unlock()
	c.set.broken.Store(true)
	for id, ch := range ws {
		<-c.slots
		ch <- verbs.Completion{ID: id, Status: verbs.StatusWRFlushErr}
	}
}

// post posts one work request whose completion goes to ch; it waits for room
// in the queue pair's budget until ctx ends.
func (c *qpConn) post(ctx context.Context, wr verbs.WorkRequest, ch chan<- verbs.Completion) error {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	c.mu.Lock()
	if c.failed != nil || c.closed {
		err := c.failed
		c.mu.Unlock()
		<-c.slots
		if err == nil {
			err = errors.New("queue pair closed")
		}
		return err
	}
	c.waiting[wr.ID] = ch
	c.mu.Unlock()
	if err := c.qp.Post([]verbs.WorkRequest{wr}); err != nil {
		c.mu.Lock()
		delete(c.waiting, wr.ID)
		c.mu.Unlock()
		<-c.slots
		c.set.broken.Store(true)
		return fmt.Errorf("posting to queue pair %d (%s): %w", c.info.QPN, c.qp.State(), err)
	}
	return nil
}

// close moves the queue pair to ERR (its outstanding work is flushed and
// reported), waits for the poller to hand those out, and frees it.
func (c *qpConn) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	err := c.qp.Close()
	// Give the poller a moment to reap the flushes, then fail whatever is left.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		n := len(c.waiting)
		c.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(c.stop)
	<-c.done
	c.failAll(errors.New("queue pair closed"))
	return errors.Join(err, c.qp.Destroy())
}

// getSet returns the connected set for k, dialing the peer when there is none
// (or the last one broke).
func (e *Engine) getSet(ctx context.Context, k setKey) (*qpSet, error) {
	for attempt := 0; ; attempt++ {
		e.mu.Lock()
		s, ok := e.sets[k]
		if ok && s.broken.Load() {
			delete(e.sets, k)
			go e.retire(s)
			ok = false
		}
		if !ok {
			s = newSet(k)
			e.sets[k] = s
			e.mu.Unlock()
			e.dial(ctx, s)
		} else {
			e.mu.Unlock()
		}
		select {
		case <-s.ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to %s: %w", k.node, ctx.Err())
		}
		if s.err == nil {
			return s, nil
		}
		if !errors.Is(s.err, ErrConnectRace) || attempt > 2 {
			return nil, s.err
		}
	}
}

// dial creates the queue pairs, sends their info to the peer and connects
// them to the peer's answer.
func (e *Engine) dial(ctx context.Context, s *qpSet) {
	conns, infos, err := e.makeQPs(s.key.local, s, e.opts.QPsPerPeer)
	if err == nil {
		var remote []verbs.ConnInfo
		remote, err = e.opts.Exchanger.ExchangeQPs(ctx, ExchangeRequest{From: e.opts.Node, To: s.key.node,
			FromNIC: s.key.local, ToNIC: s.key.remote, QPs: infos})
		if err == nil && len(remote) != len(conns) {
			err = fmt.Errorf("peer answered with %d queue pairs for %d", len(remote), len(conns))
		}
		for i := 0; err == nil && i < len(conns); i++ {
			err = conns[i].qp.Connect(remote[i])
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	select {
	case <-s.ready:
		// The peer's dial won the race and AcceptQPs completed the set.
		for _, c := range conns {
			go c.close()
		}
		return
	default:
	}
	if err != nil {
		for _, c := range conns {
			go c.close()
		}
		if s.byAccept {
			// The peer's dial is being accepted into this very set (our dial lost the race, as the peer said):
			// that AcceptQPs finishes it. Finishing it here would make the accept refuse the peer, and each
			// side would then wait for the other's connection until ConnectTimeout.
			return
		}
		if e.sets[s.key] == s {
			delete(e.sets, s.key)
		}
		if errors.Is(err, ErrConnectRace) {
			// Our dial was refused because the peer is dialing us: wait for its
			// AcceptQPs to land in a fresh set under the same key.
			ns := newSet(s.key)
			e.sets[s.key] = ns
			go func() {
				select {
				case <-ns.ready:
				case <-time.After(e.opts.ConnectTimeout):
					e.mu.Lock()
					if e.sets[ns.key] == ns {
						delete(e.sets, ns.key)
					}
					e.mu.Unlock()
					ns.finish(nil, fmt.Errorf("connecting to %s: the peer's own connection did not arrive within %v", ns.key.node, e.opts.ConnectTimeout))
				}
			}()
			s.finish(nil, ErrConnectRace)
			return
		}
		s.finish(nil, fmt.Errorf("connecting queue pairs to %s (%s -> %s): %w", s.key.node, s.key.local, s.key.remote, err))
		return
	}
	s.finish(conns, nil)
}

func (s *qpSet) finish(conns []*qpConn, err error) {
	select {
	case <-s.ready:
		return
	default:
	}
	s.qps, s.err = conns, err
	if err == nil {
		s.connected = time.Now()
	}
	close(s.ready)
}

// makeQPs creates n queue pairs on nic for set s.
func (e *Engine) makeQPs(nic string, s *qpSet, n int) ([]*qpConn, []verbs.ConnInfo, error) {
	dev, err := e.device(nic)
	if err != nil {
		return nil, nil, err
	}
	var conns []*qpConn
	var infos []verbs.ConnInfo
	for i := 0; i < n; i++ {
		qp, err := dev.CreateQP(e.opts.Depth)
		if err != nil {
			for _, c := range conns {
				c.close()
			}
			return nil, nil, fmt.Errorf("creating a queue pair on %s: %w", nic, err)
		}
		c := newConn(qp, e.opts.Depth, s)
		conns = append(conns, c)
		infos = append(infos, c.info)
	}
	return conns, infos, nil
}

// AcceptQPs is the receiving side of Exchanger: the agent calls it when a
// peer's rdma engine asks to connect a queue-pair set.
func (e *Engine) AcceptQPs(ctx context.Context, req ExchangeRequest) ([]verbs.ConnInfo, error) {
	if req.To != e.opts.Node {
		return nil, fmt.Errorf("rdma: %w: connection request for node %q reached %q", engines.ErrInvalid, req.To, e.opts.Node)
	}
	if len(req.QPs) == 0 || len(req.QPs) > 64 {
		return nil, fmt.Errorf("rdma: %w: %d queue pairs requested", engines.ErrInvalid, len(req.QPs))
	}
	if e.unavailable != "" {
		return nil, fmt.Errorf("rdma: refusing queue pairs from %s: unavailable on this node: %s", req.From, e.unavailable)
	}
	if _, ok := usablePort(&e.opts.NICs, req.ToNIC); !ok || req.ToNIC == "" {
		return nil, fmt.Errorf("rdma: %w: queue pairs from %s for device %q, which has no usable RDMA port on %s",
			engines.ErrInvalid, req.From, req.ToNIC, e.opts.Node)
	}
	k := setKey{node: req.From, local: req.ToNIC, remote: req.FromNIC}
	e.mu.Lock()
	old, ok := e.sets[k]
	if !ok && e.setsOfLocked(req.From) >= maxSetsPerPeer {
		e.mu.Unlock()
		return nil, fmt.Errorf("rdma: %w: %s already has %d queue-pair sets with %s (one per NIC pair at most)",
			engines.ErrInvalid, req.From, maxSetsPerPeer, e.opts.Node)
	}
	if ok {
		select {
		case <-old.ready:
			if lateLoser(old, e.opts.Node, req.From, e.opts.ConnectTimeout) {
				e.mu.Unlock()
				return nil, ErrConnectRace
			}
			// Established (or failed) before: the peer made a new set, so its end
			// of the old one is gone. Replace it.
			delete(e.sets, k)
			go e.retire(old)
			ok = false
		default:
			if !old.byAccept && e.opts.Node < req.From {
				e.mu.Unlock()
				return nil, ErrConnectRace
			}
			if old.byAccept {
				// Another acceptance of this set is under way: only one can be used, so a second one (a
				// retry, or a hostile peer's flood) creates no queue pairs.
				e.mu.Unlock()
				return nil, ErrConnectRace
			}
		}
	}
	var s *qpSet
	if ok {
		s = old // our dial lost the race: its set is completed by this accept
	} else {
		s = newSet(k)
		e.sets[k] = s
	}
	s.byAccept = true
	e.mu.Unlock()

	// As many queue pairs as the peer offered: its QPsPerPeer may differ from ours, and the request comes
	// over the wire.
	conns, infos, err := e.makeQPs(k.local, s, len(req.QPs))
	for i := 0; err == nil && i < len(conns); i++ {
		err = conns[i].qp.Connect(req.QPs[i])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		for _, c := range conns {
			go c.close()
		}
		if e.sets[k] == s {
			delete(e.sets, k)
		}
		s.finish(nil, err)
		return nil, fmt.Errorf("rdma: accepting queue pairs from %s: %w", req.From, err)
	}
	select {
	case <-s.ready:
		// Another accept for the same set finished first; these queue pairs would be used by nobody.
		for _, c := range conns {
			go c.close()
		}
		return nil, ErrConnectRace
	default:
	}
	s.finish(conns, nil)
	return infos, nil
}

// lateLoser says whether a peer's dial that finds set established is the losing half of a simultaneous dial
// rather than a new set: we win ties (our name is lower), our own dial made the set, and it connected within the
// time a dial may take, so the peer's dial left before the peer accepted ours. Replacing the set then (as a
// peer that lost its end is answered) would connect a set the peer discards, and leave ours to queue pairs it
// retires: the peer keeps the set it accepted once we refuse. A peer that restarted within that time is refused
// as well; its dial waits for ours, which does not come, and its next one, later, is answered.
func lateLoser(set *qpSet, node, from string, within time.Duration) bool {
	return set.err == nil && !set.byAccept && !set.broken.Load() && node < from && time.Since(set.connected) < within
}

// maxSetsPerPeer bounds the queue-pair sets one peer may hold here: one per (local NIC, remote NIC) pair of
// 8-NIC nodes. Each set pins queue pairs and memory, and the peer names its own NIC.
const maxSetsPerPeer = 64

// setsOfLocked counts node's queue-pair sets; e.mu must be held.
func (e *Engine) setsOfLocked(node string) int {
	n := 0
	for k := range e.sets {
		if k.node == node {
			n++
		}
	}
	return n
}

// retire closes a set's queue pairs once it is no longer used for new work.
func (e *Engine) retire(s *qpSet) {
	<-s.ready
	for _, c := range s.qps {
		c.close()
	}
}
