// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/poollend"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/agent/server/transfers"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// APIVersion is the sidecar API version this server speaks.
const APIVersion = "v1"

// Socket file names inside <socket dir>/<pool>/.
const (
	SocketName   = "agent.sock"
	FDSocketName = "agent.fd.sock"
)

// Engine is what the server needs from the transfer layer: the composite engine.
type Engine interface {
	engines.Engine
	Explain(src, dst engines.MemoryID) (engines.Explanation, error)
}

// SegmentResolver finds named segments and published layouts on other nodes of the pool and confirms the
// descriptors callers hand this agent (agent/peers); its consumer, the transfer service, declares it.
type SegmentResolver = transfers.SegmentResolver

// Limits bound what one caller (one pod) may hold.
type Limits struct {
	MaxRegions          int
	MaxRegisteredBytes  uint64
	MaxInFlight         int
	MaxItemsPerTransfer int
	// MaxInFlightBytes bounds the bytes of one caller's transfers in flight at once (0: DefaultMaxInFlightBytes).
	MaxInFlightBytes uint64
}

// DefaultMaxInFlightBytes is the in-flight byte limit when Limits sets none: a few whole KV caches at once.
const DefaultMaxInFlightBytes = 256 << 30

// DefaultLimits are generous for one inference pod and still bound a runaway one.
var DefaultLimits = Limits{MaxRegions: 4096, MaxRegisteredBytes: 1 << 40, MaxInFlight: 1024, MaxItemsPerTransfer: 65536}

// GPUInfo is one GPU of this node, as detection found it.
type GPUInfo = regiontable.GPU

// EngineStatus is one engine's availability on this node, as detection found it.
type EngineStatus struct {
	Name      string
	Available bool
	Reason    string
}

// Options configure a Server.
type Options struct {
	// SocketDir is the pool's host socket directory (TransferPool spec.socketDir); the sockets live in
	// SocketDir/PoolName/.
	SocketDir     string
	PoolNamespace string
	PoolName      string
	NodeName      string
	AgentVersion  string
	// PeerEndpoint is this agent's agent-to-agent address (host:port), written into descriptors.
	PeerEndpoint string

	Engine  Engine
	Engines []EngineStatus
	// GPUs are this node's GPUs; GPU memory is registered against them.
	GPUs []GPUInfo
	// FabricDomainOf, when set, is a GPU's fabric domain key now (declared vPODs change while the agent
	// runs), read at each registration in place of GPUInfo.FabricDomain; ok false leaves that.
	FabricDomainOf func(gpu int) (domain string, ok bool)

	Identifier identity.Identifier
	Policy     identity.NamespacePolicy
	Limits     Limits
	// Peers resolves segments on other nodes; nil limits segments to this node.
	Peers SegmentResolver
	// Pool lends pool memory; nil answers AllocateFromPool with Unavailable.
	Pool poolmem.Allocator

	// SocketGID, when >= 0, is the group given the socket directory (mode 0750) and the sockets (mode 0660), so
	// pods running under that group may connect. -1 leaves the agent's group (directory 0755).
	SocketGID int
	// TokenTTL is how long an fd token stays valid (default 30 s).
	TokenTTL time.Duration
	// SessionGrace bounds how long the regions of a gone caller wait for in-flight transfers (default 30 s).
	SessionGrace time.Duration
	// FastSpin is how long a fast-socket connection polls for the next request before sleeping (default
	// 2 ms; negative never polls). It keeps a caller's next transfer off the wake-up path, which costs 50-110 µs
	// on a virtual machine whose idle cores have gone to sleep.
	FastSpin time.Duration
	// FastSpinners bounds the fast connections polling at once, and so the cores the agent keeps busy for
	// latency (default DefaultFastSpinners); the others sleep until their next request.
	FastSpinners int
	// FastReplyTimeout bounds how long a reply on the fast socket may wait for its caller to read (default
	// 10 s): a caller that stops reading its replies loses that fast connection, not a goroutine of the agent.
	FastReplyTimeout time.Duration
	// FinishedRetention is how long settled transfers stay visible to Wait (default 2 min).
	FinishedRetention time.Duration
	Logger            *slog.Logger
}

