// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
)

// Stager moves bytes between this node's GPU memory and pinned host memory. The agent wires one over its GPU
// copy backend; tests use one over host memory. The engine itself never loads a GPU runtime.
type Stager interface {
	// Stage prepares a registered GPU region of this node for staging, or says why it cannot be staged.
	Stage(d engines.MemoryDesc) (StagedRegion, error)
	// AllocPinned returns n bytes of host memory the GPU's copies reach directly, and what frees it.
	AllocPinned(n int) (buf []byte, free func() error, err error)
}

// StagedRegion is one GPU region a Stager reaches. Each call queues its segments as one submission (one
// scatter-kernel launch or copy-engine copy), never one copy per segment.
type StagedRegion interface {
	// ToHost queues copies from the region (SrcOffset) into buf (DstOffset).
	ToHost(buf []byte, segs []engines.Segment) (StageWait, error)
	// FromHost queues copies from buf (SrcOffset) into the region (DstOffset).
	FromHost(buf []byte, segs []engines.Segment) (StageWait, error)
	// Release ends staging of the region; nothing of it is queued any more.
	Release() error
}

// StagedBlocks is a StagedRegion that also copies whole blocks by index: one submission for a chunk of a block
// list, with no segment per block (for thousands of KV blocks those cost more host time than the copy). Block b
// is [b*bs, (b+1)*bs) of the region; the chunk's blocks are packed in order in buf.
type StagedBlocks interface {
	// BlocksToHost queues copies of blocks ids of the region into buf.
	BlocksToHost(buf []byte, bs uint64, ids []uint32) (StageWait, error)
	// BlocksFromHost queues copies from buf into blocks ids of the region.
	BlocksFromHost(buf []byte, bs uint64, ids []uint32) (StageWait, error)
}

// StageWait is a queued copy. One that also has a Done() bool method, saying without waiting whether the copy
// finished, lets a staged write send a gathered chunk as soon as its copy ends.
type StageWait interface {
	// Wait returns once the copy finished (nil) or failed, or ctx ended (the copy may still run).
	Wait(ctx context.Context) error
}

const (
	// stageSlot is the unit of staging memory and the largest request that touches GPU memory: one staged
	// chunk, copied with one submission. A fixed size, so both sides agree without negotiating.
	stageSlot = 4 << 20
	// defaultStagingBytes is the pinned host memory per peer and per side (sending and serving).
	defaultStagingBytes = 64 << 20
	// stageIdle: staging slots of a peer unused this long go back to the stager.
	stageIdle = 30 * time.Second
	// gathersAhead bounds the gathers a staged write queues on the GPU before waiting for the oldest.
	gathersAhead = 4
	// stageDrain bounds how long a queued GPU copy is waited for after its transfer stopped: a launched copy
	// cannot be recalled, and its slot must not be reused (nor its transfer end) while it may still run.
	stageDrain = 30 * time.Second
	// stageChunkMin and stageChunkAlign bound how finely a staged plan is cut (stagedChunkBytes).
	stageChunkMin   = 512 << 10
	stageChunkAlign = 64 << 10
	// defaultConnsPerPeer is Options.ConnsPerPeer's default.
	defaultConnsPerPeer = 4
)

// stagedChunkBytes is the chunk size of a staged plan of total bytes over conns connections: at most a slot,
// and small enough for about two chunks per connection, so all of them start at once and one chunk's GPU copy
// overlaps the others' time on the wire; at least stageChunkMin, so a chunk's fixed costs (a GPU submission on
// each side, a request and its answer) stay small beside its time on the wire. A block list (blocks) whose
// chunks would be half a slot or more is cut in whole slots instead: each of its chunks launches a kernel on
// both sides, and the 32-layer layout's 16 MiB per region pair took 124-146 ms in four 4 MiB chunks against 157
// ms in eight. Smaller block lists keep two chunks per connection: 15,360 × 720 B took 2.86 ms (median of 63
// writes) against 3.15 ms in one chunk per connection, whose chunks' gathers leave the connections idle longer.
func stagedChunkBytes(total uint64, conns int, blocks bool) int {
	per := total / uint64(2*max(conns, 1))
	if blocks && per >= stageSlot/2 {
		per = stageSlot
	}
	per = (per + stageChunkAlign - 1) &^ (stageChunkAlign - 1)
	return int(min(max(per, stageChunkMin), stageSlot))
}

