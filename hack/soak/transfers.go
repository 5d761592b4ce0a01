// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// nodeClient is this program's one client of a node's agent, shared by every worker that starts transfers
// there or owns memory there. Recover runs once per lost session, however many workers notice.
type nodeClient struct {
	name  string
	sock  string
	c     *client.Client
	mu    sync.Mutex
	epoch atomic.Uint64
	// recovered counts successful Recover calls, retries the failed ones (lastErr says why).
	recovered atomic.Int64
	retries   atomic.Int64
	lastErr   atomic.Value
}

// recover re-registers the client's regions after its agent restarted, unless another worker already did so
// since this one read epoch seen.
func (n *nodeClient) recover(ctx context.Context, seen uint64, limit time.Duration) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.epoch.Load() != seen {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		err := n.c.Recover(ctx)
		if err == nil {
			n.epoch.Add(1)
			n.recovered.Add(1)
			return nil
		}
		// Recover waits for the agent to accept connections, but a connection that breaks under its calls (the
		// agent stopped again, or was still going down) fails it: try again until the deadline.
		n.retries.Add(1)
		n.lastErr.Store(err.Error())
		sleep(ctx, 200*time.Millisecond)
		if ctx.Err() != nil {
			return fmt.Errorf("recovering the client of %s's agent: not within %s: %w", n.name, limit, err)
		}
	}
}

// worker moves bytes between its local region (on home) and its target region (on peer, or another region
// on home when peer is nil), one transfer at a time.
type worker struct {
	name   string
	home   *nodeClient
	peer   *nodeClient
	local  *client.Region
	lmem   *client.SharedMemory
	target *client.Region
	tmem   *client.SharedMemory
	remote client.Remote
	rng    *rand.Rand
	// inflight is the start (Unix ns) of the transfer in flight, 0 between transfers; the watchdog reads it.
	inflight atomic.Int64
	hung     atomic.Bool
}

// outcome is how one transfer ended.
type outcome struct {
	start, end time.Time
	bytes      uint64
	err        error
	corrupt    bool
}

// transferOnce runs one transfer of random direction, size and offsets and checks the destination's bytes.
func (w *worker) transferOnce(ctx context.Context, o *options) outcome {
	size := uint64(len(w.lmem.Bytes))
	// Log-uniform lengths from minSize to the region size: many small transfers, some large ones.
	lo, hi := math.Log(float64(o.minSize)), math.Log(float64(size))
	length := min(size, uint64(math.Exp(lo+w.rng.Float64()*(hi-lo))))
	loff := w.rng.Uint64N(size - length + 1)
	toff := w.rng.Uint64N(size - length + 1)
	op := client.Write
	src, dst := w.lmem.Bytes[loff:loff+length], w.tmem.Bytes[toff:toff+length]
	if w.rng.IntN(2) == 1 {
		op = client.Read
		src, dst = dst, src
	}
	fill(w.rng, src)
	want := sha256.Sum256(src)
	ctx, cancel := context.WithTimeout(ctx, o.transferDeadline)
	defer cancel()
	out := outcome{start: time.Now(), bytes: length}
	w.inflight.Store(out.start.UnixNano())
	_, err := w.home.c.Do(ctx, op, []client.Item{{Local: w.local, LocalOffset: loff, Remote: w.remote,
		RemoteOffset: toff, Length: length, Tag: w.name}}, client.TransferOptions{Timeout: o.agentTimeout})
	w.inflight.Store(0)
	out.end = time.Now()
	if err != nil {
		out.err = err
		return out
	}
	out.corrupt = sha256.Sum256(dst) != want
	return out
}

// fill writes random bytes into b.
func fill(rng *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		b[i], b[i+1], b[i+2], b[i+3], b[i+4], b[i+5], b[i+6], b[i+7] =
			byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
	for ; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
}

// run transfers until stop closes; the transfer in flight then finishes (within its deadline).
func (w *worker) run(ctx context.Context, stop <-chan struct{}, o *options, st *stats, ch *churn) {
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		seen := w.home.epoch.Load()
		st.submit()
		out := w.transferOnce(ctx, o)
		st.record(w.name, out, ch)
		switch {
		case out.err == nil:
			sleep(ctx, o.pause)
		case errors.Is(out.err, client.ErrSessionLost):
			if err := w.home.recover(ctx, seen, o.recoverDeadline); err != nil {
				st.recoverFailed(err)
				sleep(ctx, time.Second)
			}
		default:
			// The peer may be down or its client not yet recovered: back off a little, then try again.
			sleep(ctx, 200*time.Millisecond)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// stats are the run's transfer counts. Lost is submitted minus completed minus failed.
type stats struct {
	mu             sync.Mutex
	submitted      int64
	completed      int64
	failed         int64
	failedInChurn  int64
	corrupt        int64
	overDeadline   int64
	overDeadlineEx []string
	// deadline is the shortest of a transfer's deadlines: a call that lasts this long ran into one.
	deadline       time.Duration
	bytes          uint64
	maxLatency     time.Duration
	classes        map[string]int64
	examples       map[string]string
	outsideChurn   []string
	recoverErrors  []string
	perWorkerCount map[string]int64
}

func newStats(deadline time.Duration) *stats {
	return &stats{deadline: deadline, classes: map[string]int64{}, examples: map[string]string{}, perWorkerCount: map[string]int64{}}
}

func (s *stats) submit() {
	s.mu.Lock()
	s.submitted++
	s.mu.Unlock()
}

func (s *stats) recoverFailed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recoverErrors) < 10 {
		s.recoverErrors = append(s.recoverErrors, fmt.Sprintf("%s: %v", time.Now().Format(time.TimeOnly), err))
	}
}

