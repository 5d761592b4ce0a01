// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// FastSocketName is the fast socket's name beside the agent socket.
const FastSocketName = "agent.fast.sock"

// fastDefaultDeadline bounds a fast-path call whose context has no deadline (the agent's default transfer
// timeout plus slack).
const fastDefaultDeadline = 65 * time.Second

// openFast binds a fast-socket connection to this client's session. An agent without the fast path is not an
// error: calls then go over gRPC.
func (c *Client) openFast(ctx context.Context) error {
	f, err := c.dialFast(ctx)
	if err != nil {
		return err
	}
	c.lockFastWait()
	defer c.unlockFast()
	if f.conn == nil {
		c.fastWanted = false // an agent without the fast path now: nothing to open again
		return nil
	}
	if !c.installFastLocked(f) {
		return ErrClosed
	}
	return nil
}

// fastParts are a bound fast connection and what was set up on it.
type fastParts struct {
	conn  *net.UnixConn
	mbox  *fastwire.CallerMailbox
	arena []byte
}

// dialFast opens and binds a fast connection, without installing it; conn is nil where the agent has no fast
// path.
func (c *Client) dialFast(ctx context.Context) (fastParts, error) {
	resp, err := c.api.OpenFastPath(ctx, &agentv1.OpenFastPathRequest{})
	if status.Code(err) == codes.Unimplemented {
		return fastParts{}, nil
	}
	if err != nil {
		return fastParts{}, fmt.Errorf("opening the fast path: %w", err)
	}
	var d net.Dialer
	path := filepath.Join(c.socketDir(), FastSocketName)
	raw, err := d.DialContext(ctx, "unix", path)
	if errors.Is(err, unix.EACCES) {
		return fastParts{}, notInSocketGroup(path, err)
	}
	if err != nil {
		optOut := "dial WithoutFastPath() to go through gRPC alone (slower)"
		if _, ferr := os.Stat(c.fdSocket()); ferr != nil {
			optOut = "" // without the fast path, registering host memory would fail on the missing descriptor socket
		}
		return fastParts{}, fmt.Errorf("connecting to the fast socket: %w", notBesideAgentSocket(path, "fast", optOut, err))
	}
	conn := raw.(*net.UnixConn)
	// The calls below end at ctx's deadline; its cancellation (Close, for a reopen) ends them too.
	defer context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })()
	reply, err := fastCall(ctx, conn, []byte(resp.Token), 0)
	if err == nil && reply.Code != 0 {
		err = status.Error(codes.Code(reply.Code), reply.Message)
	}
	if err != nil {
		conn.Close()
		return fastParts{}, fmt.Errorf("binding the fast socket: %w", err)
	}
	f := fastParts{conn: conn}
	f.arena, err = c.openArena(ctx, conn)
	if err == nil && !c.noMailbox {
		f.mbox, err = c.openMailbox(ctx, conn)
	}
	if err != nil {
		f.close()
		return fastParts{}, err
	}
	return f, nil
}

// installFastLocked makes f the client's fast connection, closing any it had, and reports true; on a closed
// client it closes f and reports false (a Recover beside Close left one open for good). The fast lock is held.
func (c *Client) installFastLocked(f fastParts) bool {
	if c.closed.Load() {
		f.close()
		return false
	}
	c.closeFastLocked()
	c.fast, c.mbox, c.arena = f.conn, f.mbox, f.arena
	c.fastLive.Store(f.conn)
	c.fastWanted = true
	return true
}

// fastQueueWait bounds how long a call waits for the fast connection while another call holds it: past it, the
// call goes through gRPC (slower, by tens of microseconds to a millisecond on a busy host) instead of queueing behind a long transfer
// (a goroutine's 4 KiB call waited 9 ms behind another's waited 256 MiB one) or one the agent does not answer.
const fastQueueWait = 200 * time.Microsecond

// lockFast takes the fast connection for one call: taken is false when another call held it for fastQueueWait
// (the caller goes through gRPC), err set when ctx ended first (nothing was sent).
func (c *Client) lockFast(ctx context.Context) (taken bool, err error) {
	var ended error
	select {
	case c.fastSem <- struct{}{}:
	default:
		queued := time.NewTimer(fastQueueWait)
		defer queued.Stop()
		select {
		case c.fastSem <- struct{}{}:
		case <-queued.C:
			return false, nil
		case <-ctx.Done():
			ended = ctx.Err()
		}
	}
	// A request past its deadline (which ctx.Err() tells only once the context's timer fired) is not posted
	// either: it would fail at once, dropping a sound connection, and the agent might still run it.
	if ended == nil {
		if ended = ctxEnded(ctx); ended != nil {
			c.unlockFast()
		}
	}
	if ended != nil {
		return false, fmt.Errorf("fast path: nothing sent: %w (%w)", status.FromContextError(ended).Err(), ended)
	}
	return true, nil
}

