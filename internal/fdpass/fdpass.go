// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdpass

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"
)

// MaxLine bounds one protocol line; a longer one is malformed.
const MaxLine = 256

// DefaultTimeout bounds one exchange when the context has no deadline.
const DefaultTimeout = 5 * time.Second

// ErrRefused wraps the reason the agent gave in an ERR line.
var ErrRefused = errors.New("fd socket refused the request")

// ErrExhausted marks a refusal the caller may retry after backing off: the agent has too many descriptors
// waiting for this caller, or too many connections open on the fd socket. It is an ErrRefused too.
var ErrExhausted = errors.New("fd socket is at a limit, retry later")

// ExhaustedPrefix starts the reason of an ERR line that is ErrExhausted ("ERR RESOURCE_EXHAUSTED: ...").
const ExhaustedPrefix = "RESOURCE_EXHAUSTED: "

// ErrNotMemory marks a refusal of the descriptors themselves (a socket, a pipe: nothing memory can come as);
// retrying cannot help. It is an ErrRefused too.
var ErrNotMemory = errors.New("the descriptor passed is no memory")

// NotMemoryPrefix starts the reason of an ERR line that is ErrNotMemory ("ERR INVALID_ARGUMENT: ...").
const NotMemoryPrefix = "INVALID_ARGUMENT: "

// Put hands f to the agent listening on socketPath and returns the token that names it. The caller keeps
// its own f open (the agent received a duplicate).
func Put(ctx context.Context, socketPath string, f *os.File) (string, error) {
	return put(ctx, socketPath, "PUT\n", []int{int(f.Fd())})
}

// put sends line with fds in one message and reads the token answered.
func put(ctx context.Context, socketPath, line string, fds []int) (string, error) {
	conn, err := dial(ctx, socketPath)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	rights := syscall.UnixRights(fds...)
	_, _, werr := conn.WriteMsgUnix([]byte(line), rights, nil)
	reply, _, err := ReadLine(conn, false)
	if werr != nil && err != nil {
		// An agent at a limit answers and closes without reading the request, so the write can fail with the
		// answer waiting to be read; only when there is none is the write's error reported.
		return "", fmt.Errorf("sending fd to %s: %w", socketPath, werr)
	}
	if err != nil {
		return "", fmt.Errorf("reading the token from %s: %w", socketPath, err)
	}
	token, err := parseReply(reply)
	if err != nil {
		return "", err
	}
	if token == "" {
		return "", fmt.Errorf("fd socket %s answered OK without a token", socketPath)
	}
	return token, nil
}

// MaxPutFDs is how many descriptors one "PUT <n>" carries at most: the kernel's SCM_MAX_FD, the most one
// SCM_RIGHTS message may hold.
const MaxPutFDs = 253

// PutMany hands files to the agent in one "PUT <n>" exchange (1 <= len(files) <= MaxPutFDs) and returns the
// token that names them, in order. The caller keeps its own files open.
func PutMany(ctx context.Context, socketPath string, files []*os.File) (string, error) {
	if len(files) == 0 || len(files) > MaxPutFDs {
		return "", fmt.Errorf("putting %d descriptors on %s: one PUT carries 1 to %d", len(files), socketPath, MaxPutFDs)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return put(ctx, socketPath, fmt.Sprintf("PUT %d\n", len(fds)), fds)
}

// Get presents token to the agent on socketPath and returns the descriptor it lends.
func Get(ctx context.Context, socketPath, token string) (*os.File, error) {
	if token == "" || strings.ContainsAny(token, " \n") {
		return nil, fmt.Errorf("fd token %q is malformed", token)
	}
	conn, err := dial(ctx, socketPath)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("GET " + token + "\n")); err != nil {
		return nil, fmt.Errorf("asking %s for token: %w", socketPath, err)
	}
	line, fds, err := ReadLine(conn, true)
	if err != nil {
		return nil, fmt.Errorf("reading the fd from %s: %w", socketPath, err)
	}
	if _, err := parseReply(line); err != nil {
		closeAll(fds)
		return nil, err
	}
	if len(fds) != 1 {
		closeAll(fds)
		return nil, fmt.Errorf("fd socket %s sent %d descriptors, want 1", socketPath, len(fds))
	}
	return os.NewFile(uintptr(fds[0]), "fabricxfer-lent"), nil
}

func dial(ctx context.Context, socketPath string) (*net.UnixConn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("connecting to fd socket %s: %w", socketPath, err)
	}
	conn := c.(*net.UnixConn)
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	return conn, nil
}

