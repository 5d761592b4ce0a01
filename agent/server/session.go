// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/poollend"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// A session is one client connection. Regions and pool slices belong to the session that created them and go
// away with it; visibility and limits are per caller (Caller.Key), shared by a pod's connections.
type session struct {
	regiontable.Session
	identErr  error
	allocs    poollend.Loans
	endedOnce sync.Once
	// ended is closed once endSession released what the session held; endedByCaller is set by EndSession, after
	// which the connection's other calls are refused.
	ended         chan struct{}
	endedByCaller atomic.Bool
	// fastConns are fast-socket connections bound to the session; closed when it ends.
	fastConns []net.Conn
	// tokensGone is set, under the fast socket's lock, once the ended session's unused tokens were dropped: an
	// OpenFastPath that raced its end gets none.
	tokensGone bool
	// conn is the session's gRPC connection, closed to end a revoked session; holder is whom it is counted
	// against (connCounts).
	conn   net.Conn
	holder string
	// revoked, once set, is why the caller lost its admission (its namespace left allowedNamespaces): every
	// later call is refused with it.
	revoked atomic.Pointer[string]
}

// sessionInfo is the gRPC AuthInfo a connection carries; handlers find their session through it.
type sessionInfo struct {
	credentials.CommonAuthInfo
	s *session
}

func (sessionInfo) AuthType() string { return "fabricxfer-peercred" }

// trackedListener hands out connections that report their end, so the server can clean a session up even when
// the client vanishes without a word.
type trackedListener struct {
	*net.UnixListener
	onClose func(c *trackedConn)
}

type trackedConn struct {
	*net.UnixConn
	once    sync.Once
	onClose func(c *trackedConn)
	sess    *session
}

func (l *trackedListener) Accept() (net.Conn, error) {
	c, err := l.UnixListener.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return &trackedConn{UnixConn: c, onClose: l.onClose}, nil
}

func (c *trackedConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(func() { c.onClose(c) })
	return err
}

// peerCreds are transport credentials that identify the caller at connection time. Identification failures are
// not handshake failures: the connection is kept so every call can answer PermissionDenied with the reason,
// instead of the client seeing an unexplained closed connection.
type peerCreds struct {
	srv *Server
}

func (p peerCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := raw.(*trackedConn)
	if !ok {
		return nil, nil, fmt.Errorf("connection of type %T is not a Unix socket connection", raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := p.srv.newSession(ctx, tc.UnixConn)
	if err != nil {
		return nil, nil, err // gRPC closes the connection
	}
	s.conn = tc
	tc.sess = s
	return raw, sessionInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, s: s}, nil
}

func (peerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, fmt.Errorf("peer credentials are server-side only")
}
func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "fabricxfer-peercred"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }

// identifyConn identifies the process behind a Unix connection (used by the gRPC and the fd socket).
func (s *Server) identifyConn(ctx context.Context, conn *net.UnixConn) (identity.Caller, error) {
	c, err := s.opts.Identifier.IdentifyConn(ctx, conn)
	if err != nil {
		return identity.Caller{}, err
	}
	if err := s.admit(ctx, c); err != nil {
		return identity.Caller{}, err
	}
	return c, nil
}

// admit applies the pool's allowedNamespaces to a caller.
func (s *Server) admit(ctx context.Context, c identity.Caller) error {
	if c.Local {
		return nil // only present when the agent admits local callers
	}
	if err := identity.Admit(ctx, s.opts.Policy, s.opts.PoolNamespace, s.opts.PoolName, c.Namespace); err != nil {
		return fmt.Errorf("%s: %w", c, err)
	}
	return nil
}

func (s *Server) newSession(ctx context.Context, conn *net.UnixConn) (*session, error) {
	caller, err := s.identifyConn(ctx, conn)
	holder := caller.Key
	if err != nil {
		holder = s.refusedHolder(conn)
	}
	s.table.Lock()
	defer s.table.Unlock()
	if refusal := s.conns.enter(holder, connLimits()); refusal != "" {
		s.metrics.Edge.Refused("grpc", "connections")
		// Once until the holder is under its limit again, so a flood writes one line (and no more than 1024 holders
		// are remembered: one refused by the total holds no connection that would forget it).
		if !s.conns.told[holder] && len(s.conns.told) < 1024 {
			s.conns.told[holder] = true
			s.log.Info("closing new connections to the socket", "reason", refusal)
		}
		return nil, errors.New(refusal)
	}
	s.nextSession++
	sess := &session{Session: regiontable.Session{ID: s.nextSession, Caller: caller, Regions: map[uint64]*regiontable.Region{}},
		identErr: err, allocs: poollend.Loans{}, holder: holder, ended: make(chan struct{})}
	s.sessions[sess.ID] = sess
	if err != nil {
		s.log.Info("refused a caller", "error", err)
	}
	s.startRevoker()
	return sess, nil
}

