// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// Options configure the engine. Zero values take the defaults noted.
type Options struct {
	// Node is this node's name.
	Node string
	// Listener serves this node's host regions to peers. Nil: the engine only reaches out (local regions get
	// no TCP handle and cannot be read or written by peers).
	Listener net.Listener
	// Advertise is the host:port peers dial, put into Handles.TCP (default: the listener's address).
	Advertise string
	// Dial opens connections to peers (default: a net.Dialer with TCP keep-alive).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// TLS, when set, wraps both accepted connections (tls.Server) and dialed ones (tls.Client; ServerName
	// defaults to the peer's host). Give it the agents' mTLS configuration.
	TLS *tls.Config
	// CheckPeer, with TLS, is asked whether the certificate a peer presented belongs to the node it names in
	// its hello (accepted connections) or answers as (dialed ones); an error refuses the connection.
	CheckPeer func(state tls.ConnectionState, node string) error
	// ConnsPerPeer is the number of connections to each peer (default defaultConnsPerPeer).
	ConnsPerPeer int
	// ChunkBytes is the striping unit: segments are cut into chunks of at most this size, spread over the
	// connections (default 4 MiB, at most 64 MiB).
	ChunkBytes int
	// MaxInFlightBytes bounds the bytes sent or requested but not yet answered, per peer (default 256 MiB).
	MaxInFlightBytes int64
	// PeerTimeout bounds every write to a peer, and how long this node's serving side waits for a request's
	// payload and for its answer to leave (default 15 s).
	PeerTimeout time.Duration
	// Liveness is how long a connection with requests waiting for answers may receive nothing before its peer
	// counts as lost (default 1 s, never more than PeerTimeout). Any byte received counts, answers and the
	// serving side's keepalives (every 100 ms while it receives a payload) alike.
	Liveness time.Duration
	// DialTimeout bounds opening one connection: TCP connect, TLS handshake and hello (default 2 s). A dial
	// through a partition fails after it, so new transfers to an unreachable peer fail fast.
	DialTimeout time.Duration
	// Grace bounds how long Deregister and Close wait for cancelled transfers (engines.DefaultGrace when zero).
	Grace time.Duration
	// Logf receives connection-level errors of the serving side (default: log.Printf).
	Logf func(format string, args ...any)

	// Stager, when set, lets the engine move this node's GPU memory by staging it through pinned host memory
	// (see Stager); nil refuses GPU regions, with NoStageReason as the reason.
	Stager Stager
	// NoStageReason says why there is no Stager (reports and refusals show it).
	NoStageReason string
	// StagingBytes bounds the pinned host memory used for staging GPU memory, per peer node and per side (this
	// node's transfers to it, and serving its requests): default 64 MiB, at least 8 MiB, in 4 MiB slots.
	StagingBytes int64
	// Yield, when set, names pairs another engine claims; the engine leaves pairs with GPU memory on either side
	// to it (the agent asks the fabric and rdma engines), so engines stay disjoint.
	Yield func(src, dst *engines.MemoryDesc) bool
	// Registry, when set, is the composite's region table, shared by every engine of the node (see
	// engines.Regions); nil gives the engine one of its own.
	Registry *engines.Registry

	// stageIdle is how long staging slots stay unused before they go back to the stager (tests shorten it).
	stageIdle time.Duration
	// tlsRecordsOnly keeps the data in TLS's own records: the engine neither offers nor accepts sealed records
	// (tests use it to stand for an agent that predates them).
	tlsRecordsOnly bool
	// narrowSealed offers sealedProto but not sealedWideProto, and reads vectored requests of up to maxVecParts
	// parts only (tests use it to stand for an agent of fxt-sealed/1).
	narrowSealed bool
}

