// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// ErrSessionLost means the agent restarted (or the connection was re-established) since the regions in use
// were registered: they are gone on the agent side. Call Recover, then retry.
var ErrSessionLost = errors.New("agent session lost (the agent restarted, or the connection to it closed): call Recover and retry")

// ErrLost means the memory a region or layout names went with a restarted agent and Recover cannot bring it
// back (a pool slice, a layout over one, or a layout whose region was deregistered since): allocate or register
// it again. Retrying after Recover fails the same way.
var ErrLost = errors.New("lost with the agent's restart and not registered again")

// ErrClosed means the call was made on a client after Close.
var ErrClosed = errors.New("the client is closed")

// FDSocketName is the fd socket's name beside the agent socket.
const FDSocketName = "agent.fd.sock"

// Client talks to one agent socket. Safe for concurrent use.
type Client struct {
	conn       *grpc.ClientConn
	api        agentv1.AgentClient
	socketPath string
	dials      atomic.Uint64
	noFast     bool
	noMailbox  bool
	spin       time.Duration

	// fastSem is the fast lock (held by one call at a time, taken with the call's context: lockFast), over what
	// follows down to frame.
	fastSem    chan struct{}
	fast       *net.UnixConn
	mbox       *fastwire.CallerMailbox // the fast connection's mailbox; nil: frames go on the socket
	arena      []byte                  // the fast connection's id arena (mapped); nil: ids travel in the frame
	frame      []byte                  // the buffer block requests are written into (fastBlocks)
	fastWanted bool                    // a fast connection was installed: one dropped is opened again
	// fastLive is fast, readable without the fast lock: Close closes it under a call that holds the lock.
	fastLive atomic.Pointer[net.UnixConn]
	// cuts are fast connections dropped under a call, kept until the agent closes them, and waited the waited
	// transfer calls in flight (Settle).
	cuts   cutCalls
	waited waitedCalls

	reopening   atomic.Bool  // a background reopen of the fast connection runs (reopenFastLater)
	reopenAfter atomic.Int64 // unix nanoseconds before which no reopen is tried (one failed)
	// life ends at Close: what the client runs in the background stops with it.
	life    context.Context
	endLife context.CancelFunc

	recoverMu sync.Mutex // one Recover at a time
	closed    atomic.Bool

	// session names the agent session the client's memory is registered in ("<instance>/<session>", from
	// GetInfo); every call carries it, and the agent refuses one that reaches another session.
	session atomic.Pointer[string]

	mu      sync.Mutex
	gen     uint64 // the dial generation regions are registered under
	info    *agentv1.GetInfoResponse
	regions map[*Region]struct{}
	layouts map[*Layout]struct{}
}

// closeWait bounds Close's wait for the agent to end the session.
const closeWait = 2 * time.Second

// dialReadyWait bounds Dial's wait for an agent to answer when its context has no deadline.
const dialReadyWait = 10 * time.Second

// Option tunes Dial.
type Option func(*dialOptions)

type dialOptions struct {
	name      string
	noFast    bool
	noMailbox bool
	spin      time.Duration
	// idle lets the gRPC channel go idle after this long without gRPC calls (0: never, the default). Only tests
	// set it: an idle channel closes its connection, the agent ends the session with it, and a client busy on the
	// fast socket alone (which gRPC does not see) lost its regions and names every 30 minutes, gRPC's default.
	idle time.Duration
}

// WithSpin sets how long a fast-path call polls for its reply before sleeping (default DefaultSpin; 0 never
// polls); a waited transfer polls longer, by the time its bytes take at 1 TB/s (within 2 ms, or d when longer),
// so a GPU copy within the node is answered while the caller still polls. Polling trades a busy core for tens of
// microseconds per transfer.
func WithSpin(d time.Duration) Option { return func(o *dialOptions) { o.spin = d } }

// WithName names the client in the agent's logs.
func WithName(name string) Option { return func(o *dialOptions) { o.name = name } }

// WithoutFastPath keeps every call on gRPC (by default Do, Write and Read use the agent's fast socket).
func WithoutFastPath() Option { return func(o *dialOptions) { o.noFast = true } }

// WithoutMailbox keeps fast-path frames on the socket. By default they travel through shared memory the agent
// watches (agent.proto, Mailbox) where they fit, so a call while both sides poll makes no system call.
func WithoutMailbox() Option { return func(o *dialOptions) { o.noMailbox = true } }