func parseReply(line string) (string, error) {
	switch {
	case line == "OK":
		return "", nil
	case strings.HasPrefix(line, "OK "):
		return strings.TrimPrefix(line, "OK "), nil
	case strings.HasPrefix(line, "ERR "+ExhaustedPrefix):
		return "", fmt.Errorf("%w: %w: %s", ErrRefused, ErrExhausted, strings.TrimPrefix(line, "ERR "+ExhaustedPrefix))
	case strings.HasPrefix(line, "ERR "+NotMemoryPrefix):
		return "", fmt.Errorf("%w: %w: %s", ErrRefused, ErrNotMemory, strings.TrimPrefix(line, "ERR "+NotMemoryPrefix))
	case strings.HasPrefix(line, "ERR "):
		return "", fmt.Errorf("%w: %s", ErrRefused, strings.TrimPrefix(line, "ERR "))
	default:
		return "", fmt.Errorf("fd socket sent a malformed reply %q", line)
	}
}

// ReadLine reads one newline-terminated line from conn and, when wantFDs is set, the descriptors that came
// with it. Descriptors that arrive when none are wanted are closed, so a peer cannot leak fds into us.
func ReadLine(conn *net.UnixConn, wantFDs bool) (string, []int, error) {
	limit := 0
	if wantFDs {
		limit = MaxFDs
	}
	return ReadLineFDs(conn, limit)
}

// MaxFDs is how many descriptors one read takes in: the control buffer has room for this many, the kernel
// closes any more that came in the same message (MSG_CTRUNC).
const MaxFDs = 4

// ReadLineFDs reads one newline-terminated line from conn and keeps at most maxFDs of the descriptors that came
// with it; every further descriptor is closed as soon as it arrives, so a peer that sends many messages with
// descriptors cannot make this process hold more than 2*max(maxFDs, MaxFDs) of them at once (one read takes in
// at most max(maxFDs, MaxFDs); the kernel closes the rest of a bigger message). An error (deadline, peer gone,
// malformed line) closes every descriptor read so far.
func ReadLineFDs(conn *net.UnixConn, maxFDs int) (string, []int, error) {
	return readLine(conn, maxFDs, false)
}

// ReadRequestFDs is ReadLineFDs for a request whose descriptors travel in one message with the start of its
// line (every PUT): only the first read's descriptors are kept, at most maxFDs; any that come later are closed
// as they arrive. A peer that trickles a line out with descriptors on every byte thus makes this process hold
// no more than one message's worth beyond the first.
func ReadRequestFDs(conn *net.UnixConn, maxFDs int) (string, []int, error) {
	return readLine(conn, maxFDs, true)
}

func readLine(conn *net.UnixConn, maxFDs int, firstOnly bool) (string, []int, error) {
	var (
		line []byte
		fds  []int
		buf  = make([]byte, MaxLine)
		oob  = make([]byte, syscall.CmsgSpace(max(MaxFDs, min(maxFDs, MaxPutFDs))*4))
	)
	fail := func(err error) (string, []int, error) {
		closeAll(fds)
		return "", nil, err
	}
	for reads := 0; ; reads++ {
		if firstOnly && reads == 1 {
			maxFDs = len(fds) // what the first read brought is all this request may carry
		}
		n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
		// On error the counts can be negative (-1 from a failed recvmsg): nothing was read.
		n, oobn = max(n, 0), max(oobn, 0)
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			if perr != nil {
				return fail(perr)
			}
			if keep := maxFDs - len(fds); len(got) > keep {
				keep = max(keep, 0)
				closeAll(got[keep:])
				got = got[:keep]
			}
			fds = append(fds, got...)
		}
		if flags&syscall.MSG_CTRUNC != 0 {
			return fail(errors.New("too many descriptors in one message"))
		}
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			return string(line[:i]), fds, nil
		}
		if len(line) >= MaxLine {
			return fail(fmt.Errorf("line longer than %d bytes", MaxLine))
		}
		if err != nil {
			return fail(fmt.Errorf("connection ended before a full line: %w", err))
		}
		if n == 0 {
			return fail(errors.New("connection ended before a full line"))
		}
	}
}

// parseRights returns the descriptors in SCM_RIGHTS control messages. The whole buffer is checked before any
// descriptor is taken, so malformed control data is an error with no descriptors (the kernel never sends it).
func parseRights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parsing control message: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_RIGHTS && len(m.Data)%4 != 0 {
			return nil, fmt.Errorf("SCM_RIGHTS control message of %d bytes is not a whole number of descriptors", len(m.Data))
		}
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != syscall.SOL_SOCKET || m.Header.Type != syscall.SCM_RIGHTS {
			continue // credentials or other control data: not ours to use
		}
		for i := 0; i+4 <= len(m.Data); i += 4 {
			fds = append(fds, int(int32(nativeEndian.Uint32(m.Data[i:i+4]))))
		}
	}
	return fds, nil
}

var nativeEndian = binary.NativeEndian

// CloseFDs closes raw descriptors, ignoring errors (used on every refusal path).
func CloseFDs(fds []int) { closeAll(fds) }

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}