// lockFastWait takes the fast connection however long another call holds it (bounded by that call's deadline).
func (c *Client) lockFastWait() { c.fastSem <- struct{}{} }

// tryLockFast takes the fast connection if no call holds it.
func (c *Client) tryLockFast() bool {
	select {
	case c.fastSem <- struct{}{}:
		return true
	default:
		return false
	}
}

func (c *Client) unlockFast() { <-c.fastSem }

// reopenLimit bounds one attempt to open a dropped fast connection again, and reopenPause separates attempts
// that failed.
const (
	reopenLimit = 10 * time.Second
	reopenPause = 250 * time.Millisecond
)

// reopenFastLater opens a dropped fast connection again in the background, unless an attempt runs or one failed
// within reopenPause: calls meanwhile go through gRPC, and the next after it succeeds takes the fast path again.
// Before, one call past its deadline (an agent stopped for a moment) left the client on gRPC for good, 50 times
// slower a call and silent about it, until Recover.
func (c *Client) reopenFastLater() {
	if !c.fastWanted || c.closed.Load() || time.Now().UnixNano() < c.reopenAfter.Load() || !c.reopening.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer c.reopening.Store(false)
		ctx, cancel := context.WithTimeout(c.life, reopenLimit)
		defer cancel()
		session := c.session.Load() // what the connection is bound to
		f, err := c.dialFast(ctx)
		if err != nil || f.conn == nil {
			c.reopenAfter.Store(time.Now().Add(reopenPause).UnixNano())
			return
		}
		c.lockFastWait()
		defer c.unlockFast()
		if c.fast != nil || c.session.Load() != session {
			// Another open got there first, or Recover moved the client to another session meanwhile: this
			// connection's session ended, and its first call would say the session was lost.
			f.close()
			return
		}
		c.installFastLocked(f)
	}()
}

// idArenaBytes is the fast connection's id arena: 131,072 32-bit ids, two lists of the most one transfer names.
const idArenaBytes = 1 << 20

// arenaMinIDs: lists at least this long go through the id arena; shorter ones are cheaper in the frame.
const arenaMinIDs = 1024

// openArena gives conn an id arena, shared memory the ids of long block lists are written into instead of the
// frame; nil where the agent does not take one, an error where conn is out of step (passMemory).
func (c *Client) openArena(ctx context.Context, conn *net.UnixConn) ([]byte, error) {
	return c.passMemory(ctx, conn, "fabricxfer-ids", idArenaBytes, func(token string) *agentv1.FastRequest {
		return &agentv1.FastRequest{Request: &agentv1.FastRequest_IdArena{IdArena: &agentv1.IdArena{FdToken: token, Size: idArenaBytes}}}
	})
}

// DefaultSpin is how long the client polls the fast socket for a reply before parking.
const DefaultSpin = 50 * time.Microsecond

// A waited transfer polls for its reply longer, by the time its bytes take at waitedSpinRate (slower than a GPU
// copy within one node: an H100 copies 64 MiB in about 53 µs, an H200 in 40), up to maxWaitedSpin: a reply that
// comes after the client parked costs a wake-up through the socket, which took a waited 64 MiB copy from about
// 60 to 75 µs.
const (
	waitedSpinRate = 1e12 // bytes per second
	maxWaitedSpin  = 2 * time.Millisecond
)

// spinFor is how long a call polls for its reply: the client's spin, and for a waited transfer of n bytes that
// plus the bytes' time at waitedSpinRate, within maxWaitedSpin (or the client's spin, when longer). A client that
// never polls (WithSpin(0)) does not start for a large transfer.
func (c *Client) spinFor(wait bool, n uint64) time.Duration {
	if !wait || c.spin <= 0 {
		return c.spin
	}
	return min(c.spin+time.Duration(float64(n)/waitedSpinRate*float64(time.Second)), max(c.spin, maxWaitedSpin))
}

// callDeadline is ctx's deadline, or fastDefaultDeadline from now.
func callDeadline(ctx context.Context) time.Time {
	if deadline, ok := ctx.Deadline(); ok {
		return deadline
	}
	return time.Now().Add(fastDefaultDeadline)
}