// stagedEntry is a local GPU region's staging state: the stager's handle, or why it has none.
type stagedEntry struct {
	r   StagedRegion
	why string
}

// stagePool is the bounded staging memory towards one peer node, on one side (this node's transfers, or this
// node serving the peer's requests). Slots are allocated on first use; slots idle for a while go back to the
// stager (reap), so pinned memory follows the peers that are active, not every peer ever met.
type stagePool struct {
	stager Stager
	max    int

	mu      sync.Mutex
	idle    [][]byte
	frees   map[*byte]func() error // every allocated slot's release, by its first byte
	wake    chan struct{}          // closed (and replaced) when a slot is returned or released
	lastUse time.Time
}

func newStagePool(s Stager, slots int) *stagePool {
	return &stagePool{stager: s, max: slots, frees: map[*byte]func() error{}, wake: make(chan struct{})}
}

// signal wakes waiters; sp.mu is held.
func (sp *stagePool) signal() {
	close(sp.wake)
	sp.wake = make(chan struct{})
}

// get returns an idle slot, allocating one while below the bound, else waits for one.
func (sp *stagePool) get(ctx context.Context) ([]byte, error) {
	for {
		b, wake, err := sp.tryGet()
		if b != nil || err != nil {
			return b, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for staging memory: %w", ctx.Err())
		}
	}
}

// tryGet returns an idle slot, or a new one while below the bound; else no slot and a channel closed when one
// may have become free.
func (sp *stagePool) tryGet() ([]byte, <-chan struct{}, error) {
	sp.mu.Lock()
	sp.lastUse = time.Now()
	if n := len(sp.idle); n > 0 {
		b := sp.idle[n-1]
		sp.idle = sp.idle[:n-1]
		sp.mu.Unlock()
		return b, nil, nil
	}
	if len(sp.frees) >= sp.max {
		wake := sp.wake
		sp.mu.Unlock()
		return nil, wake, nil
	}
	// Reserve the place while allocating outside the lock (pinning takes a while).
	reserved := new(byte)
	sp.frees[reserved] = nil
	sp.mu.Unlock()
	b, free, err := sp.stager.AllocPinned(stageSlot)
	if err == nil && len(b) < stageSlot {
		_ = free()
		err = fmt.Errorf("stager returned %d bytes of staging memory, asked for %d", len(b), stageSlot)
	}
	sp.mu.Lock()
	delete(sp.frees, reserved)
	if err == nil {
		b = b[:stageSlot]
		sp.frees[&b[0]] = free
	}
	sp.signal()
	sp.mu.Unlock()
	if err != nil {
		return nil, nil, fmt.Errorf("allocating %d bytes of pinned staging memory: %w", stageSlot, err)
	}
	return b, nil, nil
}

// put returns a slot.
func (sp *stagePool) put(b []byte) {
	sp.mu.Lock()
	sp.idle = append(sp.idle, b)
	sp.signal()
	sp.mu.Unlock()
}

// reap releases the idle slots of a pool nobody asked for a slot for idleFor; slots in use stay.
func (sp *stagePool) reap(idleFor time.Duration) error {
	sp.mu.Lock()
	if len(sp.idle) == 0 || time.Since(sp.lastUse) < idleFor {
		sp.mu.Unlock()
		return nil
	}
	var frees []func() error
	for _, b := range sp.idle {
		frees = append(frees, sp.frees[&b[0]])
		delete(sp.frees, &b[0])
	}
	sp.idle = nil
	sp.signal()
	sp.mu.Unlock()
	var errs []error
	for _, f := range frees {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// close releases every slot; nothing may use them any more.
func (sp *stagePool) close() error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var errs []error
	for k, f := range sp.frees {
		if f != nil {
			errs = append(errs, f())
		}
		delete(sp.frees, k)
	}
	sp.idle = nil
	return errors.Join(errs...)
}

// reapStaging releases, every idleFor/2, the staging slots of pools idle for idleFor, until done closes.
func (e *Engine) reapStaging(idleFor time.Duration, done <-chan struct{}) {
	defer e.wg.Done()
	t := time.NewTicker(idleFor / 2)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		e.mu.Lock()
		pools := make([]*stagePool, 0, len(e.stageOut)+len(e.stageIn))
		for _, m := range []map[string]*stagePool{e.stageOut, e.stageIn} {
			for _, sp := range m {
				pools = append(pools, sp)
			}
		}
		e.mu.Unlock()
		for _, sp := range pools {
			if err := sp.reap(idleFor); err != nil {
				e.logf("tcp engine: releasing idle staging memory: %v", err)
			}
		}
	}
}