// Engine is the TCP engine.
type Engine struct {
	*engines.Base
	opts Options
	reg  engines.Regions
	wg   sync.WaitGroup
	// scratch lends buffers that gather small parts into one write on TLS connections (writeBuffers).
	scratch sync.Pool
	// sealBufs lends the buffers of sealed records (sealed.go).
	sealBufs sealBuffers

	mu          sync.Mutex
	closed      bool
	peers       map[string]*peer
	serverConns map[net.Conn]struct{}
	// staged holds the staging state of local GPU regions; stageOut and stageIn the staging pools per peer
	// node, for this node's transfers and for serving the peer's requests.
	staged            map[engines.MemoryID]stagedEntry
	stageOut, stageIn map[string]*stagePool
	stopReaper        chan struct{}

	// handshakes bounds the accepted connections not yet past their hello (TLS handshake included): anyone who
	// reaches the port can open them, each held until handshakeTimeout.
	handshakes sockio.Handshakes

	stats struct {
		sent, received, servedIn, servedOut, dialed, accepted atomic.Uint64
		refused, acceptsExhausted                             atomic.Uint64
	}
}

var _ engines.Engine = (*Engine)(nil)

// Stats are payload byte counters since the engine started.
type Stats struct {
	// Sent and Received count bytes this node's transfers wrote to and read from peers.
	Sent, Received uint64
	// ServedIn and ServedOut count bytes peers wrote into and read from this node's regions.
	ServedIn, ServedOut uint64
	// Dialed counts connections this node opened to peers (hello exchanged); Accepted, connections peers
	// opened to this node (hello exchanged).
	Dialed, Accepted uint64
	// Refused counts connections closed at once because too many were before their hello (in all, or from
	// their address); AcceptsExhausted, accepts that found the process out of descriptors.
	Refused, AcceptsExhausted uint64
}

// New starts the engine; with a listener it begins serving at once.
func New(opts Options) (*Engine, error) {
	if opts.Node == "" {
		return nil, fmt.Errorf("tcp engine: %w: node name required", engines.ErrInvalid)
	}
	if opts.ConnsPerPeer <= 0 {
		opts.ConnsPerPeer = defaultConnsPerPeer
	}
	if opts.ChunkBytes <= 0 {
		opts.ChunkBytes = 4 << 20
	}
	if opts.ChunkBytes > maxChunk {
		return nil, fmt.Errorf("tcp engine: %w: chunk of %d bytes, at most %d", engines.ErrInvalid, opts.ChunkBytes, maxChunk)
	}
	if opts.MaxInFlightBytes <= 0 {
		opts.MaxInFlightBytes = 256 << 20
	}
	if opts.MaxInFlightBytes < int64(opts.ChunkBytes) {
		opts.MaxInFlightBytes = int64(opts.ChunkBytes)
	}
	if opts.PeerTimeout <= 0 {
		opts.PeerTimeout = 15 * time.Second
	}
	if opts.Liveness <= 0 {
		opts.Liveness = time.Second
	}
	opts.Liveness = min(opts.Liveness, opts.PeerTimeout)
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 2 * time.Second
	}
	if opts.Dial == nil {
		d := &net.Dialer{KeepAlive: 15 * time.Second}
		opts.Dial = d.DialContext
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	if opts.StagingBytes <= 0 {
		opts.StagingBytes = defaultStagingBytes
	}
	if opts.StagingBytes < 2*stageSlot {
		return nil, fmt.Errorf("tcp engine: %w: %d bytes of staging memory per peer, at least %d", engines.ErrInvalid, opts.StagingBytes, 2*stageSlot)
	}
	if opts.stageIdle <= 0 {
		opts.stageIdle = stageIdle
	}
	if opts.Stager == nil && opts.NoStageReason == "" {
		opts.NoStageReason = "no GPU copy backend in this process"
	}
	if opts.Listener != nil && opts.Advertise == "" {
		opts.Advertise = opts.Listener.Addr().String()
	}
	if opts.TLS != nil {
		// Connections are long-lived and never resumed; a TLS 1.3 ticket sent after the handshake would sit in the
		// stream where sealed records begin.
		opts.TLS = opts.TLS.Clone()
		opts.TLS.SessionTicketsDisabled = true
		if !opts.tlsRecordsOnly {
			opts.TLS.NextProtos = []string{sealedWideProto, sealedProto}
			if opts.narrowSealed {
				opts.TLS.NextProtos = []string{sealedProto}
			}
		}
	}
	reg, err := engines.NewRegions(engines.EngineTCP, opts.Registry, opts.Node, opts.Grace)
	if err != nil {
		return nil, err
	}
	e := &Engine{opts: opts, reg: reg,
		peers: map[string]*peer{}, serverConns: map[net.Conn]struct{}{},
		staged: map[engines.MemoryID]stagedEntry{}, stageOut: map[string]*stagePool{}, stageIn: map[string]*stagePool{}}
	// Plans are not split: chunking happens at submit, across connections. Block batches stay in block form
	// (checked once, not planned block by block); submit expands them into the segments it cuts into requests.
	e.Base = engines.NewBase(engines.EngineTCP, reg, engines.Limits{BlockPlans: true}, e.CanHandle)
	if opts.Listener != nil {
		e.wg.Add(1)
		go e.serve(opts.Listener)
	}
	if opts.Stager != nil {
		e.stopReaper = make(chan struct{})
		e.wg.Add(1)
		go e.reapStaging(opts.stageIdle, e.stopReaper)
	}
	return e, nil
}

