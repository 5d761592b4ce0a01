// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"runtime/trace"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/agent/server/transfers"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// FastSocketName is the fast socket's name beside the agent socket.
const FastSocketName = "agent.fast.sock"

const (
	// maxFastFrame bounds one frame on the fast socket.
	maxFastFrame = fastwire.MaxRequest
	// maxFastPerCaller and maxFastConns bound bound fast connections per caller and in all, and
	// maxFastTokens the tokens one caller may hold unused: each bound connection can hold a frame in memory. A
	// caller is a pod (outside Kubernetes, a user): an inference pod of 8 GPUs runs a process per GPU and a few
	// more, each with a client, and the ninth of 8 was refused.
	maxFastPerCaller = 32
	maxFastConns     = 1024
	maxFastTokens    = 32
	// maxFastTokensPerSession: a session asking for more unused tokens than this gives up its oldest, so a client
	// interrupted between asking and binding, again and again, cannot take the caller's 32 from every other
	// process of its pod (a client reopens one connection at a time; a few allow a burst).
	maxFastTokensPerSession = 4
	// fastBindTimeout bounds how long a new fast connection may take to present its token.
	fastBindTimeout = 5 * time.Second
	// DefaultFastSpin: a fast connection polls 2 ms for its caller's next request. A caller that sends every
	// few hundred microseconds (copies one after another, a scheduler's loop) never waits for the agent to
	// wake; the price is a busy core per polling connection while callers are active, none when they are quiet.
	DefaultFastSpin = 2 * time.Millisecond
)

// DefaultFastSpinners is how many fast connections may poll at once: two, one on machines of fewer than 16
// cores, where a second polling core would take more from the callers than it gives them.
func DefaultFastSpinners() int {
	return min(2, max(1, runtime.NumCPU()/8))
}

// fastTokens binds fast connections to sessions: a token is one-time, expires, and only the caller that
// asked for it may use it.
type fastTokens struct {
	mu      sync.Mutex
	entries map[string]fastToken
	// unbound counts the connections not bound yet, by holder.
	unbound sockio.Counts[string]
}

type fastToken struct {
	sess    *session
	expires time.Time
}

// OpenFastPath implements agentv1.AgentServer.
func (s *Server) OpenFastPath(ctx context.Context, _ *agentv1.OpenFastPathRequest) (*agentv1.OpenFastPathResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	token, err := fdsocket.NewToken()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	s.fast.mu.Lock()
	if sess.tokensGone {
		s.fast.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "the session ended")
	}
	now := time.Now()
	held, mine, oldest := 0, 0, ""
	for k, e := range s.fast.entries {
		switch {
		case now.After(e.expires):
			delete(s.fast.entries, k)
		case e.sess.Caller.Key == sess.Caller.Key:
			held++
			if e.sess == sess {
				if mine++; oldest == "" || e.expires.Before(s.fast.entries[oldest].expires) {
					oldest = k
				}
			}
		}
	}
	if mine >= maxFastTokensPerSession {
		delete(s.fast.entries, oldest)
		held--
	}
	if held >= maxFastTokens {
		s.fast.mu.Unlock()
		s.metrics.Edge.Refused("fast", "tokens")
		s.metrics.LimitHit(refusals.LimitFastTokens)
		return nil, status.Errorf(codes.ResourceExhausted, "caller holds %d unused fast path tokens (limit %d): bind them or let them expire (%s)", held, maxFastTokens, s.opts.TokenTTL)
	}
	s.fast.entries[token] = fastToken{sess: sess, expires: now.Add(s.opts.TokenTTL)}
	s.fast.mu.Unlock()
	return &agentv1.OpenFastPathResponse{Token: token, Socket: s.FastSocketPath()}, nil
}

// forgetFastTokens drops the unused tokens of a session that ended: they could bind nothing, and counted against
// its caller's limit until they expired.
func (s *Server) forgetFastTokens(sess *session) {
	s.fast.mu.Lock()
	defer s.fast.mu.Unlock()
	sess.tokensGone = true
	for k, e := range s.fast.entries {
		if e.sess == sess {
			delete(s.fast.entries, k)
		}
	}
}

// Connections of the fast socket that are not bound yet, per holder (identity.Identifier.HolderOf: a pod, or
// the uid of a process in none) and in all: each holds a descriptor and a goroutine for up to fastBindTimeout
// before it says anything, and any process that reaches the socket can open them.
const (
	maxUnboundFast          = 256
	maxUnboundFastPerHolder = 64
)