// record counts one outcome. A failure counts as during churn when the transfer's span meets a churn window.
func (s *stats) record(worker string, out outcome, ch *churn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxLatency = max(s.maxLatency, out.end.Sub(out.start))
	if out.err == nil {
		s.completed++
		s.perWorkerCount[worker]++
		s.bytes += out.bytes
		if out.corrupt {
			s.corrupt++
		}
		return
	}
	s.failed++
	class := classify(out.err)
	s.classes[class]++
	if _, ok := s.examples[class]; !ok {
		s.examples[class] = fmt.Sprintf("%s: %v", worker, out.err)
	}
	// A failure is judged by how long it took, not by its code: an agent that stops mid-call answers
	// DeadlineExceeded for a call that was merely cut short.
	if class == "deadline" || out.end.Sub(out.start) >= s.deadline {
		s.overDeadline++
		if len(s.overDeadlineEx) < 5 {
			s.overDeadlineEx = append(s.overDeadlineEx, fmt.Sprintf("%s after %s: %v", worker, out.end.Sub(out.start).Round(time.Millisecond), out.err))
		}
	}
	if ch.during(out.start, out.end) {
		s.failedInChurn++
	} else if len(s.outsideChurn) < 10 {
		s.outsideChurn = append(s.outsideChurn, fmt.Sprintf("%s %s: %v", out.end.Format(time.TimeOnly), worker, out.err))
	}
}

// classify names the kind of a failure: the session was lost, the agent refused or failed it (gRPC code), the
// transfer ran and failed (its final state), or its deadline passed (the client's context or the agent's
// timeout).
func classify(err error) string {
	var te *client.TransferError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.As(err, &te) && te.Status != nil && te.Status.State == agentv1.TransferState_TRANSFER_STATE_DEADLINE_EXCEEDED:
		return "deadline"
	case errors.Is(err, client.ErrSessionLost):
		return "session-lost"
	case errors.As(err, &te) && te.Status != nil:
		return "transfer-" + strings.ToLower(strings.TrimPrefix(te.Status.State.String(), "TRANSFER_STATE_"))
	}
	return "grpc-" + client.Code(err).String()
}

// classSummaryLocked lists failure classes by count; s.mu is held.
func (s *stats) classSummaryLocked() string {
	var keys []string
	for k := range s.classes {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return s.classes[keys[i]] > s.classes[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, s.classes[k]))
	}
	return strings.Join(parts, " ")
}

// setupWorkers dials each node's agent and registers each worker's memory: one worker within every node (so
// every client notices a lost session and recovers, which re-publishes its segments) and one across each
// ordered pair of neighbouring nodes.
func setupWorkers(ctx context.Context, o *options) (map[string]*nodeClient, []*worker, func(), error) {
	clients := map[string]*nodeClient{}
	var mems []*client.SharedMemory
	cleanup := func() {
		for _, n := range clients {
			_ = n.c.Close()
		}
		for _, m := range mems {
			_ = m.Close()
		}
	}
	for _, n := range o.nodes {
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		sock := o.socket(n)
		c, err := client.Dial(dctx, sock, client.WithName("soak"))
		cancel()
		if err != nil {
			cleanup()
			return nil, nil, nil, fmt.Errorf("dialing %s's agent: %w", n, err)
		}
		clients[n] = &nodeClient{name: n, sock: sock, c: c}
	}
	register := func(nc *nodeClient, name string, seg bool) (*client.Region, *client.SharedMemory, error) {
		m, err := client.NewSharedMemory(name, o.regionSize)
		if err != nil {
			return nil, nil, err
		}
		mems = append(mems, m)
		var opts []client.RegionOption
		if seg {
			opts = append(opts, client.Segment(name))
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		r, err := nc.c.RegisterHost(rctx, m.File, 0, m.Size(), opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("registering %s on %s: %w", name, nc.name, err)
		}
		return r, m, nil
	}
	var workers []*worker
	add := func(home, peer string) error {
		w := &worker{home: clients[home], rng: rand.New(rand.NewPCG(uint64(len(workers)), uint64(time.Now().UnixNano())))}
		if peer == "" {
			w.name = "local-" + home
		} else {
			w.name = home + "→" + peer
			w.peer = clients[peer]
		}
		seg := fmt.Sprintf("soak-%d", len(workers))
		var err error
		if w.local, w.lmem, err = register(w.home, seg+"-local", false); err != nil {
			return err
		}
		if peer == "" {
			if w.target, w.tmem, err = register(w.home, seg, false); err != nil {
				return err
			}
			w.remote = client.ToRegion(w.target)
		} else {
			if w.target, w.tmem, err = register(w.peer, seg, true); err != nil {
				return err
			}
			w.remote = client.ToSegment(peer, seg)
		}
		workers = append(workers, w)
		return nil
	}
	for i, n := range o.nodes {
		if err := add(n, ""); err != nil {
			cleanup()
			return nil, nil, nil, err
		}
		if len(o.nodes) > 1 {
			if err := add(n, o.nodes[(i+1)%len(o.nodes)]); err != nil {
				cleanup()
				return nil, nil, nil, err
			}
		}
	}
	return clients, workers, cleanup, nil
}