// pool returns the staging pool towards node on one side, creating it.
func (e *Engine) pool(serving bool, node string) *stagePool {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := e.stageOut
	if serving {
		m = e.stageIn
	}
	sp := m[node]
	if sp == nil {
		sp = newStagePool(e.opts.Stager, int(e.opts.StagingBytes/stageSlot))
		m[node] = sp
	}
	return sp
}

// stagedRegion returns the staging handle of a local GPU region (nil when it has none) and why not.
func (e *Engine) stagedRegion(id engines.MemoryID) (StagedRegion, string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.staged[id]
	return s.r, s.why, ok
}

// waitStage waits for a queued GPU copy to finish, whatever happened to the transfer: a copy cannot be
// recalled, so nothing (its slot, the transfer's end) may move on while it could run. drained is false when it
// did not finish within stageDrain; its slot must then never be reused.
func waitStage(w StageWait) (err error, drained bool) {
	ctx, cancel := context.WithTimeout(context.Background(), stageDrain)
	defer cancel()
	if err := w.Wait(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("GPU staging copy did not finish within %v", stageDrain), false
		}
		return fmt.Errorf("GPU staging copy: %w", err), true
	}
	return nil, true
}

// stageFinished reports, without waiting, whether a queued staging copy finished; false when the stager's copies
// cannot say (they are then waited for in order).
func stageFinished(w StageWait) bool {
	d, ok := w.(interface{ Done() bool })
	return ok && d.Done()
}

// stageSegs lists a chunk's parts as segments between the local region and a slot packed in part order:
// toHost from the region into the slot, else from the slot into the region.
func stageSegs(ch chunk, toHost bool) []engines.Segment {
	parts := ch.parts
	if parts == nil {
		parts = []part{{localOff: ch.localOff, remoteOff: ch.remoteOff, n: ch.n}}
	}
	segs := make([]engines.Segment, 0, len(parts))
	var off uint64
	for _, p := range parts {
		s := engines.Segment{SrcOffset: p.localOff, DstOffset: off, Size: p.n}
		if !toHost {
			s.SrcOffset, s.DstOffset = off, p.localOff
		}
		segs = append(segs, s)
		off += p.n
	}
	return segs
}

// stageChunk queues a chunk's copy between the local region and slot (packed in part order), toHost from the
// region: by block index when the chunk is whole blocks of a block list and the region stages blocks, else as
// segments.
func stageChunk(sr StagedRegion, slot []byte, ch chunk, toHost bool) (StageWait, error) {
	if sb, ok := sr.(StagedBlocks); ok && ch.ids != nil {
		if toHost {
			return sb.BlocksToHost(slot, ch.blockBytes, ch.ids)
		}
		return sb.BlocksFromHost(slot, ch.blockBytes, ch.ids)
	}
	if toHost {
		return sr.ToHost(slot, stageSegs(ch, true))
	}
	return sr.FromHost(slot, stageSegs(ch, false))
}

// servedBlocks returns the block size and block indexes of a staged request's parts when they are two or more
// whole blocks of one size (a block list's chunk), each within a region of size bytes; ok is false otherwise
// (the parts are then served as segments, and checked there).
func servedBlocks(parts []vecDesc, size uint64) (bs uint64, ids []uint32, ok bool) {
	if len(parts) < 2 || parts[0].n == 0 {
		return 0, nil, false
	}
	bs = uint64(parts[0].n)
	limit := min(size/bs, 1<<32) // block indexes below it lie within the region and fit 32 bits
	ids = make([]uint32, len(parts))
	for k, p := range parts {
		id := p.off / bs
		if uint64(p.n) != bs || id*bs != p.off || id >= limit {
			return 0, nil, false
		}
		ids[k] = uint32(id)
	}
	return bs, ids, true
}