func (e *Engine) logf(format string, args ...any) { e.opts.Logf(format, args...) }

// Addr is the address peers dial (empty without a listener).
func (e *Engine) Addr() string { return e.opts.Advertise }

// Stats returns the byte counters.
func (e *Engine) Stats() Stats {
	return Stats{Sent: e.stats.sent.Load(), Received: e.stats.received.Load(),
		ServedIn: e.stats.servedIn.Load(), ServedOut: e.stats.servedOut.Load(),
		Dialed: e.stats.dialed.Load(), Accepted: e.stats.accepted.Load(),
		Refused: e.stats.refused.Load(), AcceptsExhausted: e.stats.acceptsExhausted.Load()}
}

// Wire says how this engine's connections carry data, for reports.
func (e *Engine) Wire() string {
	switch {
	case e.opts.TLS == nil:
		return "data over plain TCP (no TLS configured)"
	case e.opts.tlsRecordsOnly:
		return "data over mutual TLS"
	}
	return "data over mutual TLS, in AES-GCM records keyed from the TLS session with peers that offer them (TLS records otherwise)"
}

// Staging reports whether this engine stages GPU memory through pinned host memory, and says how or why not.
func (e *Engine) Staging() (bool, string) {
	if e.opts.Stager == nil {
		return false, "GPU memory is not staged: " + e.opts.NoStageReason
	}
	return true, fmt.Sprintf("GPU memory is staged through pinned host memory: up to %d MiB per peer and side, in %d MiB chunks",
		e.opts.StagingBytes>>20, stageSlot>>20)
}

// Register implements engines.Engine: host memory with a view in this process gets the TCP handle, and so does
// GPU memory of this node the stager reaches.
func (e *Engine) Register(_ context.Context, desc engines.MemoryDesc) (engines.MemoryDesc, error) {
	if desc.Location.Kind == engines.LocationHost && desc.Handles.Host != nil && e.opts.Advertise != "" {
		desc.Handles.TCP = e.opts.Advertise
	}
	var staged *stagedEntry
	if desc.Location.Kind == engines.LocationGPU && desc.Node == e.opts.Node {
		staged = &stagedEntry{why: e.opts.NoStageReason}
		if e.opts.Stager != nil {
			sr, err := e.opts.Stager.Stage(desc)
			if err != nil {
				// Other engines may still move it; the refusal says why tcp does not.
				staged.why = err.Error()
			} else {
				staged.r, staged.why = sr, ""
				if e.opts.Advertise != "" {
					desc.Handles.TCP = e.opts.Advertise
				}
			}
		}
	}
	if err := e.reg.AddLocal(desc); err != nil {
		if staged != nil && staged.r != nil {
			_ = staged.r.Release()
		}
		return desc, fmt.Errorf("tcp: registering %s: %w", desc.ID, err)
	}
	if staged != nil {
		e.mu.Lock()
		e.staged[desc.ID] = *staged
		e.mu.Unlock()
	}
	return desc, nil
}

