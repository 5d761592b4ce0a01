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

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	"github.com/fabricxfer/fabricxfer/agent/server/transfers"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// FastSocketName is the fast socket's name beside the agent socket.
const FastSocketName = "agent.fast.sock"

const (
	// maxFastFrame bounds one frame on the fast socket: a block transfer of the most ids (65,536 of 8 bytes a
	// side) is 1 MiB, a TransferRequest of 65,536 items about 3 MiB.
	maxFastFrame = 4 << 20
	// maxFastPerCaller and maxFastConns bound bound fast connections per caller and in all, and
	// maxFastTokens the tokens one caller may hold unused: each bound connection can hold a frame in memory.
	maxFastPerCaller = 8
	maxFastConns     = 1024
	maxFastTokens    = 16
	// detachDrain bounds how long a closing connection waits for its detached transfers to answer.
	detachDrain = 10 * time.Second
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
	now := time.Now()
	held := 0
	for k, e := range s.fast.entries {
		if now.After(e.expires) {
			delete(s.fast.entries, k)
		} else if e.sess.Caller.Key == sess.Caller.Key {
			held++
		}
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

func (s *Server) serveFast(ctx context.Context, ln *net.UnixListener) {
	for {
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		go s.handleFast(ctx, conn)
	}
}

func (s *Server) handleFast(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(fastBindTimeout))
	token, err := sockio.ReadFrame(conn, 64)
	if err != nil {
		return
	}
	caller, err := s.identifyConn(ctx, conn)
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
	if err := fastwire.WriteReply(conn, &agentv1.FastReply{}); err != nil {
		return
	}
	_ = conn.SetDeadline(time.Time{})

	// Requests are served in order on this goroutine: no hand-off between reading, transferring and replying.
	callCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fc fastConn
	defer fc.arena.Unmap()
	defer fc.dropMailbox()
	in := sockio.FrameReader{R: sockio.SpinReader{Conn: conn, Spin: s.opts.FastSpin, Budget: s.spinners, Doorbell: &fc.mailbox}, Max: maxFastFrame}
	for {
		frame, err := in.Next()
		if errors.Is(err, sockio.ErrRung) || (err == nil && len(frame) == 0 && fc.mailbox.Attached()) {
			// A request in the mailbox, or an empty frame (its doorbell) that may have found it taken already.
			if fc.mailbox.Rung() {
				if err := s.serveMailbox(callCtx, sess, &fc, conn); err != nil {
					return
				}
			}
			continue
		}
		trace.Log(callCtx, "fast", "frame read")
		if err != nil {
			if err != io.EOF {
				s.metrics.Edge.Refused("fast", "malformed")
				_ = fastwire.WriteReply(conn, fastwire.ErrReply(status.Errorf(codes.InvalidArgument, "reading a frame: %v", err)))
			}
			return
		}
		out, err := fc.reply(s.serveFastFrame(callCtx, sess, &fc, frame, false, nil))
		if err == nil {
			err = s.writeFastReply(conn, out)
		}
		trace.Log(callCtx, "fast", "replied")
		if err != nil {
			return
		}
	}
}

// writeFastReply writes a reply frame within Options.FastReplyTimeout. The deadline is cleared afterwards: the
// wake-ups of mailbox calls are written without waiting, and a deadline left in the past would refuse them.
func (s *Server) writeFastReply(conn *net.UnixConn, out []byte) error {
	_ = conn.SetWriteDeadline(time.Now().Add(s.opts.FastReplyTimeout))
	_, err := conn.Write(out)
	_ = conn.SetWriteDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("writing a fast reply: %w", err)
	}
	return nil
}

// fastConn is what a fast connection keeps between frames: the caller's id arena and mailbox, and the buffer
// replies are marshalled into.
type fastConn struct {
	arena   fastwire.IDArena
	mailbox fastwire.Mailbox
	out     []byte
	// unsignal releases the mailbox's registration for signals (nil: its requests are not signalled); pub is
	// what a signalled request hands the transfer, early the buffer its success reply is marshalled into.
	unsignal func() error
	pub      transfers.Publish
	early    []byte
	detached sync.WaitGroup // detached transfers whose answer may still be written into the mailbox
}