// slotRequest builds a chunk's request whose payload (written or read) is the slot, packed in part order.
func slotRequest(op byte, mem engines.MemoryID, ch chunk, slot []byte) *request {
	r := &request{op: op, mem: mem, off: ch.remoteOff, buf: slot[:ch.n]}
	if ch.parts != nil {
		// The slot holds the parts back to back in part order: written and read as one buffer, described by the
		// plan's parts.
		r.op, r.off, r.buf, r.packed, r.parts = opWriteV, 0, nil, slot[:ch.n], ch.parts
		if op == opRead {
			r.op = opReadV
		}
	}
	return r
}

// runStaged moves a plan whose local side is GPU memory through the peer's staging slots.
//
// Writing, a producer gathers chunk after chunk into slots (one GPU submission each) while the lanes send the
// chunks already gathered, so the device-to-host copy of chunk i+1 overlaps the send of chunk i; a slot
// returns once its chunk is acknowledged. Reading, the lanes ask for chunks into slots, and a scatter worker
// copies every chunk that arrived into the region (one submission each) while the next ones arrive. Once the
// transfer stops (failure, cancellation, deadline), no copy into the region is queued any more, and the plan
// ends only after the copies already queued finished.
func (e *Engine) runStaged(ctx context.Context, w engines.Work, p *peer, op byte, local, remote *engines.MemoryDesc, early func(error)) error {
	sr, why, _ := e.stagedRegion(local.ID)
	if sr == nil {
		return fmt.Errorf("%w: %s is GPU memory this node does not stage: %s", engines.ErrInvalid, local.ID, why)
	}
	chunks := e.chunks(w.Plan, op == opRead, stagedChunkBytes(w.Plan.Bytes, len(p.conns), w.Plan.Blocks != nil), p.maxParts)
	pool := e.pool(false, remote.Node)
	if traced() {
		var parts uint64
		for _, ch := range chunks {
			parts += uint64(len(ch.parts))
		}
		mark("staged.start", uint64(len(chunks)), parts)
		defer mark("staged.end", uint64(len(chunks)), parts)
	}

	var run planRun
	record, result, track := run.record, run.err, run.track
	stopped := func() bool { return run.failed() || ctx.Err() != nil }
	outstanding := newCountdown()
	outstanding.Add(1) // this function's, until every goroutine is started
	finished := make(chan struct{})
	// putBack returns a slot unless a copy that did not drain may still touch it.
	putBack := func(slot []byte, drained bool) {
		if drained {
			pool.put(slot)
		}
	}
	lanes := min(len(p.conns), len(chunks))
	first := p.next.Add(uint64(lanes))
	connOf := func(k int) *conn { return p.conns[(first+uint64(k))%uint64(len(p.conns))] }

	// send issues r on c; it returns false when the lane must stop. r.done must release what the chunk holds.
	send := func(c *conn, r *request, n uint64, undo func()) bool {
		outstanding.Add(1)
		if err := c.send(ctx, r); err != nil {
			p.budget.Release(int64(n))
			undo()
			outstanding.Done()
			record(err)
			return false
		}
		if !track(r) {
			if op == opRead {
				c.cancel(r, ctx.Err())
			} // a written chunk completes with its answer, as the others do (see below)
			return false
		}
		return true
	}

	if op == opWrite {
		type gathered struct {
			ch   chunk
			slot []byte
		}
		ready := make(chan gathered, lanes)
		outstanding.Add(1)
		go func() { // the producer
			defer outstanding.Done()
			defer close(ready)
			gatherAhead(ctx, chunks, pool, sr, stopped, record, putBack, func(ch chunk, slot []byte) bool {
				select {
				case ready <- gathered{ch, slot}:
					return true
				case <-ctx.Done():
					pool.put(slot)
					record(ctx.Err())
					return false
				}
			})
		}()
		lane := func(k int) {
			defer outstanding.Done()
			c := connOf(k)
			for spin := firstChunkSpin; ; spin = handoffSpin {
				g, ok := recvSpinning(ready, spin)
				if !ok {
					return
				}
				if stopped() {
					pool.put(g.slot) // drained: the producer stops at its next chunk
					continue
				}
				if err := p.budget.Acquire(ctx, int64(g.ch.n)); err != nil {
					pool.put(g.slot)
					record(err)
					continue
				}
				r := slotRequest(opWrite, remote.ID, g.ch, g.slot)
				n, slot := g.ch.n, g.slot
				r.done = func(err error) {
					mark("staged.answered", r.id, n)
					p.budget.Release(int64(n))
					pool.put(slot)
					if err != nil {
						record(err)
					}
					outstanding.Done()
				}
				if send(c, r, n, func() { pool.put(slot) }) {
					mark("staged.sent", r.id, n)
				}
			}
		}
		outstanding.Add(lanes)
		for k := 1; k < lanes; k++ {
			go lane(k)
		}
		go lane(0)
	} else {
		type arrived struct {
			ch   chunk
			slot []byte
			id   uint64 // the request's, for the trace marks
		}
		// Answers are read by the connections' receive loops, which must never block: the queue holds every
		// chunk there is.
		landed := make(chan arrived, len(chunks))
		scatterDone := make(chan struct{})
		go func() { // the scatter worker
			defer close(scatterDone)
			for {
				select {
				case a := <-landed:
					if stopped() {
						pool.put(a.slot)
						outstanding.Done()
						continue
					}
					wt, err := stageChunk(sr, a.slot, a.ch, false)
					drained := true
					if err == nil {
						mark("staged.copyq", a.id, a.ch.n)
						err, drained = waitStage(wt)
						mark("staged.copied", a.id, a.ch.n)
					} else {
						err = fmt.Errorf("queueing GPU staging copy: %w", err)
					}
					putBack(a.slot, drained)
					if err != nil {
						record(err)
					}
					outstanding.Done()
				case <-finished:
					return
				}
			}
		}()
		defer func() { <-scatterDone }()
		lane := func(k int) {
			defer outstanding.Done()
			c := connOf(k)
			for i := k; i < len(chunks) && !stopped(); i += lanes {
				ch := chunks[i]
				slot, err := pool.get(ctx)
				if err != nil {
					record(err)
					return
				}
				if err := p.budget.Acquire(ctx, int64(ch.n)); err != nil {
					pool.put(slot)
					record(err)
					return
				}
				r := slotRequest(opRead, remote.ID, ch, slot)
				r.done = func(err error) {
					p.budget.Release(int64(ch.n))
					if err != nil {
						pool.put(slot)
						record(err)
						outstanding.Done()
						return
					}
					mark("staged.answered", r.id, ch.n)
					landed <- arrived{ch, slot, r.id} // the scatter worker finishes the chunk
				}
				if !send(c, r, ch.n, func() { pool.put(slot) }) {
					return
				}
				mark("staged.sent", r.id, ch.n)
			}
		}
		outstanding.Add(lanes)
		for k := 1; k < lanes; k++ {
			go lane(k)
		}
		go lane(0)
	}

	outstanding.Done()
	allDone := outstanding.zero
	select {
	case <-allDone:
	case <-ctx.Done():
		reqs := run.abandon(ctx.Err())
		if op == opRead {
			// Answers still arriving are dropped; nothing more is copied into the region.
			for _, r := range reqs {
				r.c.cancel(r, ctx.Err())
			}
		}
		// Chunks already written are not abandoned: the peer copies a chunk into its memory before it answers,
		// so once their answers arrived (or the peer was lost) nothing of this transfer lands any more. The
		// staging slots bound them (StagingBytes per peer).
		<-allDone
	}
	close(finished)
	err := result()
	if early != nil {
		early(err)
	}
	return err
}