// Deregister implements engines.Engine. Peers' requests that are being served hold the region too.
func (e *Engine) Deregister(ctx context.Context, id engines.MemoryID) error {
	if err := e.reg.Remove(ctx, id); err != nil {
		return fmt.Errorf("tcp: %w", err)
	}
	// Transfers and served requests pin the region, so nothing stages it any more.
	e.mu.Lock()
	s, ok := e.staged[id]
	delete(e.staged, id)
	e.mu.Unlock()
	if ok && s.r != nil {
		if err := s.r.Release(); err != nil {
			return fmt.Errorf("tcp: releasing the staging of %s: %w", id, err)
		}
	}
	return nil
}

// CanHandle implements engines.Engine.
func (e *Engine) CanHandle(src, dst *engines.MemoryDesc) (bool, string) {
	srcLocal, dstLocal := src.Node == e.opts.Node, dst.Node == e.opts.Node
	if srcLocal == dstLocal {
		if srcLocal {
			return false, "both regions are on this node"
		}
		return false, "neither region is on this node"
	}
	local, remote := src, dst
	if dstLocal {
		local, remote = dst, src
	}
	switch local.Location.Kind {
	case engines.LocationHost:
		if local.Handles.Host == nil {
			return false, fmt.Sprintf("%s has no host view in this process", local.ID)
		}
	case engines.LocationGPU:
		if sr, why, _ := e.stagedRegion(local.ID); sr == nil {
			if why == "" {
				why = e.opts.NoStageReason
			}
			return false, fmt.Sprintf("%s is GPU memory this node does not stage through host memory: %s", local.ID, why)
		}
	default:
		return false, fmt.Sprintf("%s is %s memory", local.ID, local.Location.Kind)
	}
	if remote.Handles.TCP == "" {
		if remote.Location.Kind == engines.LocationGPU {
			return false, fmt.Sprintf("%s is GPU memory node %s does not stage through host memory (no TCP endpoint)", remote.ID, remote.Node)
		}
		return false, fmt.Sprintf("%s has no TCP endpoint", remote.ID)
	}
	if len(local.Handles.RDMA) > 0 && len(remote.Handles.RDMA) > 0 {
		return false, "both regions carry RDMA keys: the rdma engine's pair"
	}
	gpu := local.Location.Kind == engines.LocationGPU || remote.Location.Kind == engines.LocationGPU
	if gpu && e.opts.Yield != nil && e.opts.Yield(src, dst) {
		return false, "another engine moves this GPU pair without staging"
	}
	return true, ""
}

// deliver hands a notification to this node's handler.
func (e *Engine) deliver(n engines.Notification) { e.Deliver(n) }

// peerFor returns the connected peer at addr, dialing it if needed.
func (e *Engine) peerFor(ctx context.Context, node, addr string) (*peer, error) {
	return e.peerAt(ctx, node, addr, true)
}

// peerAt is peerFor; displace says whether connections at addr to another node may be replaced (a transfer's
// descriptor names the address it was registered at) or not (a pre-connection, whose address a peer announced
// itself and could have made up).
func (e *Engine) peerAt(ctx context.Context, node, addr string, displace bool) (*peer, error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, engines.ErrClosed
	}
	p, ok := e.peers[addr]
	if ok && p.node != node && !displace {
		e.mu.Unlock()
		return nil, fmt.Errorf("address %s is connected to node %s, not %s", addr, p.node, node)
	}
	if ok && p.node != node {
		// Another node now answers at this address (a restarted agent); the old connections go.
		old := p
		go func() { <-old.ready; old.kill(fmt.Errorf("address %s now belongs to node %s", addr, node)) }()
		ok = false
	}
	if !ok {
		p = &peer{e: e, node: node, addr: addr, name: fmt.Sprintf("%s (%s)", node, addr),
			budget: semaphore.NewWeighted(e.opts.MaxInFlightBytes), ready: make(chan struct{}), dead: make(chan struct{})}
		e.peers[addr] = p
		go p.dial(context.WithoutCancel(ctx))
	}
	e.mu.Unlock()
	select {
	case <-p.ready:
		if p.dialErr != nil {
			return nil, p.dialErr
		}
		return p, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (e *Engine) forgetPeer(p *peer) {
	e.mu.Lock()
	if e.peers[p.addr] == p {
		delete(e.peers, p.addr)
	}
	e.mu.Unlock()
}

// Preconnect opens the connections to node at addr ahead of its first transfer, so that transfer pays no TCP or
// TLS handshake; it returns once they are open (at once when they already are). A failure is not sticky: the
// next Preconnect or transfer dials again.
func (e *Engine) Preconnect(ctx context.Context, node, addr string) error {
	if _, err := e.peerAt(ctx, node, addr, false); err != nil {
		return fmt.Errorf("tcp: pre-connecting to %s (%s): %w", node, addr, err)
	}
	return nil
}

// Disconnect closes the connections to node at every address it was reached at (it left the pool); transfers in
// flight to it fail with a PeerLostError carrying reason.
func (e *Engine) Disconnect(node, reason string) {
	e.mu.Lock()
	var gone []*peer
	for addr, p := range e.peers {
		if p.node == node {
			gone = append(gone, p)
			delete(e.peers, addr)
		}
	}
	e.mu.Unlock()
	for _, p := range gone {
		go func() { <-p.ready; p.kill(errors.New(reason)) }()
	}
}

// PeerConns returns, per peer node, how many connections to it are open.
func (e *Engine) PeerConns() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for _, p := range e.peers {
		select {
		case <-p.ready:
		default:
			continue // still dialing
		}
		select {
		case <-p.dead:
		default:
			out[p.node] += len(p.conns)
		}
	}
	return out
}