func (s *Server) serveFast(ctx context.Context, ln *net.UnixListener) {
	for {
		conn, err := sockio.Accept(ln.AcceptUnix, func() { s.metrics.Edge.Refused("fast", "accept_emfile") })
		if err != nil {
			return // listener closed on shutdown
		}
		go s.handleFast(ctx, conn)
	}
}

// enterUnbound counts a fast connection of holder until it binds, or says which limit refuses it.
func (s *Server) enterUnbound(holder string) string {
	s.fast.mu.Lock()
	defer s.fast.mu.Unlock()
	switch total, mine, ok := s.fast.unbound.Enter(holder, maxUnboundFast, maxUnboundFastPerHolder); {
	case ok:
		return ""
	case total >= maxUnboundFast:
		return fmt.Sprintf("%d connections wait to bind on the fast socket (limit %d)", total, maxUnboundFast)
	default:
		return fmt.Sprintf("%s has %d connections waiting to bind on the fast socket (limit %d)", holder, mine, maxUnboundFastPerHolder)
	}
}

func (s *Server) handleFast(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	cred, err := identity.PeerCredOf(conn)
	if err != nil {
		s.metrics.Edge.Refused("fast", "no_peercred")
		return
	}
	holder := s.opts.Identifier.HolderOf(conn, cred)
	if why := s.enterUnbound(holder); why != "" {
		s.metrics.Edge.Refused("fast", "busy")
		_ = conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
		_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Error(codes.ResourceExhausted, why)))
		return
	}
	unbound := true
	bound := func() { // once bound (or gone), the connection counts against its caller's fast limits instead
		if unbound {
			unbound = false
			s.fast.mu.Lock()
			s.fast.unbound.Leave(holder)
			s.fast.mu.Unlock()
		}
	}
	defer bound()
	bindBy := time.Now().Add(fastBindTimeout)
	_ = conn.SetDeadline(bindBy)
	token, err := sockio.ReadFrame(conn, 64)
	if err != nil {
		return
	}
	// Identifying may ask the API server (a pod it has not seen): bounded by the bind's deadline, early enough to
	// say why, so a connection that came while the API server stalls ends instead of holding a descriptor.
	ictx, cancel := context.WithDeadline(ctx, bindBy.Add(-fastBindTimeout/20))
	caller, err := s.identifyConn(ictx, conn)
	cancel()
	if err != nil {
		_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Error(codes.PermissionDenied, err.Error())))
		return
	}
	s.fast.mu.Lock()
	e, ok := s.fast.entries[string(token)]
	delete(s.fast.entries, string(token))
	s.fast.mu.Unlock()
	if !ok || time.Now().After(e.expires) || e.sess.Caller.Key != caller.Key {
		_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Error(codes.PermissionDenied, "fast path token is unknown, expired, used or not yours")))
		return
	}
	sess := e.sess
	s.table.Lock()
	if sess.Ended {
		s.table.Unlock()
		_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Error(codes.Unavailable, "the session ended")))
		return
	}
	if refusal := s.fastRoomLocked(sess.Caller.Key); refusal != "" {
		s.table.Unlock()
		s.metrics.Edge.Refused("fast", "busy")
		_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Error(codes.ResourceExhausted, refusal)))
		return
	}
	sess.fastConns = append(sess.fastConns, conn)
	s.table.Unlock()
	defer s.forgetFastConn(sess, conn)
	bound() // counted against the caller from here: uncounted before its caller can see it bound
	if err := fastwire.WriteReply(conn, &agentv1.FastReply{}); err != nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})

	// Requests are served in order on this goroutine: no hand-off between reading, transferring and replying. A
	// caller that closes the connection during a call that lasts ends the connection's context, and with it the
	// call's waited transfer (hangupWatch).
	callCtx, endCalls := context.WithCancelCause(ctx)
	defer endCalls(nil)
	watch := newHangupWatch(conn, func() { endCalls(transfers.ErrCallerGone) })
	defer watch.disarm()
	fc := fastConn{conn: conn, replyTimeout: s.opts.FastReplyTimeout}
	defer fc.arena.Unmap()
	defer fc.mailbox.Unmap()
	in := sockio.FrameReader{R: sockio.SpinReader{Conn: conn, Spin: s.opts.FastSpin, Budget: s.spinners, Doorbell: &fc.mailbox}, Max: maxFastFrame}
	for {
		frame, err := in.Next()
		if errors.Is(err, sockio.ErrRung) || (err == nil && len(frame) == 0 && fc.mailbox.Attached()) {
			// A request in the mailbox, or an empty frame (its doorbell) that may have found it taken already.
			if fc.mailbox.Rung() {
				watch.arm(in.Buffered() == 0, true)
				err := s.serveMailbox(callCtx, sess, &fc)
				watch.disarm()
				if err != nil {
					return
				}
			}
			continue
		}
		trace.Log(callCtx, "fast", "frame read")
		if err != nil {
			if err != io.EOF {
				s.metrics.Edge.Refused("fast", "malformed")
				// On the socket within the reply timeout, as every answer: a caller that stopped reading does not
				// hold this goroutine in the write.
				fc.inMailbox = false
				if out, rerr := fc.reply(nil, status.Errorf(codes.InvalidArgument, "reading a frame: %v", err)); rerr == nil {
					_ = fc.answer(out)
				}
			}
			return
		}
		fc.inMailbox = false
		watch.arm(in.Buffered() == 0, fc.mailbox.Attached())
		resp, serr := s.serveFastFrame(callCtx, sess, &fc, frame)
		watch.disarm()
		if serr != nil && callCtx.Err() != nil {
			// The agent is stopping (the connection's context ends with the server's) and cut the call short: no
			// answer, the connection ends, which clients read as the end of their session and recover from. An
			// Unavailable reply saying "wait for it by id" would send them after an id that dies with this agent.
			return
		}
		out, err := fc.reply(resp, serr)
		if err == nil {
			err = fc.answer(out)
		}
		trace.Log(callCtx, "fast", "replied")
		if err != nil {
			return
		}
	}
}