// Server is the sidecar socket server of one pool on one node.
type Server struct {
	agentv1.UnimplementedAgentServer
	opts Options
	// instance names this agent process to clients (GetInfo): its epoch, which every id it hands out carries.
	instance string
	// answered is the trailer of the Unavailable statuses the agent answers itself (AnsweredHeader).
	answered metadata.MD
	// revoker starts the loop that ends sessions the pool no longer admits, with the first session.
	revoker sync.Once
	log     *slog.Logger
	metrics *serverMetrics

	grpc   *grpc.Server
	ln     *net.UnixListener
	fdLn   *net.UnixListener
	tokens *fdsocket.Tokens
	fast   fastTokens
	// spinners bounds the fast connections polling for their next request at once.
	spinners *sockio.SpinBudget
	fastLn   *net.UnixListener
	wg       sync.WaitGroup

	// stopping is closed when shutdown begins, ending the streams (Watch, Notifications) that would otherwise
	// hold a graceful stop open.
	stopping chan struct{}

	// table holds the callers' regions and layouts; its lock is the server's one lock, which also guards the
	// sessions below and the transfers of xfer.
	table       *regiontable.Table
	xfer        *transfers.Service
	pool        *poollend.Lender
	nextSession uint64
	sessions    map[uint64]*session
	// conns counts the agent.sock connections each holder keeps, streams the calls it has open on them.
	conns   connCounts
	streams streamCounts
}