// Submit implements engines.Engine.
func (e *Engine) Submit(ctx context.Context, ps *engines.PlanSet, opts engines.SubmitOptions) (engines.Transfer, error) {
	var finalize func(context.Context, []engines.Outcome)
	if opts.Notify != nil {
		payload := append([]byte(nil), opts.Notify...)
		finalize = func(fctx context.Context, outcomes []engines.Outcome) { e.notifyAll(fctx, ps.Plans, outcomes, payload) }
	}
	t, work, err := e.reg.Begin(ctx, e.Name(), ps, opts, finalize)
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	for _, w := range work {
		// Without a notification to send after the last answer, the goroutine that reads it finishes the
		// plan itself: one hand-off less on the way back to the caller.
		var early func(error)
		if opts.Notify == nil {
			early = func(err error) { t.Finish(w.Index, err) }
		}
		go func() { t.Finish(w.Index, e.runPlan(t.Context(), w, early)) }()
	}
	return t, nil
}

// chunk is one request's share of a plan: one contiguous range, or several small ones (parts) sent as one
// vectored request.
type chunk struct {
	localOff, remoteOff, n uint64
	parts                  []part
	// ids, when set, are the local block indexes of parts (one whole block of blockBytes each): staged GPU
	// memory copies them by index (StagedBlocks) instead of a segment per part.
	ids        []uint32
	blockBytes uint64
}

// part is one range of a vectored chunk. It holds no pointer, so a block list's thousands of parts cost the
// garbage collector nothing to scan or copy.
type part struct {
	localOff, remoteOff, n uint64
}