// Dial connects to the agent socket at socketPath and negotiates the API version.
func Dial(ctx context.Context, socketPath string, opts ...Option) (*Client, error) {
	o := dialOptions{spin: DefaultSpin}
	for _, fn := range opts {
		fn(&o)
	}
	if err := notAnAgentSocket(socketPath); err != nil {
		return nil, err
	}
	// A socket this user may not open is said at once: gRPC would retry the refused dial until ctx ended.
	if err := unix.Access(socketPath, unix.W_OK); errors.Is(err, unix.EACCES) {
		return nil, notInSocketGroup(socketPath, err)
	}
	c := &Client{socketPath: socketPath,
		regions: map[*Region]struct{}{}, layouts: map[*Layout]struct{}{}, noFast: o.noFast, noMailbox: o.noMailbox, spin: o.spin,
		fastSem: make(chan struct{}, 1), waited: waitedCalls{turn: make(chan struct{}, 1)}}
	c.life, c.endLife = context.WithCancel(context.Background())
	// gRPC turns a failed dial into an Unavailable status; the dial's own error is kept to explain a refusal.
	var lastDialErr atomic.Pointer[error]
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		c.dials.Add(1)
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socketPath)
		if err != nil {
			lastDialErr.Store(&err)
		}
		return conn, err
	}
	conn, err := grpc.NewClient("passthrough:///fabricxfer-agent",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		// Reconnect quickly after an agent restart; calls never wait for readiness (fail fast).
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: time.Second}),
		grpc.WithChainUnaryInterceptor(c.nameSession), grpc.WithChainStreamInterceptor(c.nameSessionStream),
		grpc.WithIdleTimeout(o.idle),
	)
	if err != nil {
		c.endLife()
		return nil, fmt.Errorf("connecting to agent socket %s: %w", socketPath, err)
	}
	c.conn = conn
	c.api = agentv1.NewAgentClient(conn)
	// An agent that is starting, or paused for a moment, is waited for (as Python's Client does) until ctx ends,
	// and for dialReadyWait at most when ctx has no deadline: it failed after gRPC's first connect timeout (1 s)
	// with "error reading server preface".
	ready, cancelReady := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		ready, cancelReady = context.WithTimeout(ctx, dialReadyWait)
	}
	defer cancelReady()
	info, err := c.api.GetInfo(ready, &agentv1.GetInfoRequest{ApiVersions: []string{"v1"}, ClientName: o.name}, grpc.WaitForReady(true))
	if err != nil {
		c.endLife()
		conn.Close()
		de := lastDialErr.Load()
		if de != nil && errors.Is(*de, unix.EACCES) {
			return nil, notInSocketGroup(socketPath, *de)
		}
		if ended := ctxEnded(ready); ended != nil {
			why := "nothing answered on its socket: an agent paused, or a socket left by a stopped agent?"
			if de != nil {
				why = fmt.Sprintf("its socket refused the connection (%v): a socket left by a stopped agent?", *de)
			}
			return nil, fmt.Errorf("no agent answered at %s in time: %s: %w", socketPath, why, ended)
		}
		return nil, fmt.Errorf("asking agent %s for its info: %w", socketPath, err)
	}
	c.info = info
	c.gen = c.dials.Load()
	c.nameSessionOf(info)
	if !c.noFast {
		if err := c.openFast(ready); err != nil { // bounded as GetInfo was: an agent that stalls now is not waited for unbounded
			c.endLife()
			conn.Close()
			if ended := ctxEnded(ready); ended != nil && !errors.Is(err, ended) {
				err = fmt.Errorf("%w (%w)", err, ended)
			}
			return nil, err
		}
	}
	return c, nil
}

// socketDir is the folder of the agent's sockets: socketPath's, links resolved now (the agent's other sockets lie
// beside the socket itself, not beside a link to it elsewhere; gRPC follows a link retargeted since, and so
// does this).
func (c *Client) socketDir() string {
	if real, err := filepath.EvalSymlinks(c.socketPath); err == nil {
		return filepath.Dir(real)
	}
	return filepath.Dir(c.socketPath)
}

// fdSocket is the agent's descriptor socket.
func (c *Client) fdSocket() string { return filepath.Join(c.socketDir(), FDSocketName) }