// Connections to agent.sock that one holder may keep. Each is a gRPC transport (about 50 KiB of buffers and three
// goroutines) that the agent keeps for as long as the process idles, so without a bound one process could hold
// the agent's memory or descriptors. A caller (a pod, or a local uid) may keep 128, more than the processes of any
// inference pod open; a process that was refused (its connection stays so every call can say why) 16 per pod (or
// uid, outside pods), and refused processes 256 in all.
func connLimits() holderLimits {
	return holderLimits{what: "connections to", perCaller: 128, perRefused: 16, refused: 256,
		hint: "close clients it no longer uses"}
}

// Calls (gRPC streams) one holder may have open on agent.sock at once, over all its connections. A call's request
// is buffered by gRPC as it arrives, up to 4 MiB, before any handler runs, and a Watch or Notifications stream
// lives as long as its caller likes, so without a bound one connection held the agent's memory. A caller may
// have 128 open (512 MiB of requests at most); a refused process, whose calls only learn why, 4 per pod (or uid)
// and 64 in all.
func streamLimits() holderLimits {
	return holderLimits{what: "calls open on", perCaller: 128, perRefused: 4, refused: 64,
		hint: "end Watch or Notifications streams it no longer reads"}
}

// maxStreamsPerConn is how many calls one connection takes at once (HTTP/2's stream limit): a quarter of a
// caller's, so one process's busy connection (its clients queue past it) leaves room for the pod's others.
const maxStreamsPerConn = 32

// refusedHolderPrefix starts the holder of a refused connection.
const refusedHolderPrefix = "refused/"

// holderLimits bound what holders have open on agent.sock: a caller's per caller, refused processes' per pod
// (or uid) and in all.
type holderLimits struct {
	what                           string
	perCaller, perRefused, refused int
	hint                           string
}

// holderCounts count what holders have open on agent.sock, against holderLimits. The caller locks them.
type holderCounts struct {
	callers sockio.Counts[string]
	refused sockio.Counts[string]
}

// enter counts one more of holder's, or says which limit refuses it.
func (c *holderCounts) enter(holder string, l holderLimits) string {
	if strings.HasPrefix(holder, refusedHolderPrefix) {
		total, mine, ok := c.refused.Enter(holder, l.refused, l.perRefused)
		switch {
		case ok:
			return ""
		case mine >= l.perRefused:
			return fmt.Sprintf("%s has %d %s the agent's socket (limit %d for a refused process)", holder, mine, l.what, l.perRefused)
		}
		return fmt.Sprintf("refused processes have %d %s the agent's socket (limit %d)", total, l.what, l.refused)
	}
	if _, mine, ok := c.callers.Enter(holder, math.MaxInt, l.perCaller); !ok {
		return fmt.Sprintf("caller %s has %d %s the agent's socket (limit %d): %s", holder, mine, l.what, l.perCaller, l.hint)
	}
	return ""
}

// leave uncounts one of holder's.
func (c *holderCounts) leave(holder string) {
	if strings.HasPrefix(holder, refusedHolderPrefix) {
		c.refused.Leave(holder)
	} else {
		c.callers.Leave(holder)
	}
}

// connCounts are the agent.sock connections held, under the table's lock.
type connCounts struct {
	holderCounts
	// told marks holders whose refusal was logged since they were last under their limit.
	told map[string]bool
}

// streamCounts are the calls open on agent.sock. Its own lock: gRPC asks streamTap with its transport's lock
// held.
type streamCounts struct {
	mu sync.Mutex
	holderCounts
}

// streamTap counts a new call of its connection's holder before gRPC reads its request, or refuses it
// (RESOURCE_EXHAUSTED) when the holder has its limit open; the count drops when the call's context ends.
func (s *Server) streamTap(ctx context.Context, _ *tap.Info) (context.Context, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx, nil
	}
	si, ok := p.AuthInfo.(sessionInfo)
	if !ok || si.s == nil {
		return ctx, nil
	}
	holder, c := si.s.holder, &s.streams
	c.mu.Lock()
	refusal := c.enter(holder, streamLimits())
	c.mu.Unlock()
	if refusal != "" {
		s.metrics.Edge.Refused("grpc", "streams")
		return nil, status.Error(codes.ResourceExhausted, refusal)
	}
	context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.leave(holder)
		c.mu.Unlock()
	})
	return ctx, nil
}