// New checks the options and prepares a server; Serve opens the sockets.
func New(opts Options) (*Server, error) {
	switch {
	case opts.SocketDir == "":
		return nil, errors.New("agent server: socket directory required")
	case opts.PoolName == "" || opts.PoolNamespace == "":
		return nil, errors.New("agent server: pool namespace and name required")
	case opts.NodeName == "":
		return nil, errors.New("agent server: node name required")
	case opts.Engine == nil:
		return nil, errors.New("agent server: engine required")
	}
	if opts.Policy == nil {
		opts.Policy = identity.StaticPolicy(nil)
	}
	if opts.Limits == (Limits{}) {
		opts.Limits = DefaultLimits
	}
	if opts.Limits.MaxInFlightBytes == 0 {
		opts.Limits.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if opts.TokenTTL <= 0 {
		opts.TokenTTL = 30 * time.Second
	}
	if opts.SessionGrace <= 0 {
		opts.SessionGrace = 30 * time.Second
	}
	if opts.FastSpin == 0 {
		opts.FastSpin = DefaultFastSpin
	}
	if opts.FastSpinners <= 0 {
		opts.FastSpinners = DefaultFastSpinners()
	}
	if opts.FastReplyTimeout <= 0 {
		opts.FastReplyTimeout = 10 * time.Second
	}
	if opts.FinishedRetention <= 0 {
		opts.FinishedRetention = 2 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("agent server: %w", err)
	}
	// Region, layout and transfer ids carry a random epoch in their high 32 bits, so an id from a previous agent
	// instance never names a new region, layout or transfer.
	epoch := uint64(binary.BigEndian.Uint32(b[:])|1) << 32
	metrics := newServerMetrics()
	tokens := fdsocket.NewTokens(opts.TokenTTL, 64)
	table := regiontable.New(regiontable.Config{Node: opts.NodeName, PoolNamespace: opts.PoolNamespace, PoolName: opts.PoolName,
		PeerEndpoint: opts.PeerEndpoint,
		// The epoch is or'ed into region and layout ids.
		Epoch:  epoch,
		Engine: opts.Engine, Limits: regiontable.Limits{MaxRegions: opts.Limits.MaxRegions, MaxRegisteredBytes: opts.Limits.MaxRegisteredBytes},
		Tokens: tokens, GPUs: opts.GPUs, FabricDomainOf: opts.FabricDomainOf, Refusals: metrics.Counters})
	stopping := make(chan struct{})
	notes := make([]transfers.EngineNote, len(opts.Engines))
	for i, e := range opts.Engines {
		notes[i] = transfers.EngineNote{Name: e.Name, Reason: e.Reason}
	}
	cfg := transfers.Config{Table: table, Engine: opts.Engine, Node: opts.NodeName, Peers: opts.Peers, Engines: notes,
		Limits: transfers.Limits{MaxInFlight: opts.Limits.MaxInFlight, MaxItemsPerTransfer: opts.Limits.MaxItemsPerTransfer,
			MaxInFlightBytes: opts.Limits.MaxInFlightBytes},
		SessionGrace: opts.SessionGrace, FinishedRetention: opts.FinishedRetention, Stopping: stopping, Refusals: metrics.Counters,
		Epoch: epoch, Logger: opts.Logger}
	s := &Server{metrics: metrics, opts: opts, log: opts.Logger, tokens: tokens, stopping: stopping, instance: fmt.Sprintf("%08x", epoch>>32),
		table: table, xfer: transfers.New(cfg), sessions: map[uint64]*session{},
		conns: connCounts{told: map[string]bool{}},
		pool:  poollend.New(poollend.Config{Pool: opts.Pool, Table: table, Tokens: tokens, GPUs: opts.GPUs, Refusals: metrics.Counters}),
		fast:  fastTokens{entries: map[string]fastToken{}}, spinners: sockio.NewSpinBudget(opts.FastSpinners),
	}
	s.answered = metadata.Pairs(AnsweredHeader, s.instance)
	opts.Engine.SetNotifyHandler(s.xfer.DeliverNotification)
	return s, nil
}

// SocketPath is where the agent socket lives.
func (s *Server) SocketPath() string {
	return filepath.Join(s.opts.SocketDir, s.opts.PoolName, SocketName)
}

// FDSocketPath is where the fd socket lives.
func (s *Server) FDSocketPath() string {
	return filepath.Join(s.opts.SocketDir, s.opts.PoolName, FDSocketName)
}

// FastSocketPath is where the fast socket lives.
func (s *Server) FastSocketPath() string {
	return filepath.Join(s.opts.SocketDir, s.opts.PoolName, FastSocketName)
}

// Serve opens the sockets and serves until ctx ends, then stops (in-flight calls get a bounded grace),
// ends every session and removes the sockets.
func (s *Server) Serve(ctx context.Context) error {
	if err := s.prepareSocketDir(); err != nil {
		return err
	}
	ln, err := s.listen(s.SocketPath())
	if err != nil {
		return err
	}
	fastLn, err := s.listen(s.FastSocketPath())
	if err != nil {
		closeSocket(ln, s.SocketPath())
		return err
	}
	// The fd socket is created last: its presence tells callers (and tests) that every socket is up.
	fdLn, err := s.listen(s.FDSocketPath())
	if err != nil {
		closeSocket(ln, s.SocketPath())
		closeSocket(fastLn, s.FastSocketPath())
		return err
	}
	s.ln, s.fdLn, s.fastLn = ln, fdLn, fastLn
	s.grpc = grpc.NewServer(
		grpc.Creds(peerCreds{srv: s}),
		// A connection that does not finish its HTTP/2 preface in time is dropped before it holds a session.
		grpc.ConnectionTimeout(10*time.Second),
		// Reused handler goroutines instead of one new goroutine per call: small transfers are latency-bound.
		grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0))),
		// Calls are counted per holder before a request's bytes are read (streamTap); a connection takes at most
		// maxStreamsPerConn at once, so a client past it waits rather than fails.
		grpc.InTapHandle(s.streamTap),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		// gRPC's own bound is 16 MiB a header block, held before any call (and any limit of ours) exists: 128
		// connections of one process sending one each, never finished, held 2 GiB of the agent's memory.
		grpc.MaxHeaderListSize(sockio.MaxHeaderListBytes),
		grpc.ChainUnaryInterceptor(s.unaryAuth),
		grpc.ChainStreamInterceptor(s.streamAuth),
	)
	agentv1.RegisterAgentServer(s.grpc, s)

	fds := fdsocket.NewSocket(fdLn, s.tokens, s.identifyConn, s.opts.Identifier.HolderOf, s.metrics.Edge)
	go fds.Serve(ctx)
	go s.serveFast(ctx, fastLn)
	go s.sweep(ctx)
	serveErr := make(chan error, 1)
	go func() {
		serveErr <- s.grpc.Serve(&trackedListener{UnixListener: ln, onClose: s.connClosed})
	}()
	s.log.Info("serving", "socket", s.SocketPath(), "fdSocket", s.FDSocketPath())

	var err2 error
	select {
	case <-ctx.Done():
	case err2 = <-serveErr:
	}
	s.shutdown()
	if err2 != nil && !errors.Is(err2, grpc.ErrServerStopped) {
		return fmt.Errorf("serving %s: %w", s.SocketPath(), err2)
	}
	return nil
}