// fastCall writes one frame on the socket and reads the reply, bounded by ctx's deadline.
func fastCall(ctx context.Context, conn *net.UnixConn, payload []byte, spin time.Duration) (*agentv1.FastReply, error) {
	body, err := socketCall(ctx, conn, payload, spin)
	if err != nil {
		return nil, err
	}
	return decodeReply(body)
}

func decodeReply(body []byte) (*agentv1.FastReply, error) {
	var reply agentv1.FastReply
	if err := proto.Unmarshal(body, &reply); err != nil {
		return nil, fmt.Errorf("decoding a fast reply: %w", err)
	}
	return &reply, nil
}

// socketCall writes one frame on the socket and returns the reply's payload, passing over the wake-ups of
// earlier mailbox calls that the agent sent after their replies.
func socketCall(ctx context.Context, conn *net.UnixConn, payload []byte, spin time.Duration) ([]byte, error) {
	_ = conn.SetDeadline(callDeadline(ctx))
	if ctx.Done() != nil {
		// A context cancelled before its deadline ends the wait too: the call then drops the connection, which
		// tells the agent to stop a waited transfer nobody waits for.
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Unix(1, 0)); close(fired) })
		defer func() {
			if !stop() {
				<-fired // set before the next call sets its own
			}
		}()
	}
	if err := sockio.WriteFrame(conn, payload); err != nil {
		return nil, err
	}
	r := sockio.SpinReader{Conn: conn, Spin: spin}
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, err
		}
		if hdr == fastwire.WakeFrame {
			continue
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n > maxFastReply {
			return nil, fmt.Errorf("a fast reply of %d bytes, at most %d", n, maxFastReply)
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, err
		}
		return body, nil
	}
}

// maxFastReply bounds a reply frame on the fast socket.
const maxFastReply = 64 << 20

// transferFast sends req over the fast socket, polling for its reply for spin. ok is false when there is no fast
// path, or another call holds it (the caller uses gRPC). Calls are serialized on the one connection.
func (c *Client) transferFast(ctx context.Context, req *agentv1.TransferRequest, spin time.Duration) (resp *agentv1.TransferResponse, ok bool, err error) {
	if taken, err := c.lockFast(ctx); !taken {
		return nil, err != nil, err
	}
	defer c.unlockFast()
	if c.fast == nil {
		c.reopenFastLater()
		return nil, false, nil
	}
	return c.fastRequestLocked(ctx, &agentv1.FastRequest{Request: &agentv1.FastRequest_Transfer{Transfer: req}}, spin)
}

// fastBlocks sends block request r with its ids (n bytes moved) on the fast socket: ids of arenaMinIDs and more in
// the id arena, the frame written into the connection's own buffer; ok is false when there is no fast connection,
// or another call holds it (the caller uses gRPC).
func (c *Client) fastBlocks(ctx context.Context, r *blockRequest, ids, remoteIDs []uint32, n uint64) (resp *agentv1.TransferResponse, ok bool, err error) {
	if taken, err := c.lockFast(ctx); !taken {
		return nil, err != nil, err
	}
	defer c.unlockFast()
	if c.fast == nil {
		c.reopenFastLater()
		return nil, false, nil
	}
	var arena uint32
	if k := len(ids); c.arena != nil && k >= arenaMinIDs && k == len(remoteIDs) && 8*k <= len(c.arena) {
		// Written under the lock the call holds until its reply: the agent copies them out before it answers.
		putIDs(c.arena, ids)
		putIDs(c.arena[4*k:], remoteIDs)
		arena = uint32(k)
	}
	// The buffer is the connection's, under the fast lock: the mailbox and the socket copy the frame before the call
	// returns. One grown past a short list's frame is not kept.
	c.frame = appendCallTimeout(ctx, r.appendFast(c.frame[:0], ids, remoteIDs, arena))
	resp, ok, err = c.fastPayloadLocked(ctx, c.frame, c.spinFor(r.wait, n))
	if cap(c.frame) > maxKeptFrame {
		c.frame = nil
	}
	return resp, ok, err
}

// maxKeptFrame is the largest block frame buffer a client keeps between calls (a list of ids shorter than the id
// arena takes, both sides, fits).
const maxKeptFrame = 16 << 10

// fastWaitSlice bounds how long a Wait holds the fast connection: a transfer still running after it is waited
// for through gRPC, so the client's other calls (which share the connection) are not held behind a long one. A
// GPU copy of 1 GiB ends within it.
const fastWaitSlice = 2 * time.Millisecond

