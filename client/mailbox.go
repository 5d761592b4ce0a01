// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// A fast connection's mailbox (agent.proto, Mailbox): frames that fit travel through shared memory the agent
// maps and watches, so a round trip while both sides poll makes no system call. The agent says whether it
// watches; when it does not, the caller rings with an empty frame on the socket. A caller that stops polling
// says so, and the agent wakes it with fastwire.WakeFrame on the socket.

const (
	// mailboxBytes is the mailbox's size: two areas of 30 KiB, which any block list of up to a few thousand
	// ids fits; larger frames go on the socket.
	mailboxBytes = 64 << 10
	// ringAfter: a request the agent has not taken after this long is rung for, whatever the agent said: the
	// caller's raise of the sequence and its read of the agent's word may pass each other.
	ringAfter = 50 * time.Microsecond
	// sleepPoll bounds one wait on the socket while asleep, in case the reply and the sleeping word passed each
	// other.
	sleepPoll = time.Millisecond
)

// emptyFrame rings an agent that waits on the socket.
var emptyFrame = []byte{0, 0, 0, 0}

// openMailbox gives conn (a bound fast connection) a mailbox. It returns nil where the agent does not take one
// (an older agent answers with an error) or the memory could not be set up: frames then travel on the socket.
// An error means conn is out of step (passMemory).
func (c *Client) openMailbox(ctx context.Context, conn *net.UnixConn) (*fastwire.CallerMailbox, error) {
	mem, err := c.passMemory(ctx, conn, "fabricxfer-mailbox", mailboxBytes, func(token string) *agentv1.FastRequest {
		return &agentv1.FastRequest{Request: &agentv1.FastRequest_Mailbox{Mailbox: &agentv1.Mailbox{FdToken: token, Size: mailboxBytes}}}
	})
	if mem == nil {
		return nil, err
	}
	mb, err := fastwire.NewCallerMailbox(mem, false)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, nil
	}
	return mb, nil
}

// passMemory creates size bytes of shared memory sealed against shrinking, passes them to the agent through the
// fd socket and sets them up on conn with request(token); it returns this process's mapping, or nil where the
// agent refused or the passing failed (the connection then works without it). An error means the setup frame
// got no reply (an agent stopped meanwhile): its late reply would be read as the next call's, so conn is out of
// step and must not be used.
func (c *Client) passMemory(ctx context.Context, conn *net.UnixConn, name string, size int, request func(token string) *agentv1.FastRequest) ([]byte, error) {
	f, err := newSealedMemfd(name, uint64(size))
	if err != nil {
		return nil, nil
	}
	defer f.Close() // the mapping keeps the memory
	// Populated here, so that the agent's accesses allocate nothing on its own memory limit (it refuses otherwise).
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, nil
	}
	token, err := c.putFD(ctx, f)
	var payload []byte
	if err == nil {
		payload, err = proto.Marshal(request(token))
	}
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, nil
	}
	reply, err := fastCall(ctx, conn, payload, 0)
	if err != nil || reply.Code != 0 {
		_ = unix.Munmap(mem)
		if err != nil {
			return nil, fmt.Errorf("setting up %s on the fast connection: %w", name, err)
		}
		return nil, nil
	}
	return mem, nil
}

// mailboxCall sends payload through mb and returns the reply's payload (valid until the next call): it polls
// the reply for up to spin, offering its core every sockio.YieldGap meanwhile (offer: sockio.OfferCore), then
// sleeps on conn until the agent wakes it, within ctx's deadline.
func mailboxCall(ctx context.Context, conn *net.UnixConn, mb *fastwire.CallerMailbox, payload []byte, spin time.Duration, offer func()) ([]byte, error) {
	deadline := callDeadline(ctx)
	rang := !mb.Post(payload)
	if rang {
		if err := ring(conn, deadline); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	offers := sockio.NewCoreOffers(start, offer)
	for i := 0; !mb.Answered(); i++ {
		if i&63 != 0 {
			continue
		}
		now := time.Now()
		since := now.Sub(start)
		offers.Due(now) // the agent's thread may wait for this core to answer
		if !rang && since > ringAfter && !mb.Taken() {
			if err := ring(conn, deadline); err != nil {
				return nil, err
			}
			rang = true
		}
		// Past the spin, or the call's end (a spin longer than the deadline still ends with it): wait there.
		if since >= spin || !now.Before(deadline) || ctx.Err() != nil {
			if err := sleepForReply(ctx, conn, mb, deadline); err != nil {
				return nil, err
			}
			break
		}
	}
	return mb.Reply()
}

// sleepForReply waits on conn for the agent's wake-up after the reply to the last request, ringing while the
// agent has not taken it, until ctx ends or deadline passes.
func sleepForReply(ctx context.Context, conn *net.UnixConn, mb *fastwire.CallerMailbox, deadline time.Time) error {
	mb.Sleeping(true)
	defer mb.Sleeping(false)
	var buf [64]byte
	for !mb.Answered() {
		now := time.Now()
		if !now.Before(deadline) {
			return fmt.Errorf("no mailbox reply within the call's deadline: %w", os.ErrDeadlineExceeded)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if !mb.Taken() {
			if err := ring(conn, deadline); err != nil {
				return err
			}
		}
		wake := now.Add(sleepPoll)
		if deadline.Before(wake) {
			wake = deadline
		}
		_ = conn.SetReadDeadline(wake)
		n, err := conn.Read(buf[:])
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		if err != nil {
			return fmt.Errorf("waiting for a mailbox reply: %w", err)
		}
		for _, b := range buf[:n] {
			if b != fastwire.WakeFrame[0] {
				return errors.New("a frame on the socket during a mailbox call: the connection is out of step")
			}
		}
	}
	return nil
}

// ring sends the empty frame that wakes an agent waiting on the socket.
func ring(conn *net.UnixConn, deadline time.Time) error {
	_ = conn.SetWriteDeadline(deadline)
	if _, err := conn.Write(emptyFrame); err != nil {
		return fmt.Errorf("ringing the agent: %w", err)
	}
	return nil
}