// fastConn is what a fast connection keeps between frames: the caller's id arena and mailbox, the messages its
// block frames are decoded into and the buffer replies are written into.
type fastConn struct {
	arena   fastwire.IDArena
	mailbox fastwire.Mailbox
	blocks  fastwire.BlocksDecoder
	out     []byte

	// conn and replyTimeout carry replies on the socket; inMailbox says where the frame being served came from.
	conn         *net.UnixConn
	replyTimeout time.Duration
	inMailbox    bool
	// answered says the frame being served was answered already (ReplyEarly), and answerErr how that ended.
	answered  bool
	answerErr error
}

// ReplyEarly implements transfers.Replier for mailbox frames: a waited transfer whose bytes landed is answered
// at once. It may run on another goroutine while the connection's waits for the transfer's end, never beside
// another reply.
func (fc *fastConn) ReplyEarly(resp *agentv1.TransferResponse) {
	out, err := fc.reply(resp, nil)
	if err != nil {
		return // answered when the call returns, as any reply
	}
	fc.answered, fc.answerErr = true, fc.answer(out)
}

// takeAnswered reports (and forgets) whether the frame just served was answered already, and how that ended.
func (fc *fastConn) takeAnswered() (bool, error) {
	answered, err := fc.answered, fc.answerErr
	fc.answered, fc.answerErr = false, nil
	return answered, err
}

// answer delivers a reply frame where its request came from: on the socket within Options.FastReplyTimeout,
// or in the mailbox, waking its caller when it sleeps. The socket's write deadline is cleared afterwards: the
// wake-ups of mailbox calls are written without waiting, and a deadline left in the past would refuse them.
func (fc *fastConn) answer(out []byte) error {
	if !fc.inMailbox {
		_ = fc.conn.SetWriteDeadline(time.Now().Add(fc.replyTimeout))
		_, err := fc.conn.Write(out)
		_ = fc.conn.SetWriteDeadline(time.Time{})
		if err != nil {
			return fmt.Errorf("writing a fast reply: %w", err)
		}
		return nil
	}
	wake, err := fc.mailbox.Reply(out)
	if err != nil {
		out, _ = fc.reply(nil, status.Error(codes.Internal, err.Error()))
		wake, _ = fc.mailbox.Reply(out)
	}
	if wake {
		return wakeCaller(fc.conn)
	}
	return nil
}

// reply writes the answer to one frame behind four reserved bytes of the buffer kept for the connection and
// returns the sealed frame (valid until the next reply): one write, no allocation.
func (fc *fastConn) reply(resp *agentv1.TransferResponse, err error) ([]byte, error) {
	if cap(fc.out) > 64<<10 {
		fc.out = nil
	}
	if err == nil {
		if out, ok := fastwire.AppendResponseReply(append(fc.out[:0], 0, 0, 0, 0), resp); ok {
			fc.out = out
			return sockio.SealFrame(out), nil
		}
	}
	var r *agentv1.FastReply
	if err != nil {
		r = fastwire.ErrReply(err)
	} else {
		r = &agentv1.FastReply{Response: resp} // a string that is not UTF-8: proto.Marshal says so
	}
	out, err := (proto.MarshalOptions{}).MarshalAppend(append(fc.out[:0], 0, 0, 0, 0), r)
	if err != nil {
		return nil, err
	}
	fc.out = out
	return sockio.SealFrame(out), nil
}