// gatherAhead is a staged write's producer: it queues each chunk's gather into a slot of pool and hands the
// gathered chunk to send (false: stop), in order. Up to gathersAhead gathers are queued before the oldest is
// waited for, so the GPU runs them back to back instead of idling through a host round trip per chunk; a slot
// it cannot get without waiting is waited for only once nothing it queued is left, since only those free slots.
// Every queued gather is waited for before it returns, so no copy into a slot outlives the transfer's hold on it.
func gatherAhead(ctx context.Context, chunks []chunk, pool *stagePool, sr StagedRegion, stopped func() bool,
	record func(error), putBack func([]byte, bool), send func(chunk, []byte) bool) {
	type queued struct {
		i    int
		ch   chunk
		slot []byte
		wt   StageWait
	}
	var fifo []queued
	ok := true
	// next waits for the oldest queued gather and sends it; false once the transfer must stop.
	next := func() bool {
		q := fifo[0]
		fifo = fifo[1:]
		err, drained := waitStage(q.wt)
		mark("staged.gathered", uint64(q.i), q.ch.n)
		if err != nil {
			putBack(q.slot, drained)
			record(err)
			return false
		}
		if !ok || stopped() {
			pool.put(q.slot)
			return false
		}
		return send(q.ch, q.slot)
	}
	for i, ch := range chunks {
		if !ok || stopped() {
			break
		}
		if len(fifo) == gathersAhead {
			if ok = next(); !ok {
				break
			}
		}
		slot, wake, err := pool.tryGet()
		for slot == nil && err == nil && len(fifo) > 0 && ok {
			ok = next()
			slot, wake, err = pool.tryGet()
		}
		if ok && slot == nil && err == nil {
			select {
			case <-wake:
				slot, err = pool.get(ctx)
			case <-ctx.Done():
				err = fmt.Errorf("waiting for staging memory: %w", ctx.Err())
			}
		}
		if !ok || err != nil {
			if slot != nil {
				pool.put(slot)
			}
			if err != nil {
				record(err)
			}
			ok = false
			break
		}
		wt, err := stageChunk(sr, slot, ch, true)
		if err != nil {
			pool.put(slot)
			record(fmt.Errorf("queueing GPU staging copy: %w", err))
			ok = false
			break
		}
		mark("staged.gatherq", uint64(i), ch.n)
		fifo = append(fifo, queued{i, ch, slot, wt})
		// Gathers that already finished go out now rather than once the queue is full: the first chunk would
		// otherwise wait for the next gathers' host work before it leaves.
		for ok && len(fifo) > 0 && stageFinished(fifo[0].wt) {
			ok = next()
		}
	}
	for len(fifo) > 0 {
		if ok {
			ok = next()
			continue
		}
		q := fifo[0]
		fifo = fifo[1:]
		_, drained := waitStage(q.wt)
		putBack(q.slot, drained)
	}
}