// prepareSocketDir creates the pool's socket directory and gives it its owner group and mode on every start, so a
// directory left by an agent with another --socket-gid follows the current one. With a group the directory is
// 0750 and that group's: its members traverse it to the 0660 sockets, everyone else is stopped at the directory
// already. Without one it is 0755 in the agent's own group, as it always was: the sockets' 0660 admits root only.
func (s *Server) prepareSocketDir() error {
	dir := filepath.Dir(s.SocketPath())
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating socket directory %s: %w", dir, err)
	}
	gid, mode := os.Getegid(), os.FileMode(0o755)
	if s.opts.SocketGID >= 0 {
		gid, mode = s.opts.SocketGID, 0o750
	}
	// Group first, then mode: a directory that is briefly the new group's with the old mode admits no one who
	// was not admitted before or is not admitted after.
	if err := os.Chown(dir, -1, gid); err != nil {
		if s.opts.SocketGID < 0 {
			// Not a group the caller asked for: the directory is another user's (an agent run earlier as root).
			return fmt.Errorf("taking socket directory %s, which another user owns (an agent run earlier as root?), for this agent (uid %d): %w", dir, os.Geteuid(), err)
		}
		return fmt.Errorf("giving socket directory %s to group %d: %w", dir, gid, err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("setting mode %v on socket directory %s: %w", mode, dir, err)
	}
	return nil
}

// listen binds path's socket in a private directory beside it, gives it its mode (and group) there, and only then
// links it at path. bind gives a socket the mode the umask leaves; bound at path, it would be reachable with that
// mode until the chmod, and under umask 0 by anyone. The private directory (0700) admits no one but the agent
// until the socket is linked with its final mode, so a socket at path is always ready and always 0660: callers
// and tests may take its presence as the sign. A link, not a rename: a socket another agent put at path meanwhile
// is not replaced. The listener does not unlink on close, as its bound name is gone; shutdown removes path.
func (s *Server) listen(path string) (*net.UnixListener, error) {
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".b")
	if err != nil {
		return nil, fmt.Errorf("creating a private directory to bind %s in: %w", path, err)
	}
	defer os.RemoveAll(private)
	bound := filepath.Join(private, "s") // short: a socket's path has at most 107 bytes
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: bound, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		ln.Close()
		return nil, err
	}
	if err := os.Chmod(bound, 0o660); err != nil {
		return fail(fmt.Errorf("setting mode 0660 on %s: %w", path, err))
	}
	if s.opts.SocketGID >= 0 {
		if err := os.Chown(bound, -1, s.opts.SocketGID); err != nil {
			return fail(fmt.Errorf("giving %s to group %d: %w", path, s.opts.SocketGID, err))
		}
	}
	if err := os.Link(bound, path); err != nil {
		return fail(fmt.Errorf("publishing the socket at %s: %w", path, err))
	}
	return ln, nil
}

// closeSocket closes a listener that listen returned and removes its path.
func closeSocket(ln *net.UnixListener, path string) {
	ln.Close()
	os.Remove(path)
}

// removeStaleSocket deletes a socket left by an agent that died, and refuses to steal one that is served.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket; not touching it", path)
	}
	if c, err := net.DialTimeout("unix", path, 200*time.Millisecond); err == nil {
		c.Close()
		return fmt.Errorf("%s is served by another process (a second agent for this pool?)", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}

func (s *Server) shutdown() {
	close(s.stopping)
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop() // streams (Watch, Notifications) never end on their own
	}
	closeSocket(s.fdLn, s.FDSocketPath())
	closeSocket(s.fastLn, s.FastSocketPath())
	closeSocket(s.ln, s.SocketPath())
	s.table.Lock()
	var live []*session
	for _, sess := range s.sessions {
		live = append(live, sess)
	}
	s.table.Unlock()
	for _, sess := range live {
		sess.endedOnce.Do(func() { s.endSession(sess) })
	}
	s.wg.Wait()
	s.tokens.CloseAll()
	s.log.Info("stopped", "socket", s.SocketPath())
}

func (s *Server) sweep(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.tokens.Sweep(now)
		}
	}
}