// serveMailbox serves the request waiting in the connection's mailbox and answers it there, waking the caller
// with a wake-up on the socket when it sleeps. It fails only when the socket does.
func (s *Server) serveMailbox(ctx context.Context, sess *session, fc *fastConn) error {
	frame, err := fc.mailbox.Take()
	trace.Log(ctx, "fast", "frame read")
	fc.inMailbox = true
	var out []byte
	if err != nil {
		s.metrics.Edge.Refused("fast", "malformed")
		out, err = fc.reply(nil, status.Error(codes.InvalidArgument, err.Error()))
	} else {
		resp, serr := s.serveFastFrame(ctx, sess, fc, frame)
		if answered, err := fc.takeAnswered(); answered {
			return err
		}
		if serr != nil && ctx.Err() != nil {
			return serr // the agent is stopping: no reply, the connection ends (as in handleFast)
		}
		out, err = fc.reply(resp, serr)
	}
	if err != nil {
		return err
	}
	err = fc.answer(out)
	trace.Log(ctx, "fast", "replied")
	return err
}

// wakeCaller writes a wake-up without waiting for room: a socket too full to take four bytes already holds
// wake-ups its caller has not read, which wake it as well, and a caller that never reads must not hold this
// connection's goroutine in a write.
func wakeCaller(conn *net.UnixConn) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	if err := rc.Write(func(fd uintptr) bool {
		for {
			_, werr = syscall.Write(int(fd), fastwire.WakeFrame[:])
			if werr != syscall.EINTR {
				break
			}
		}
		if werr == syscall.EAGAIN {
			werr = nil
		}
		return true
	}); err != nil {
		return err
	}
	return werr
}

// serveFastFrame decodes one FastRequest and serves it as the gRPC call of the same name would. fc.inMailbox says
// the frame came through the mailbox, which cannot replace itself.
func (s *Server) serveFastFrame(ctx context.Context, sess *session, fc *fastConn, frame []byte) (*agentv1.TransferResponse, error) {
	// A mailbox frame's waited transfer is answered as its bytes land. A socket frame's is answered when its call
	// returns: a write there may wait for a caller that does not read, and an early answer is written before the
	// engines unpin the transfer's regions, which other callers' deregistrations may be waiting for.
	var early transfers.Replier
	if fc.inMailbox {
		early = fc
	}
	// Block transfers, the large frames, are read without copying their ids.
	blocks, err := fc.blocks.Decode(frame)
	if err == nil {
		// The call's deadline bounds what the call may wait for beside its transfer, whose own timeout bounds the
		// rest: another node's layout. Between this node's layouts (the latency-bound call) the context is left as
		// it is, saving the deadline's allocations.
		if ct := fc.blocks.CallTimeout(); ct != nil {
			if err := checkCallTimeout(ct); err != nil {
				return nil, err
			}
			if ref := blocks.Remote; ref != nil && ref.Node != "" && ref.Node != s.opts.NodeName {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, ct.AsDuration())
				defer cancel()
			}
		}
		return s.xfer.TransferBlocks(ctx, &sess.Session, blocks, fc.arena.IDs(), early)
	}
	if !errors.Is(err, fastwire.ErrNotBlocks) {
		return nil, status.Errorf(codes.InvalidArgument, "frame is not a FastRequest: %v", err)
	}
	var req agentv1.FastRequest
	if err := proto.Unmarshal(frame, &req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "frame is not a FastRequest: %v", err)
	}
	ctx, cancel, err := withCallTimeout(ctx, req.CallTimeout)
	if err != nil {
		return nil, err
	}
	defer cancel()
	switch r := req.Request.(type) {
	case *agentv1.FastRequest_Transfer:
		return s.xfer.Transfer(ctx, &sess.Session, r.Transfer, early)
	case *agentv1.FastRequest_Blocks:
		return s.xfer.TransferBlocks(ctx, &sess.Session, r.Blocks, fc.arena.IDs(), early)
	case *agentv1.FastRequest_IdArena:
		return nil, s.setIDArena(sess, &fc.arena, r.IdArena)
	case *agentv1.FastRequest_Wait:
		return s.xfer.FastWait(ctx, &sess.Session, r.Wait)
	case *agentv1.FastRequest_Mailbox:
		if fc.inMailbox {
			return nil, status.Error(codes.InvalidArgument, "a mailbox is set through the socket, not through the mailbox")
		}
		return nil, s.setMailbox(sess, &fc.mailbox, r.Mailbox)
	}
	return nil, status.Error(codes.InvalidArgument, "fast request names no transfer")
}