// nameSessionOf makes later calls name the session info describes (an agent too old to name it: none).
func (c *Client) nameSessionOf(info *agentv1.GetInfoResponse) {
	if info.GetInstance() == "" {
		c.session.Store(nil)
		return
	}
	name := info.GetInstance() + "/" + strconv.FormatUint(info.GetSession(), 10)
	c.session.Store(&name)
}

func (c *Client) nameSession(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	var trailer metadata.MD
	err := invoker(c.inSession(ctx), method, req, reply, cc, append(opts, grpc.Trailer(&trailer))...)
	if Code(err) == codes.Unavailable && len(trailer.Get(fastwire.AnsweredHeader)) == 0 {
		// Not the agent's answer: the connection went (an agent that stopped or died under the call), and the
		// session with it, as a stream's end says (streamEnd).
		return connectionLost{err}
	}
	return err
}

// connectionLost is a call's Unavailable that the agent did not answer itself: its connection, and so its
// session, went. wrap reads it as ErrSessionLost.
type connectionLost struct{ error }

func (e connectionLost) Unwrap() error { return e.error }

// GRPCStatus is the call's status, so Code and status.FromError read it as they did.
func (e connectionLost) GRPCStatus() *status.Status { return status.Convert(e.error) }

func (c *Client) nameSessionStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(c.inSession(ctx), desc, cc, method, opts...)
}

// inSession is ctx with the session header the client's calls carry, where it knows its session.
func (c *Client) inSession(ctx context.Context) context.Context {
	if name := c.session.Load(); name != nil {
		return metadata.AppendToOutgoingContext(ctx, fastwire.SessionHeader, *name)
	}
	return ctx
}

// sessionRefused reports whether err is the agent's refusal of a call that reached another session.
func sessionRefused(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Aborted && strings.HasPrefix(st.Message(), fastwire.SessionLostPrefix)
}

// notInSocketGroup explains a connect refused with EACCES: the sockets and their directory are 0660/0750 in
// root's group or the pool's socketGroup, so this process runs as neither root nor a member of that group.
func notInSocketGroup(path string, err error) error {
	groups, _ := os.Getgroups()
	return fmt.Errorf("connecting to agent socket %s as uid %d (gid %d, groups %v): %w; a non-root pod needs the "+
		"pool's spec.socketGroup in its securityContext.supplementalGroups; outside Kubernetes, run the agent as this "+
		"user or with --socket-gid set to one of this user's groups", path, os.Getuid(), os.Getgid(), groups, err)
}

// Close ends the client's session, whose regions, layouts and pool slices the agent frees before it answers
// (an older agent frees them once the connection is gone), and closes the connection. It waits for that up to
// 2 s (transfers in flight on the regions settle first) and returns the error when the session had not ended by
// then: its names may still be taken for a moment. Later calls fail with ErrClosed; closing again does nothing.
func (c *Client) Close() error {
	live := c.check() == nil
	if c.closed.Swap(true) {
		return nil
	}
	var ending error
	if live {
		// The agent frees the session's names before it answers (when the connection closes, it does so in the
		// background: a process registering them again at once could find them taken). An agent too old to
		// have EndSession is left to do it then; one that did not end it within closeWait is said.
		ctx, cancel := context.WithTimeout(context.Background(), closeWait)
		// A connection already gone (the agent stopped) took the session with it: nothing is left to end.
		if _, err := c.api.EndSession(ctx, &agentv1.EndSessionRequest{}); err != nil && status.Code(err) != codes.Unimplemented &&
			!errors.As(err, new(connectionLost)) {
			ending = fmt.Errorf("ending the session within %v: %w: its regions and names are freed once their transfers in flight settle", closeWait, asDeadline(err))
		}
		cancel()
	}
	c.mu.Lock()
	for r := range c.regions {
		r.release()
	}
	c.regions = map[*Region]struct{}{}
	c.layouts = map[*Layout]struct{}{}
	c.mu.Unlock()
	c.endLife()
	// A call in flight on the fast connection (an agent that does not answer) ends at once rather than at its
	// deadline: its wait on the socket fails, and it gives the lock back. The mailbox it may poll stays mapped
	// until closeFast holds the lock.
	if conn := c.fastLive.Load(); conn != nil {
		_ = conn.Close()
	}
	c.closeFast()
	c.cuts.abandon()
	if err := c.conn.Close(); err != nil {
		return err
	}
	return ending
}

// Info returns what the agent said at Dial (or at the last Recover).
func (c *Client) Info() *agentv1.GetInfoResponse {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info
}

