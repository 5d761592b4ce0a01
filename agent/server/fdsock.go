package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fabricxfer/fabricxfer/client/fdpass"
)

// fdTokens holds descriptors in transit between the fd socket and gRPC calls. A token is one-time, bound to
// the caller key that created it (or that it was lent to), and expires; expired descriptors are closed.
type fdTokens struct {
	ttl         time.Duration
	maxPerOwner int

	mu      sync.Mutex
	entries map[string]*fdEntry
	owned   map[string]int
}

type fdEntry struct {
	file     *os.File
	owner    string
	expires  time.Time
	outbound bool // lent by the agent: fetched with GET, never consumed by RegisterMemory
}

func newFDTokens(ttl time.Duration, maxPerOwner int) *fdTokens {
	return &fdTokens{ttl: ttl, maxPerOwner: maxPerOwner, entries: map[string]*fdEntry{}, owned: map[string]int{}}
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// add stores f for owner and returns its token. On error f is closed.
func (t *fdTokens) add(owner string, f *os.File, outbound bool) (string, error) {
	token, err := newToken()
	if err != nil {
		f.Close()
		return "", err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.owned[owner] >= t.maxPerOwner {
		f.Close()
		return "", fmt.Errorf("%d descriptors already wait for a call from this caller (limit %d): use or let them expire", t.owned[owner], t.maxPerOwner)
	}
	t.entries[token] = &fdEntry{file: f, owner: owner, expires: time.Now().Add(t.ttl), outbound: outbound}
	t.owned[owner]++
	return token, nil
}

// take removes and returns the descriptor behind token if owner may use it in this direction.
func (t *fdTokens) take(owner, token string, outbound bool) (*os.File, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.entries[token]
	if !ok || e.owner != owner || e.outbound != outbound {
		// One message for all three: a token of another caller must not be distinguishable from none.
		return nil, fmt.Errorf("fd token %.8s… is unknown, expired, already used or not yours", token)
	}
	delete(t.entries, token)
	t.owned[owner]--
	if time.Now().After(e.expires) {
		e.file.Close()
		return nil, fmt.Errorf("fd token %.8s… expired (tokens live %s)", token, t.ttl)
	}
	return e.file, nil
}

// sweep closes expired descriptors.
func (t *fdTokens) sweep(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.entries {
		if now.After(e.expires) {
			e.file.Close()
			delete(t.entries, k)
			t.owned[e.owner]--
		}
	}
}

func (t *fdTokens) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.entries {
		e.file.Close()
		delete(t.entries, k)
	}
	t.owned = map[string]int{}
}

// fdSocket serves agent.fd.sock.
type fdSocket struct {
	ln       *net.UnixListener
	tokens   *fdTokens
	identify func(ctx context.Context, conn *net.UnixConn) (Caller, error)
}

func (s *fdSocket) serve(ctx context.Context) {
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			return // listener closed on shutdown
		}
		go s.handle(ctx, conn)
	}
}

func (s *fdSocket) handle(ctx context.Context, conn *net.UnixConn) {
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, fdpass.DefaultTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	reply := func(format string, args ...any) { _, _ = fmt.Fprintf(conn, format+"\n", args...) }

	// Read first so descriptors that came with a refused request are closed, not leaked.
	line, fds, err := fdpass.ReadLine(conn, true)
	if err != nil {
		reply("ERR malformed request: %v", err)
		return
	}
	caller, err := s.identify(ctx, conn)
	if err != nil {
		fdpass.CloseFDs(fds)
		reply("ERR %s", oneLine(err.Error()))
		return
	}
	switch {
	case line == "PUT":
		if len(fds) != 1 {
			fdpass.CloseFDs(fds)
			reply("ERR PUT needs exactly one descriptor, got %d", len(fds))
			return
		}
		token, err := s.tokens.add(caller.Key, os.NewFile(uintptr(fds[0]), "caller-fd"), false)
		if err != nil {
			reply("ERR %s", oneLine(err.Error()))
			return
		}
		reply("OK %s", token)
	case strings.HasPrefix(line, "GET "):
		fdpass.CloseFDs(fds)
		f, err := s.tokens.take(caller.Key, strings.TrimPrefix(line, "GET "), true)
		if err != nil {
			reply("ERR %s", oneLine(err.Error()))
			return
		}
		defer f.Close()
		if _, _, err := conn.WriteMsgUnix([]byte("OK\n"), syscall.UnixRights(int(f.Fd())), nil); err != nil {
			return // the caller went away; its copy is closed with f
		}
	default:
		fdpass.CloseFDs(fds)
		reply("ERR unknown request %q (want PUT or GET <token>)", truncate(line, 32))
	}
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