// runPlan stripes one plan over the peer's connections: chunks are dealt round robin to one lane per
// connection, each lane writing on its own connection (this goroutine is lane 0, so a one-chunk plan costs no
// hand-off), and waits for every chunk's answer.
//
// early, when set, is called with the plan's outcome as soon as the last answer arrives, from the goroutine
// that read it; the returned error is the same outcome.
func (e *Engine) runPlan(ctx context.Context, w engines.Work, early func(error)) error {
	op, local, remote := opWrite, w.Src, w.Dst
	if w.Plan.Direction == engines.DirRead {
		op, local, remote = opRead, w.Dst, w.Src
	}
	p, err := e.peerFor(ctx, remote.Node, remote.Handles.TCP)
	if err != nil {
		return err
	}
	if local.Location.Kind == engines.LocationGPU {
		return e.runStaged(ctx, w, p, op, local, remote, early)
	}
	size := e.opts.ChunkBytes
	if remote.Location.Kind == engines.LocationGPU {
		size = min(size, stageSlot) // the peer stages each request in one slot
	}
	// Host memory keeps requests of up to maxVecParts parts: at ChunkBytes each, wide ones would put a block list
	// on fewer connections than it has (measured only for staged GPU memory, which cuts its own chunks smaller).
	chunks := e.chunks(w.Plan, op == opRead, size, maxVecParts)

	var run planRun
	record, failed := run.record, run.failed
	// outstanding counts sent chunks without an answer, plus one per lane still issuing.
	var outstanding atomic.Int64
	finished := make(chan struct{})
	// Every chunk that was not answered with success records an error, so nil means all of them landed.
	result := run.err
	release := func() {
		if outstanding.Add(-1) == 0 {
			if early != nil {
				early(result())
			}
			close(finished)
		}
	}
	lanes := min(len(p.conns), len(chunks))
	first := p.next.Add(uint64(lanes))
	outstanding.Add(int64(lanes))
	lane := func(k int) {
		defer release()
		c := p.conns[(first+uint64(k))%uint64(len(p.conns))]
		for i := k; i < len(chunks) && !failed(); i += lanes {
			ch := chunks[i]
			if err := p.budget.Acquire(ctx, int64(ch.n)); err != nil {
				record(err)
				return
			}
			r := &request{op: op, mem: remote.ID, off: ch.remoteOff, buf: local.Handles.Host[ch.localOff : ch.localOff+ch.n]}
			if ch.parts != nil {
				r.op, r.off, r.buf = opWriteV, 0, nil
				if op == opRead {
					r.op = opReadV
				}
				r.parts, r.host = ch.parts, local.Handles.Host
			}
			r.done = func(err error) {
				p.budget.Release(int64(ch.n))
				if err != nil {
					record(err)
				}
				release()
			}
			outstanding.Add(1)
			if err := c.send(ctx, r); err != nil {
				p.budget.Release(int64(ch.n))
				outstanding.Add(-1)
				record(err)
				return
			}
			if !run.track(r) {
				c.cancel(r, ctx.Err())
				return
			}
		}
	}
	for k := 1; k < lanes; k++ {
		go lane(k)
	}
	lane(0)
	select {
	case <-finished:
	case <-ctx.Done():
		// Abandon what is outstanding; each request completes once no I/O touches its buffer.
		for _, r := range run.abandon(ctx.Err()) {
			r.c.cancel(r, ctx.Err())
		}
		<-finished
	}
	return result()
}

// planRun is what the lanes of one plan's run share: the first error, the requests in flight, and whether the
// run was abandoned.
type planRun struct {
	mu        sync.Mutex
	firstErr  error
	inflight  []*request
	abandoned bool
}

// record keeps err when it is the run's first.
func (s *planRun) record(err error) {
	s.mu.Lock()
	if s.firstErr == nil {
		s.firstErr = err
	}
	s.mu.Unlock()
}

// failed reports whether the run has an error or was abandoned.
func (s *planRun) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstErr != nil || s.abandoned
}

// err is the run's first error.
func (s *planRun) err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.firstErr
}

// track adds r to the requests in flight; false once the run was abandoned (r is then the caller's to cancel).
func (s *planRun) track(r *request) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abandoned {
		return false
	}
	s.inflight = append(s.inflight, r)
	return true
}

// abandon marks the run abandoned, with cause as its error unless it has one (lanes may stop without an error
// of their own), and returns the requests in flight.
func (s *planRun) abandon(cause error) []*request {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.abandoned = true
	if s.firstErr == nil {
		s.firstErr = cause
	}
	return s.inflight
}