// API returns the raw gRPC client for calls this package does not wrap.
func (c *Client) API() agentv1.AgentClient { return c.api }

// check fails fast when the connection was re-established since the regions were registered.
func (c *Client) check() error {
	if c.closed.Load() {
		return ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dials.Load() != c.gen {
		return ErrSessionLost
	}
	return nil
}

// wrap turns an error of a call made under generation gen into ErrSessionLost when the connection changed, and
// into one that also wraps ctx's error (errors.Is(err, context.DeadlineExceeded)) when the call failed because
// ctx ended.
func (c *Client) wrap(ctx context.Context, what string, gen uint64, err error) error {
	if err == nil {
		return nil
	}
	if c.closed.Load() {
		// What the call met as Close cut it off (a lost session, a closed socket) would only mislead.
		return fmt.Errorf("%s: %w", what, ErrClosed)
	}
	if c.dials.Load() != gen || sessionRefused(err) || errors.As(err, new(connectionLost)) {
		return fmt.Errorf("%s: %w (%v)", what, ErrSessionLost, err)
	}
	if ended := ctxEnded(ctx); ended != nil && !errors.Is(err, ended) && endedByDeadline(err) {
		return fmt.Errorf("%s: %w (%w)", what, err, ended)
	}
	return fmt.Errorf("%s: %w", what, asDeadline(err))
}

// asDeadline is err, matching context.DeadlineExceeded too when it is the agent's answer that a deadline ran out:
// the call's (it answers a little before the context's, to be heard), or the transfer's own. It reads as the
// context's would, as a TransferError of that state does.
func asDeadline(err error) error {
	if Code(err) == codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	}
	return err
}