// dropMailbox gives up the mailbox: released for signals first, and kept mapped for good when a copy that writes
// its signal word did not finish (the hardware would write into whatever the pages became).
func (fc *fastConn) dropMailbox() {
	drained := make(chan struct{})
	go func() { fc.detached.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(detachDrain):
		fc.mailbox.Forget() // a transfer still ending would write its answer there
		return
	}
	if fc.unsignal != nil {
		err := fc.unsignal()
		fc.unsignal = nil
		if err != nil {
			fc.mailbox.Forget()
			return
		}
	}
	fc.mailbox.Unmap()
}

// publish returns what a request taken from the mailbox hands a transfer to be signalled, nil when the mailbox is
// not registered for signals. It holds the mailbox for a detached answer (settled), which the caller gives back
// (fc.detached.Done) when the transfer did not detach.
func (fc *fastConn) publish(conn *net.UnixConn) *transfers.Publish {
	if fc.unsignal == nil {
		return nil
	}
	word, value, seq := fc.mailbox.Signal()
	fc.pub.Signal = engines.Signal{Word: word, Value: value}
	fc.pub.Detached = false
	if fc.pub.Early == nil {
		fc.pub.Early = func(resp *agentv1.TransferResponse) bool {
			out, err := (proto.MarshalOptions{}).MarshalAppend(append(fc.early[:0], 0, 0, 0, 0), &agentv1.FastReply{Response: resp})
			if err != nil {
				return false
			}
			fc.early = out
			return fc.mailbox.Early(sockio.SealFrame(out))
		}
	}
	fc.detached.Add(1)
	fc.pub.Settled = fc.settled(conn, fc.mailbox.Mapping(), seq)
	return &fc.pub
}

// settled answers request seq once its detached transfer ended: nothing when it succeeded, since its signal said
// so (the hardware wrote it before the end was seen; the caller may be on to later requests by now, so the word
// is not read again), only a wake-up for a sleeping caller; else the reply, as serveMailbox would have written
// it. The mailbox stays mapped until every settled has run (dropMailbox).
func (fc *fastConn) settled(conn *net.UnixConn, mapping []byte, seq uint64) func(*agentv1.TransferResponse, error) {
	return func(resp *agentv1.TransferResponse, err error) {
		defer fc.detached.Done()
		wake := fastwire.Asleep(mapping)
		if err != nil || resp.GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			var out []byte
			if out, err = replyFrame(nil, resp, err); err == nil {
				wake, err = fastwire.ReplyTo(mapping, seq, out)
			}
			if err != nil {
				return
			}
		}
		if wake {
			_ = wakeCaller(conn)
		}
	}
}

// reply marshals the answer to one frame behind four reserved bytes of the buffer kept for the connection and
// returns the sealed frame (valid until the next reply): one write, no allocation.
func (fc *fastConn) reply(resp *agentv1.TransferResponse, err error) ([]byte, error) {
	if cap(fc.out) > 64<<10 {
		fc.out = nil
	}
	out, err := replyFrame(fc.out[:0], resp, err)
	if err != nil {
		return nil, err
	}
	fc.out = out
	return out, nil
}

// replyFrame appends the sealed frame of the answer to one request to buf.
func replyFrame(buf []byte, resp *agentv1.TransferResponse, err error) ([]byte, error) {
	var r *agentv1.FastReply
	if err != nil {
		r = fastwire.ErrReply(err)
	} else {
		r = &agentv1.FastReply{Response: resp}
	}
	out, err := (proto.MarshalOptions{}).MarshalAppend(append(buf, 0, 0, 0, 0), r)
	if err != nil {
		return nil, err
	}
	return sockio.SealFrame(out), nil
}