// refusedHolder is whom a refused connection is counted against: its pod, or the uid of a process in none
// (identity.Identifier.HolderOf), among the refused.
func (s *Server) refusedHolder(conn *net.UnixConn) string {
	cred, err := identity.PeerCredOf(conn)
	if err != nil {
		return refusedHolderPrefix + "unknown"
	}
	return refusedHolderPrefix + s.opts.Identifier.HolderOf(conn, cred)
}

// revokeInterval is how often held sessions are checked against the pool's allowedNamespaces. With the
// policy's cache (APIPoolPolicy, 5 s by default) a session whose namespace was removed ends within 10 s.
const revokeInterval = 2 * time.Second

// startRevoker starts the server's revocation loop, once: with its first session, until the server stops.
func (s *Server) startRevoker() {
	s.revoker.Do(func() { go s.revokeLoop() })
}

func (s *Server) revokeLoop() {
	t := time.NewTicker(revokeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-t.C:
			s.revokeDisallowed()
		}
	}
}

// revokeDisallowed ends the sessions of callers whose namespace the pool no longer allows, through the path
// a closed connection takes: the connection is closed, the session's regions are deregistered (cancelling
// their transfers) and its pool slices, fast connections and streams end. Descriptors waiting on the fd
// socket for such a caller are closed. When the policy cannot be read, held sessions are kept.
func (s *Server) revokeDisallowed() {
	s.table.Lock()
	var held []*session
	for _, sess := range s.sessions {
		if sess.identErr == nil && !sess.Caller.Local && !sess.Ended && sess.revoked.Load() == nil {
			held = append(held, sess)
		}
	}
	s.table.Unlock()
	if len(held) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), revokeInterval)
	defer cancel()
	allowed, err := s.opts.Policy.AllowedNamespaces(ctx)
	if err != nil {
		s.log.Warn("cannot read allowedNamespaces; held sessions are kept", "error", err)
		return
	}
	for _, sess := range held {
		if identity.NamespaceAllowed(s.opts.PoolNamespace, allowed, sess.Caller.Namespace) {
			continue
		}
		why := fmt.Sprintf("%s: namespace %q was removed from the allowed namespaces of pool %s/%s; its session ended",
			sess.Caller, sess.Caller.Namespace, s.opts.PoolNamespace, s.opts.PoolName)
		sess.revoked.Store(&why)
		s.metrics.Edge.Refused("grpc", "revoked")
		s.log.Info("revoked a caller", "caller", sess.Caller.String(), "namespace", sess.Caller.Namespace)
		s.tokens.DropOwner(sess.Caller.Key)
		if sess.conn != nil {
			sess.conn.Close() // connClosed ends the session
		} else {
			sess.endedOnce.Do(func() { s.endSession(sess) })
		}
	}
}

// sessionOf returns the caller's session or a PermissionDenied status explaining why it has none.
func (s *Server) sessionOf(ctx context.Context) (*session, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no connection information on the call")
	}
	info, ok := p.AuthInfo.(sessionInfo)
	if !ok {
		return nil, status.Error(codes.Internal, "connection was not identified")
	}
	if info.s.identErr != nil {
		return nil, status.Error(codes.PermissionDenied, info.s.identErr.Error())
	}
	if why := info.s.revoked.Load(); why != nil {
		return nil, status.Error(codes.PermissionDenied, *why)
	}
	return info.s, nil
}

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := s.admitCall(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	ctx, cancel := answerBefore(ctx)
	defer cancel()
	resp, err := h(ctx, req)
	if s.answeredItself(err) {
		_ = grpc.SetTrailer(ctx, s.answered)
	}
	return resp, err
}

// answerBefore ends what the agent does for a gRPC call a twentieth of the call's time (at most 50 ms) before its
// caller's deadline, so that the agent's own answer, saying what ran out (a peer that did not answer), reaches the
// caller before gRPC's deadline does: with the same deadline on both sides the caller's fired first, and it read
// as an agent that did not answer (a layout lookup towards a stalled peer), or as a failure of a call that had
// done what it asked (a layout deregistered while its askers were told, past the caller's deadline). Half the
// margin the clients leave a waited transfer's own timeout (a tenth, at most 100 ms), so that timeout fires first
// and the caller hears the transfer's failure, not a call cut short with the transfer still running.
func answerBefore(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, deadline.Add(-min(time.Until(deadline)/20, 50*time.Millisecond)))
}

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := s.admitCall(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	err := h(srv, ss)
	if s.answeredItself(err) {
		ss.SetTrailer(s.answered)
	}
	return err
}