// ctxEnded is ctx's error, or context.DeadlineExceeded once its deadline passed: a call's own waits (gRPC's, the
// mailbox's) give up at the deadline, before the context's timer fires, and errors.Is(err,
// context.DeadlineExceeded) then read false for 14 of 20 calls ended so.
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// endedByDeadline reports an error a call gets when its context ends: gRPC's DEADLINE_EXCEEDED or CANCELLED, or
// the fast socket's own deadline.
func endedByDeadline(err error) bool {
	switch Code(err) {
	case codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}

func (c *Client) generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// Recover waits (until ctx ends) for the agent to answer again and re-registers every region this client
// registered from its own memory, then every layout over them (their ids change in place). Pool slices, and
// layouts over one or over a region deregistered since, are dropped: their calls fail with ErrLost. An error
// says what could not be registered; calling Recover again tries that again.
func (c *Client) Recover(ctx context.Context) error {
	if c.closed.Load() {
		return fmt.Errorf("recovering: %w", ErrClosed)
	}
	// Goroutines that share the client may all call it: one recovers at a time, and one that finds the session
	// it holds to be the agent's current one has nothing to register.
	c.recoverMu.Lock()
	defer c.recoverMu.Unlock()
	// An agent that is still stopping or just starting can drop the first connection (EOF, reset): keep asking
	// until ctx ends.
	var info *agentv1.GetInfoResponse
	for {
		var err error
		info, err = c.api.GetInfo(ctx, &agentv1.GetInfoRequest{ApiVersions: []string{"v1"}}, grpc.WaitForReady(true))
		if err == nil {
			break
		}
		if Code(err) != codes.Unavailable || ctx.Err() != nil {
			return c.wrap(ctx, "recovering: reaching the agent", c.dials.Load(), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("recovering: reaching the agent: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	c.mu.Lock()
	// Regions belong to a session (a connection) of one agent instance: those registered under another dial
	// generation than this one are registered again below.
	c.info = info
	c.gen = c.dials.Load()
	c.nameSessionOf(info) // the regions registered below go into this session
	regs := make([]*Region, 0, len(c.regions))
	for r := range c.regions {
		regs = append(regs, r)
	}
	lays := make([]*Layout, 0, len(c.layouts))
	for l := range c.layouts {
		lays = append(lays, l)
	}
	c.mu.Unlock()
	var errs []error
	if !c.noFast {
		if err := c.openFast(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range regs {
		// Registered in the session the agent holds (at Dial, or by an earlier Recover of this session):
		// registering it again would hold it twice. A pool slice marked lost stays lost. A region an earlier
		// Recover of this session failed to register is tried again.
		if _, err := r.current(); err == nil || errors.Is(err, ErrLost) {
			continue
		}
		if r.keep == nil && r.gpu == nil {
			r.mu.Lock()
			r.lost = true
			r.mu.Unlock()
			c.forget(r)
			continue
		}
		gen := c.generation()
		if err := c.register(ctx, r); err != nil {
			r.failedRecover(gen, err)
			errs = append(errs, fmt.Errorf("re-registering region %q: %w", r.segment, err))
		}
	}
	for _, l := range lays {
		if err := c.registerLayoutAgain(ctx, l); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Code returns the gRPC code of an error from this package (codes.OK for nil). A call whose context ended before
// the agent answered reads Canceled or DeadlineExceeded, whether or not its request had left; ErrSessionLost reads
// Aborted and ErrLost NotFound, whatever gRPC said under them.
func Code(err error) codes.Code {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if st, ok := status.FromError(e); ok {
			return st.Code()
		}
	}
	switch {
	case errors.Is(err, ErrClosed):
		return codes.Canceled // as gRPC's own call on a closed connection
	case errors.Is(err, fdpass.ErrNotMemory):
		return codes.InvalidArgument // refused on the fd socket, which speaks no gRPC
	case errors.Is(err, fdpass.ErrExhausted):
		return codes.ResourceExhausted
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, ErrSessionLost):
		return codes.Aborted // as the agent's refusal of a call that names a session it does not have
	case errors.Is(err, ErrLost):
		return codes.NotFound // as the agent's answer for a transfer id it never handed out
	}
	return status.Code(err)
}

// SharedMemory is host memory an agent can map: a memfd and this process's mapping of it.
type SharedMemory struct {
	File  *os.File
	Bytes []byte
}

// NewSharedMemory creates size bytes of shared memory (memfd_create; Size reports size), sealed against
// shrinking (F_SEAL_SHRINK) as the agent requires. Its pages are allocated now, charged to this process.
func NewSharedMemory(name string, size uint64) (*SharedMemory, error) {
	if size == 0 {
		return nil, errors.New("creating shared memory: size must be positive")
	}
	f, err := newSealedMemfd(name, size) // sealed against shrinking, as the agent requires
	if err != nil {
		return nil, err
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("mapping shared memory %q: %w", name, err)
	}
	return &SharedMemory{File: f, Bytes: b}, nil
}

// Size is the mapping's length.
func (m *SharedMemory) Size() uint64 { return uint64(len(m.Bytes)) }

// Close unmaps and closes the memory.
func (m *SharedMemory) Close() error {
	err := unix.Munmap(m.Bytes)
	return errors.Join(err, m.File.Close())
}

// Back-off of fd-socket refusals that free up by themselves (fdpass.ErrExhausted).
const (
	putRetries    = 10
	putFirstDelay = 2 * time.Millisecond
	putMaxDelay   = 250 * time.Millisecond
)

// putFD hands f to the agent's fd socket and returns the token. A refusal that frees up by itself (descriptors
// already waiting for this caller, or the socket's connection limits) is retried after a jittered,
// exponentially growing pause, at most putRetries times and never past ctx's deadline; the last one is
// returned as ResourceExhausted.
func (c *Client) putFD(ctx context.Context, f *os.File) (string, error) {
	return c.putFDs(ctx, []*os.File{f})
}

// putFDs is putFD for 1 to fdpass.MaxPutFDs files, named in order by one token.
func (c *Client) putFDs(ctx context.Context, files []*os.File) (string, error) {
	delay := putFirstDelay
	for attempt := 0; ; attempt++ {
		var token string
		var err error
		if len(files) == 1 {
			token, err = fdpass.Put(ctx, c.fdSocket(), files[0])
		} else {
			token, err = fdpass.PutMany(ctx, c.fdSocket(), files)
		}
		if err == nil || !errors.Is(err, fdpass.ErrExhausted) {
			return token, notBesideAgentSocket(c.fdSocket(), "descriptor", "", err)
		}
		exhausted := fmt.Errorf("%w (%w; %d attempts)", status.Error(codes.ResourceExhausted, err.Error()), err, attempt+1)
		pause := delay/2 + rand.N(delay)
		if deadline, ok := ctx.Deadline(); attempt >= putRetries || ok && time.Until(deadline) < pause {
			return "", exhausted
		}
		select {
		case <-ctx.Done():
			return "", exhausted
		case <-time.After(pause):
		}
		delay = min(2*delay, putMaxDelay)
	}
}