// fastWait waits on the fast socket for transfers ids, of n bytes together, for up to fastWaitSlice (less when
// ctx ends sooner: half of what is left, so the agent answers before the call's deadline), polling for the answer
// as a waited transfer of n bytes would. st is the first of ids that did not succeed, else the last one's. ok is
// false when one is still running then (st is then its PENDING status, when the agent answered), or the fast
// connection is busy or absent: the caller waits through gRPC.
func (c *Client) fastWait(ctx context.Context, ids []uint64, n uint64) (st *Status, ok bool, err error) {
	if !c.tryLockFast() {
		return nil, false, nil
	}
	defer c.unlockFast()
	if c.fast == nil {
		return nil, false, nil
	}
	slice := fastWaitSlice
	if deadline, has := ctx.Deadline(); has {
		slice = min(slice, time.Until(deadline)/2)
	}
	if slice < 50*time.Microsecond {
		return nil, false, nil
	}
	resp, _, err := c.fastRequestLocked(ctx, &agentv1.FastRequest{Request: &agentv1.FastRequest_Wait{
		Wait: &agentv1.FastWait{TransferIds: ids, Timeout: durationpb.New(slice)}}}, min(c.spinFor(true, n), max(c.spin, slice)))
	if err != nil {
		return nil, true, err
	}
	if resp.Status == nil || resp.Status.State == agentv1.TransferState_TRANSFER_STATE_PENDING {
		return resp.Status, false, nil
	}
	return resp.Status, true, nil
}

// fastRequestLocked sends one request frame over the fast socket, polling for its reply for spin, with the fast
// lock held and the fast connection open.
func (c *Client) fastRequestLocked(ctx context.Context, req *agentv1.FastRequest, spin time.Duration) (resp *agentv1.TransferResponse, ok bool, err error) {
	req.CallTimeout = durationpb.New(callTimeout(ctx))
	payload, err := proto.Marshal(req)
	if err != nil {
		return nil, true, err
	}
	return c.fastPayloadLocked(ctx, payload, spin)
}

// fastPayloadLocked sends an encoded FastRequest on the fast socket, polling for its reply for spin, and returns
// its response, with the fast lock held and the fast connection open.
func (c *Client) fastPayloadLocked(ctx context.Context, payload []byte, spin time.Duration) (resp *agentv1.TransferResponse, ok bool, err error) {
	var body []byte
	if c.mbox != nil && c.mbox.Fits(len(payload)) {
		body, err = mailboxCall(ctx, c.fast, c.mbox, payload, spin, sockio.OfferCore)
	} else {
		body, err = socketCall(ctx, c.fast, payload, spin)
	}
	var reply *agentv1.FastReply
	if err == nil {
		reply, err = decodeReply(body)
	}
	if err != nil {
		// The stream is out of step (or gone): drop it; the next call opens a new one in the background (and
		// Recover, after a restart). The agent stops a waited transfer whose caller dropped its connection, and
		// closes its end once the copies stopped (Settle).
		c.dropFastLocked()
		var ne net.Error
		if ended := ctxEnded(ctx); ended != nil {
			return nil, true, fmt.Errorf("%w (%w)", status.Errorf(status.FromContextError(ended).Code(), "fast path: %v", err), ended)
		}
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, true, status.Errorf(codes.DeadlineExceeded, "fast path: %v", err)
		}
		return nil, true, fmt.Errorf("fast path: %w (%v)", ErrSessionLost, err)
	}
	if reply.Code != 0 {
		return nil, true, status.Error(codes.Code(reply.Code), reply.Message)
	}
	return reply.Response, true, nil
}

func (c *Client) closeFast() {
	c.lockFastWait()
	defer c.unlockFast()
	c.closeFastLocked()
}

// dropFastLocked closes the fast connection as closeFastLocked does, but keeps the socket, half-closed, until the
// agent closes its end (cutCalls).
func (c *Client) dropFastLocked() {
	conn := c.fast
	fastParts{mbox: c.mbox, arena: c.arena}.close()
	c.fast, c.mbox, c.arena = nil, nil, nil
	c.fastLive.Store(nil)
	if conn != nil {
		c.cuts.drop(conn)
	}
}

// closeFastLocked closes the fast connection and unmaps its mailbox and id arena; the fast lock is held.
func (c *Client) closeFastLocked() {
	fastParts{conn: c.fast, mbox: c.mbox, arena: c.arena}.close()
	c.fast, c.mbox, c.arena = nil, nil, nil
	c.fastLive.Store(nil)
}

// close closes the connection and unmaps what was set up on it.
func (f fastParts) close() {
	if f.conn != nil {
		f.conn.Close()
	}
	if f.mbox != nil {
		f.mbox.Unmap()
	}
	if f.arena != nil {
		_ = unix.Munmap(f.arena)
	}
}