// answeredItself reports whether err is an Unavailable status to mark with AnsweredHeader: not while the agent
// stops, whose Unavailable answers do end the caller's session.
func (s *Server) answeredItself(err error) bool {
	if status.Code(err) != codes.Unavailable {
		return false
	}
	select {
	case <-s.stopping:
		return false
	default:
		return true
	}
}

// AnsweredHeader marks the Unavailable statuses the agent answers itself (fastwire.AnsweredHeader).
const AnsweredHeader = fastwire.AnsweredHeader

// admitCall refuses a call whose connection is not an admitted session, or that names another session, or whose
// session its caller ended (EndSession, which may be asked again).
func (s *Server) admitCall(ctx context.Context, method string) error {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return err
	}
	if sess.endedByCaller.Load() && !strings.HasSuffix(method, "/EndSession") {
		return status.Error(codes.FailedPrecondition, "this connection's session was ended by its caller (EndSession): connect again")
	}
	return s.sameSession(ctx, sess, method)
}

// SessionHeader names the session a call is made in (fastwire.SessionHeader).
const SessionHeader = fastwire.SessionHeader

// sameSession refuses a call whose SessionHeader names another session than its connection's. GetInfo, which
// tells a client its session, and calls without the header (older clients) pass.
func (s *Server) sameSession(ctx context.Context, sess *session, method string) error {
	if strings.HasSuffix(method, "/GetInfo") {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	names := md.Get(SessionHeader)
	if len(names) == 0 {
		return nil
	}
	if here := s.instance + "/" + strconv.FormatUint(sess.ID, 10); names[0] != here {
		return status.Errorf(codes.Aborted, fastwire.SessionLostPrefix+" the call names session %.64q, this connection is %s (the agent restarted, or the connection was made again): recover and retry", names[0], here)
	}
	return nil
}

// connClosed ends the connection's session in the background: its regions are deregistered once their
// in-flight transfers settle, its pool slices go back.
func (s *Server) connClosed(c *trackedConn) {
	if c.sess == nil {
		return
	}
	s.table.Lock()
	s.conns.leave(c.sess.holder)
	delete(s.conns.told, c.sess.holder)
	s.table.Unlock()
	s.endInBackground(c.sess)
}

// endInBackground ends sess in the background unless that began already; sess.ended tells when it is done.
func (s *Server) endInBackground(sess *session) {
	sess.endedOnce.Do(func() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.endSession(sess)
		}()
	})
}

// endSession releases everything a gone connection held.
func (s *Server) endSession(sess *session) {
	s.table.Lock()
	sess.Ended = true
	for _, c := range sess.fastConns {
		c.Close()
	}
	askers := s.table.DropSessionLayoutsLocked(&sess.Session) // a layout names the session's regions, which go below
	held := len(sess.Regions)
	regs := make([]*regiontable.Region, 0, len(sess.Regions))
	for _, r := range sess.Regions {
		if r.Alloc() == "" { // pool slices go back with their allocation below; read here, under the lock
			regs = append(regs, r)
		}
	}
	allocs := make([]*poollend.Allocation, 0, len(sess.allocs))
	for _, a := range sess.allocs {
		allocs = append(allocs, a)
	}
	s.table.Unlock()
	s.forgetFastTokens(sess)
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.SessionGrace)
	defer cancel()
	s.xfer.TellLayoutGone(ctx, askers)
	for _, r := range regs {
		if err := s.table.RemoveRegion(ctx, r); err != nil {
			s.log.Error("region of a gone caller stays registered", "region", r.ID(), "caller", sess.Caller.Key, "error", err)
		}
	}
	for _, a := range allocs {
		if err := s.pool.ReleaseAllocation(ctx, sess.allocs, a); err != nil {
			s.log.Error("pool slice of a gone caller not released", "allocation", a.ID(), "error", err)
		}
	}
	s.table.Lock()
	delete(s.sessions, sess.ID)
	s.table.Unlock()
	close(sess.ended)
	if sess.identErr == nil {
		s.log.Debug("caller left", "caller", sess.Caller.String(), "regions", held, "allocations", len(allocs))
	}
}