// chunks cuts a plan into requests: large segments into pieces of at most limit bytes, runs of small segments
// (up to vecPartMax each) gathered into vectored requests of up to limit bytes and maxParts parts (what the peer
// reads).
func (e *Engine) chunks(p *engines.Plan, read bool, limit, maxParts int) []chunk {
	size := uint64(min(limit, e.opts.ChunkBytes))
	if maxParts <= 0 {
		maxParts = maxVecParts
	}
	var out []chunk
	// Every part of the plan lives in one array, each vectored chunk a slice of it: a block list is cut
	// without a segment or an allocation per block.
	n := len(p.Segments)
	if p.Blocks != nil {
		n = len(p.Blocks.SrcIDs)
	}
	all := make([]part, 0, n)
	// A block list whose blocks each become one part: part k of all is block k, so a chunk's local block ids
	// are a slice of the list's.
	var localIDs []uint32
	var blockBytes uint64
	if l := p.Blocks; l != nil && l.BlockBytes <= size && l.BlockBytes <= vecPartMax {
		localIDs, blockBytes = l.SrcIDs, l.BlockBytes
		if read {
			localIDs = l.DstIDs
		}
	}
	start := 0
	var vecBytes uint64
	flush := func() {
		switch vec := all[start:]; len(vec) {
		case 0:
		case 1:
			out = append(out, chunk{localOff: vec[0].localOff, remoteOff: vec[0].remoteOff, n: vec[0].n})
		default:
			ch := chunk{n: vecBytes, parts: vec[:len(vec):len(vec)]}
			if localIDs != nil {
				ch.ids, ch.blockBytes = localIDs[start:len(all):len(all)], blockBytes
			}
			out = append(out, ch)
		}
		start, vecBytes = len(all), 0
	}
	add := func(src, dst, length uint64) {
		for off := uint64(0); off < length; off += size {
			c := part{localOff: src + off, remoteOff: dst + off, n: min(size, length-off)}
			if read {
				c.localOff, c.remoteOff = c.remoteOff, c.localOff
			}
			if c.n > vecPartMax {
				out = append(out, chunk{localOff: c.localOff, remoteOff: c.remoteOff, n: c.n})
				continue
			}
			if len(all)-start == maxParts || vecBytes+c.n > size {
				flush()
			}
			all = append(all, c)
			vecBytes += c.n
		}
	}
	if l := p.Blocks; l != nil {
		for i, s := range l.SrcIDs {
			add(uint64(s)*l.BlockBytes, uint64(l.DstIDs[i])*l.BlockBytes, l.BlockBytes)
		}
	} else {
		for _, s := range p.Segments {
			add(s.SrcOffset, s.DstOffset, s.Size)
		}
	}
	flush()
	return out
}

// Close implements engines.Engine: transfers are cancelled, the listener and every connection closed.
func (e *Engine) Close() error {
	err := e.reg.Close()
	e.mu.Lock()
	e.closed = true
	peers := make([]*peer, 0, len(e.peers))
	for _, p := range e.peers {
		peers = append(peers, p)
	}
	for nc := range e.serverConns {
		nc.Close()
	}
	e.mu.Unlock()
	if e.opts.Listener != nil {
		e.opts.Listener.Close()
	}
	e.mu.Lock()
	stop := e.stopReaper
	e.stopReaper = nil
	e.mu.Unlock()
	if stop != nil {
		close(stop)
	}
	for _, p := range peers {
		select {
		case <-p.ready:
			p.kill(errors.New("engine closed"))
		case <-time.After(e.opts.DialTimeout + time.Second):
		}
	}
	e.wg.Wait()
	e.mu.Lock()
	pools := make([]*stagePool, 0, len(e.stageOut)+len(e.stageIn))
	for _, m := range []map[string]*stagePool{e.stageOut, e.stageIn} {
		for _, sp := range m {
			pools = append(pools, sp)
		}
	}
	e.stageOut, e.stageIn = map[string]*stagePool{}, map[string]*stagePool{}
	e.mu.Unlock()
	for _, sp := range pools {
		err = errors.Join(err, sp.close())
	}
	e.mu.Lock()
	staged := e.staged
	e.staged = map[engines.MemoryID]stagedEntry{}
	e.mu.Unlock()
	for _, s := range staged {
		if s.r != nil {
			err = errors.Join(err, s.r.Release())
		}
	}
	if err != nil {
		return fmt.Errorf("tcp: %w", err)
	}
	return nil
}

// Pin returns the host view of a local region and keeps the region registered (Deregister waits) until unpin
// is called. Use it to touch served memory in step with peers' requests.
func (e *Engine) Pin(id engines.MemoryID) (view []byte, unpin func(), err error) {
	d, unpin, err := e.reg.Pin(id)
	if err != nil {
		return nil, nil, fmt.Errorf("tcp: %w", err)
	}
	if d.Node != e.opts.Node || d.Handles.Host == nil {
		unpin()
		return nil, nil, fmt.Errorf("tcp: %w: %s is not host memory of this node", engines.ErrInvalid, id)
	}
	return d.Handles.Host, unpin, nil
}