// serveMailbox serves the request waiting in the connection's mailbox and answers it there, waking the caller
// with a wake-up on the socket when it sleeps. It fails only when the socket does.
func (s *Server) serveMailbox(ctx context.Context, sess *session, fc *fastConn, conn *net.UnixConn) error {
	frame, err := fc.mailbox.Take()
	trace.Log(ctx, "fast", "frame read")
	var out []byte
	if err != nil {
		s.metrics.Edge.Refused("fast", "malformed")
		out, err = fc.reply(nil, status.Error(codes.InvalidArgument, err.Error()))
	} else {
		pub := fc.publish(conn)
		out, err = fc.reply(s.serveFastFrame(ctx, sess, fc, frame, true, pub))
		if pub != nil {
			if pub.Detached {
				trace.Log(ctx, "fast", "detached")
				return nil
			}
			fc.detached.Done() // nothing answers later
		}
	}
	if err != nil {
		return err
	}
	wake, err := fc.mailbox.Reply(out)
	if err != nil {
		out, _ = fc.reply(nil, status.Error(codes.Internal, err.Error()))
		wake, _ = fc.mailbox.Reply(out)
	}
	trace.Log(ctx, "fast", "replied")
	if wake {
		return wakeCaller(conn)
	}
	return nil
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

// serveFastFrame decodes one FastRequest and serves it as the gRPC call of the same name would. pub is set for
// frames that came through a mailbox registered for signals; inMailbox says the frame came through the mailbox,
// which cannot replace itself.
func (s *Server) serveFastFrame(ctx context.Context, sess *session, fc *fastConn, frame []byte, inMailbox bool, pub *transfers.Publish) (*agentv1.TransferResponse, error) {
	// Block transfers, the large frames, are read without copying their ids.
	blocks, err := fastwire.DecodeBlocks(frame)
	if err == nil {
		return s.xfer.TransferBlocks(ctx, &sess.Session, blocks, fc.arena.IDs(), pub)
	}
	if !errors.Is(err, fastwire.ErrNotBlocks) {
		return nil, status.Errorf(codes.InvalidArgument, "frame is not a FastRequest: %v", err)
	}
	var req agentv1.FastRequest
	if err := proto.Unmarshal(frame, &req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "frame is not a FastRequest: %v", err)
	}
	switch r := req.Request.(type) {
	case *agentv1.FastRequest_Transfer:
		return s.xfer.Transfer(ctx, &sess.Session, r.Transfer)
	case *agentv1.FastRequest_Blocks:
		return s.xfer.TransferBlocks(ctx, &sess.Session, r.Blocks, fc.arena.IDs(), pub)
	case *agentv1.FastRequest_IdArena:
		return nil, s.setIDArena(sess, &fc.arena, r.IdArena)
	case *agentv1.FastRequest_Wait:
		return s.xfer.FastWait(ctx, &sess.Session, r.Wait)
	case *agentv1.FastRequest_Mailbox:
		if inMailbox {
			return nil, status.Error(codes.InvalidArgument, "a mailbox is set through the socket, not through the mailbox")
		}
		return nil, s.setMailbox(sess, fc, r.Mailbox)
	}
	return nil, status.Error(codes.InvalidArgument, "fast request names no transfer")
}

// setMailbox maps the memfd the caller passed as the connection's mailbox, read-write, replacing the one it had,
// and, for a caller that watches signals, registers it for them where the engine writes them from hardware (the
// GPU's own write of a request's end, which the caller sees without waiting for the agent).
func (s *Server) setMailbox(sess *session, fc *fastConn, req *agentv1.Mailbox) error {
	if req.Size < fastwire.MinMailbox || req.Size > fastwire.MaxMailbox {
		return status.Errorf(codes.InvalidArgument, "a mailbox of %d bytes: between %d and %d", req.Size, fastwire.MinMailbox, fastwire.MaxMailbox)
	}
	_, mapping, err := s.mapPassedFile(sess, "mailbox", req.FdToken, req.Size, syscall.PROT_READ|syscall.PROT_WRITE)
	if err != nil {
		return err
	}
	fc.dropMailbox()
	if err := fc.mailbox.Attach(mapping); err != nil {
		_ = syscall.Munmap(mapping)
		return status.Errorf(codes.InvalidArgument, "mailbox: %v", err)
	}
	if sm, ok := s.opts.Engine.(engines.SignalMemory); ok && req.Signals {
		if release, err := sm.RegisterSignalMemory(mapping); err == nil {
			fc.unsignal = release
		} // else its requests are answered by reply alone
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
		return fmt.Sprintf("caller has %d fast connections, the limit is %d", mine, maxFastPerCaller)
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