// withCallTimeout bounds ctx by a frame's FastRequest.call_timeout, as gRPC bounds a call by its caller's
// grpc-timeout: what the agent does for the call (resolving a peer's layout or segment, waiting) ends by then. A
// fast connection's context has no deadline of its own, and a caller that gave up on a call to a stalled peer
// left the agent resolving it until the transfer's timeout (60 s by default), its connection counted against
// the caller's fast connections, and the transfer submitted once the peer answered.
func withCallTimeout(ctx context.Context, d *durationpb.Duration) (context.Context, context.CancelFunc, error) {
	if d == nil {
		return ctx, func() {}, nil
	}
	if err := checkCallTimeout(d); err != nil {
		return ctx, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.AsDuration())
	return ctx, cancel, nil
}

// checkCallTimeout refuses a call_timeout that is not a positive duration.
func checkCallTimeout(d *durationpb.Duration) error {
	if err := d.CheckValid(); err != nil || d.AsDuration() <= 0 {
		return status.Errorf(codes.InvalidArgument, "call_timeout %ds %dns: a positive duration, or none", d.GetSeconds(), d.GetNanos())
	}
	return nil
}

// setMailbox maps the memfd the caller passed as the connection's mailbox, read-write, replacing the one it had.
func (s *Server) setMailbox(sess *session, mb *fastwire.Mailbox, req *agentv1.Mailbox) error {
	if req.Size < fastwire.MinMailbox || req.Size > fastwire.MaxMailbox {
		return status.Errorf(codes.InvalidArgument, "a mailbox of %d bytes: between %d and %d", req.Size, fastwire.MinMailbox, fastwire.MaxMailbox)
	}
	_, mapping, err := s.mapPassedFile(sess, "mailbox", req.FdToken, req.Size, syscall.PROT_READ|syscall.PROT_WRITE)
	if err != nil {
		return err
	}
	if err := mb.Attach(mapping, req.Checked); err != nil {
		_ = syscall.Munmap(mapping)
		return status.Errorf(codes.InvalidArgument, "mailbox: %v", err)
	}
	return nil
}

// setIDArena maps the memfd the caller passed as the connection's id arena, read-only, replacing the one it
// had.
func (s *Server) setIDArena(sess *session, arena *fastwire.IDArena, req *agentv1.IdArena) error {
	if req.Size == 0 || req.Size > fastwire.MaxIDArena {
		return status.Errorf(codes.InvalidArgument, "an id arena of %d bytes: between 1 byte and %d", req.Size, fastwire.MaxIDArena)
	}
	view, mapping, err := s.mapPassedFile(sess, "id arena", req.FdToken, req.Size, syscall.PROT_READ)
	if err != nil {
		return err
	}
	arena.Replace(mapping, view)
	return nil
}

// mapPassedFile maps the first size bytes of the memfd its caller passed under token, for the life of a fast
// connection. The memfd must be sealed against shrinking, so the caller cannot make the agent's accesses fault;
// what names the mapping in the InvalidArgument a refusal is.
func (s *Server) mapPassedFile(sess *session, what, token string, size uint64, prot int) (view, mapping []byte, err error) {
	f, err := s.tokens.Take(sess.Caller.Key, token, false)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	defer f.Close() // the mapping keeps the memory
	view, mapping, err = regiontable.MapShared(f, 0, size, prot)
	if err != nil {
		if reason := regiontable.RefusalReason(err); reason != "" {
			s.metrics.Edge.Refused("fast", reason)
		}
		return nil, nil, status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	return view, mapping, nil
}

// fastRoomLocked says why the caller may not bind another fast connection ("" when it may).
func (s *Server) fastRoomLocked(key string) string {
	total, mine := 0, 0
	for _, sess := range s.sessions {
		total += len(sess.fastConns)
		if sess.Caller.Key == key {
			mine += len(sess.fastConns)
		}
	}
	switch {
	case mine >= maxFastPerCaller:
		return fmt.Sprintf("caller has %d fast connections, the limit is %d: close clients no longer used, or give the "+
			"ones past it no fast path (Go client.WithoutFastPath, Python Client(fast=False)); outside Kubernetes every "+
			"process of a user is one caller", mine, maxFastPerCaller)
	case total >= maxFastConns:
		return fmt.Sprintf("the agent serves %d fast connections, the limit is %d", total, maxFastConns)
	}
	return ""
}

func (s *Server) forgetFastConn(sess *session, conn net.Conn) {
	s.table.Lock()
	defer s.table.Unlock()
	sess.fastConns = slices.DeleteFunc(sess.fastConns, func(c net.Conn) bool { return c == conn })
}