// stagedAnswer waits for a staged request's GPU copy and returns its answer; sent, when not nil, runs once the
// answer was written (ok) or could not be.
type stagedAnswer func() (resp respHeader, data []byte, sent func(ok bool))

// serveStaged answers a peer's write or read of a staged GPU region of this node: the payload is received into
// a slot of the peer's serving pool and copied into the region with one submission, only once all of it
// arrived (a peer lost mid-chunk leaves the region untouched); a read is gathered into a slot with one
// submission and answered from there. A refusal consumes a write's payload, so the stream stays usable; an
// error means it is not. A request whose copy was queued returns finish instead of an answer, so the caller
// receives the next request while the copy runs.
func (e *Engine) serveStaged(br io.Reader, pr *payloadReader, h reqHeader, client string) (resp respHeader, data []byte, unpin func(), finish stagedAnswer, err error) {
	resp = respHeader{op: h.op, id: h.id}
	write := h.op == opWrite || h.op == opWriteV
	if h.length > maxChunk {
		return resp, nil, nil, nil, fmt.Errorf("request of %d bytes, at most %d", h.length, maxChunk)
	}
	parts := []vecDesc{{off: h.off, n: uint32(h.length)}}
	if h.op == opWriteV || h.op == opReadV {
		if parts, err = readVec(br, h.length, e.partsRead()); err != nil {
			return resp, nil, nil, nil, err
		}
	}
	refuse := func(rerr error) (respHeader, []byte, func(), stagedAnswer, error) {
		if write {
			if derr := pr.discard(h.length); derr != nil {
				return resp, nil, nil, nil, derr
			}
		}
		resp.status = errorStatus(rerr)
		return resp, []byte(rerr.Error()), nil, nil, nil
	}
	d, unpinRegion, perr := e.reg.Pin(h.mem)
	if perr != nil {
		return refuse(perr)
	}
	sr, why, _ := e.stagedRegion(h.mem)
	if d.Node != e.opts.Node || sr == nil {
		unpinRegion()
		return refuse(fmt.Errorf("%w: GPU memory %s is not staged by this node: %s", engines.ErrUnknownMemory, h.mem, why))
	}
	if h.length == 0 || h.length > stageSlot {
		unpinRegion()
		return refuse(fmt.Errorf("%w: staged request of %d bytes, 1 to %d allowed", engines.ErrInvalid, h.length, stageSlot))
	}
	// A block list's chunk goes to the GPU by block index; anything else as segments, each checked here.
	sb, blockwise := sr.(StagedBlocks)
	var bs uint64
	var ids []uint32
	if blockwise {
		bs, ids, blockwise = servedBlocks(parts, d.Size)
	}
	var segs []engines.Segment
	if !blockwise {
		segs = make([]engines.Segment, len(parts))
		var off uint64
		for i, p := range parts {
			n := uint64(p.n)
			if n == 0 || p.off > d.Size || n > d.Size-p.off {
				unpinRegion()
				return refuse(fmt.Errorf("%w: part [%d, +%d) of %s (%d bytes)", engines.ErrOutOfBounds, p.off, n, h.mem, d.Size))
			}
			segs[i] = engines.Segment{SrcOffset: p.off, DstOffset: off, Size: n}
			if write {
				segs[i] = engines.Segment{SrcOffset: off, DstOffset: p.off, Size: n}
			}
			off += n
		}
	}
	pool := e.pool(true, client)
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.PeerTimeout)
	slot, gerr := pool.get(ctx)
	cancel()
	if gerr != nil {
		unpinRegion()
		return refuse(gerr)
	}
	buf := slot[:h.length]
	if write {
		if err := pr.read(buf); err != nil {
			pool.put(slot)
			unpinRegion()
			return resp, nil, nil, nil, err
		}
		mark("serve.payload", h.id, h.length)
	}
	var wt StageWait
	switch {
	case blockwise && write:
		wt, err = sb.BlocksFromHost(buf, bs, ids)
	case blockwise:
		wt, err = sb.BlocksToHost(buf, bs, ids)
	case write:
		wt, err = sr.FromHost(buf, segs)
	default:
		wt, err = sr.ToHost(buf, segs)
	}
	if err != nil {
		pool.put(slot)
		unpinRegion()
		resp.status = statusRefused
		return resp, []byte(fmt.Sprintf("queueing GPU staging copy: %v", err)), nil, nil, nil
	}
	// settle waits for the copy; the slot goes back once nothing uses it (a read's answer is sent from it), and
	// never while the copy may still run.
	mark("serve.copyq", h.id, h.length)
	settle := func(keep bool) error {
		err, drained := waitStage(wt)
		mark("serve.copied", h.id, h.length)
		if drained && (err != nil || !keep) {
			pool.put(slot)
		}
		return err
	}
	if write {
		finish = func() (respHeader, []byte, func(bool)) {
			err := settle(false)
			unpinRegion()
			if err != nil {
				resp.status = statusRefused
				return resp, []byte(err.Error()), nil
			}
			e.stats.servedIn.Add(h.length)
			return resp, nil, nil
		}
		return resp, nil, nil, finish, nil
	}
	finish = func() (respHeader, []byte, func(bool)) {
		if err := settle(true); err != nil {
			unpinRegion()
			resp.status = statusRefused
			return resp, []byte(err.Error()), nil
		}
		resp.length = h.length
		return resp, buf, func(ok bool) {
			pool.put(slot)
			unpinRegion()
			if ok {
				e.stats.servedOut.Add(h.length)
			}
		}
	}
	return resp, nil, nil, finish, nil
}
