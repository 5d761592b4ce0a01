// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdsocket

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// Tokens holds descriptors in transit between the fd socket and gRPC calls. A token is one-time, bound to
// the caller key that created it (or that it was lent to), and expires; expired descriptors are closed. A token
// names one descriptor, or the ordered descriptors of one "PUT <n>".
//
// Three bounds keep a caller from making the agent hold descriptors without end: tokens per caller
// (maxPerOwner), descriptors per caller (maxFDsPerOwner: enough for the largest region the agent maps, a full
// engines.MaxVMMAllocations, plus single-fd traffic beside it) and descriptors in all (maxFDs). Over any of
// them a PUT is refused RESOURCE_EXHAUSTED and its descriptors closed; what others hold is untouched.
type Tokens struct {
	ttl            time.Duration
	maxPerOwner    int
	maxFDsPerOwner int
	maxFDs         int

	mu      sync.Mutex
	entries map[string]*fdEntry
	owned   map[string]int // tokens by owner
	ownedFD map[string]int // descriptors by owner
	fds     int            // descriptors in all
}

type fdEntry struct {
	files    []*os.File
	owner    string
	expires  time.Time
	outbound bool // lent by the agent: fetched with GET, never consumed by RegisterMemory
}

// Descriptor bounds of the token store (see Tokens).
const (
	defaultFDsPerOwner = engines.MaxVMMAllocations + 64
	defaultFDsWaiting  = 8 * defaultFDsPerOwner
)

// NewTokens makes a token store whose tokens live ttl, at most maxPerOwner of them waiting per caller.
func NewTokens(ttl time.Duration, maxPerOwner int) *Tokens {
	return &Tokens{ttl: ttl, maxPerOwner: maxPerOwner, maxFDsPerOwner: defaultFDsPerOwner, maxFDs: defaultFDsWaiting,
		entries: map[string]*fdEntry{}, owned: map[string]int{}, ownedFD: map[string]int{}}
}

// NewToken makes a random one-time token (fd tokens, fast-path tokens).
func NewToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("making a token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// CloseFiles closes every file of files.
func CloseFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// add stores f for owner and returns its token. On error f is closed.
func (t *Tokens) Add(owner string, f *os.File, outbound bool) (string, error) {
	return t.AddFiles(owner, []*os.File{f}, outbound)
}

// addFiles stores files, in order, for owner under one token. On error every file is closed.
func (t *Tokens) AddFiles(owner string, files []*os.File, outbound bool) (string, error) {
	token, err := NewToken()
	if err != nil {
		CloseFiles(files)
		return "", err
	}
	if err := t.admit(owner, token, files, outbound); err != nil {
		CloseFiles(files) // after the lock: closing a caller's descriptor may take as long as the caller wants
		return "", err
	}
	return token, nil
}

// admit stores files under token unless one of the limits refuses them.
func (t *Tokens) admit(owner, token string, files []*os.File, outbound bool) error {
	n := len(files)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.owned[owner] >= t.maxPerOwner:
		return fmt.Errorf("%w: %d tokens already wait for a call from this caller (limit %d): use or let them expire", ErrExhausted, t.owned[owner], t.maxPerOwner)
	case t.ownedFD[owner]+n > t.maxFDsPerOwner:
		return fmt.Errorf("%w: %d descriptors already wait for a call from this caller, %d more would pass the limit of %d: use or let them expire",
			ErrExhausted, t.ownedFD[owner], n, t.maxFDsPerOwner)
	case t.fds+n > t.maxFDs:
		return fmt.Errorf("%w: %d descriptors wait for calls on this agent, %d more would pass the limit of %d", ErrExhausted, t.fds, n, t.maxFDs)
	}
	t.entries[token] = &fdEntry{files: files, owner: owner, expires: time.Now().Add(t.ttl), outbound: outbound}
	t.owned[owner]++
	t.ownedFD[owner] += n
	t.fds += n
	return nil
}

// forgetLocked drops the entry of token from the counts and the map (its files are the caller's to close).
func (t *Tokens) forgetLocked(token string, e *fdEntry) {
	delete(t.entries, token)
	t.owned[e.owner]--
	t.ownedFD[e.owner] -= len(e.files)
	t.fds -= len(e.files)
	if t.owned[e.owner] <= 0 {
		delete(t.owned, e.owner)
		delete(t.ownedFD, e.owner)
	}
}

// take removes and returns the one descriptor behind token if owner may use it in this direction.
func (t *Tokens) Take(owner, token string, outbound bool) (*os.File, error) {
	e, err := t.takeOne(owner, token, outbound)
	if err != nil {
		return nil, err
	}
	if time.Now().After(e.expires) {
		CloseFiles(e.files) // after the lock: closing a caller's descriptor may take as long as the caller wants
		return nil, fmt.Errorf("fd token %.8s… expired (tokens live %s)", token, t.ttl)
	}
	return e.files[0], nil
}

// takeOne removes and returns the entry of token if owner may use it in this direction and it holds one
// descriptor.
func (t *Tokens) takeOne(owner, token string, outbound bool) (*fdEntry, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.checkLocked(owner, token, outbound)
	if err != nil {
		return nil, err
	}
	if len(e.files) != 1 {
		// Left waiting: the caller named a multi-descriptor token where one descriptor goes.
		return nil, fmt.Errorf("fd token %.8s… names %d descriptors where one is expected (name it in fd_tokens)", token, len(e.files))
	}
	t.forgetLocked(token, e)
	return e, nil
}

func (t *Tokens) checkLocked(owner, token string, outbound bool) (*fdEntry, error) {
	e, ok := t.entries[token]
	if !ok || e.owner != owner || e.outbound != outbound {
		// One message for all three: a token of another caller must not be distinguishable from none.
		return nil, fmt.Errorf("fd token %.8s… is unknown, expired, already used or not yours", token)
	}
	return e, nil
}

// takeAll removes and returns, in order, the want descriptors behind tokens (owner's, inbound). It is all or
// nothing: when a token is unknown, another caller's or named twice, or the tokens name other than want
// descriptors, nothing is taken and the caller's tokens keep waiting (until used or expired); an expired token
// among them is closed and the call refused.
func (t *Tokens) TakeAll(owner string, tokens []string, want int) ([]*os.File, error) {
	if len(tokens) == 0 {
		return nil, errors.New("no fd tokens")
	}
	if len(tokens) > want {
		return nil, fmt.Errorf("%d fd tokens name more than the %d descriptors expected", len(tokens), want)
	}
	var expired []*os.File
	defer func() { CloseFiles(expired) }() // after the lock (deferred calls run in reverse order)
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := make(map[string]struct{}, len(tokens))
	n := 0
	var stale []string
	now := time.Now()
	for i, tok := range tokens {
		if _, dup := seen[tok]; dup {
			return nil, fmt.Errorf("fd token %.8s… is named twice (fd_tokens[%d])", tok, i)
		}
		seen[tok] = struct{}{}
		e, err := t.checkLocked(owner, tok, false)
		if err != nil {
			return nil, fmt.Errorf("fd_tokens[%d]: %w", i, err)
		}
		if now.After(e.expires) {
			stale = append(stale, tok)
		}
		n += len(e.files)
	}
	if len(stale) > 0 {
		for _, tok := range stale {
			e := t.entries[tok]
			t.forgetLocked(tok, e)
			expired = append(expired, e.files...)
		}
		return nil, fmt.Errorf("fd token %.8s… expired (tokens live %s)", stale[0], t.ttl)
	}
	if n != want {
		return nil, fmt.Errorf("fd tokens name %d descriptors, %d expected", n, want)
	}
	files := make([]*os.File, 0, n)
	for _, tok := range tokens {
		e := t.entries[tok]
		t.forgetLocked(tok, e)
		files = append(files, e.files...)
	}
	return files, nil
}

// waiting reports how many tokens and descriptors wait for owner.
func (t *Tokens) Waiting(owner string) (tokens, fds int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.owned[owner], t.ownedFD[owner]
}

// sweep closes expired descriptors.
func (t *Tokens) Sweep(now time.Time) {
	t.closeOutside(t.drop(func(e *fdEntry) bool { return now.After(e.expires) }))
}

// dropOwner closes the descriptors waiting for owner (a caller whose admission was revoked).
func (t *Tokens) DropOwner(owner string) {
	t.closeOutside(t.drop(func(e *fdEntry) bool { return e.owner == owner }))
}

// drop forgets the entries that match and returns their descriptors.
func (t *Tokens) drop(match func(*fdEntry) bool) []*os.File {
	t.mu.Lock()
	defer t.mu.Unlock()
	var files []*os.File
	for k, e := range t.entries {
		if match(e) {
			t.forgetLocked(k, e)
			files = append(files, e.files...)
		}
	}
	return files
}

// closeOutside closes descriptors callers passed away from everyone's path: closing one can block as long as
// its maker wants (a socket lingering on a peer that does not read, a file system that does not answer the
// flush), and the sweep, a revocation or a stopping agent must not wait for that, nor anyone behind the lock.
func (t *Tokens) closeOutside(files []*os.File) {
	if len(files) > 0 {
		go CloseFiles(files)
	}
}

// CloseAll closes every waiting descriptor (the server stopping).
func (t *Tokens) CloseAll() {
	t.closeOutside(t.drop(func(*fdEntry) bool { return true }))
}

// ErrExhausted marks fd-socket refusals that free up by themselves; the reply says RESOURCE_EXHAUSTED so
// clients back off and retry.
var ErrExhausted = errors.New("descriptor limit")

// Fd-socket connection limits. Every connection costs the agent one descriptor and lives at most
// fdConnTimeout. Until it is identified a connection counts against defaultFDConns and defaultFDConnsPerHolder
// (its pod, or the uid of a process in none: identity.Identifier.HolderOf) and nothing is read from it, so it
// brings in no descriptor; once identified, against defaultFDConnsPerCaller (so an idle caller starves only
// itself) and defaultFDConnsIdentified in all,
// and it holds at most 2*fdpass.MaxPutFDs descriptors while its request is read (the ones of the first message,
// which a PUT <n> carries, plus one more message's worth closed as soon as it arrives). The socket thus holds at most
// defaultFDConns + defaultFDConnsIdentified*(1+2*fdpass.MaxPutFDs) descriptors however many processes push at
// it, a single caller defaultFDConnsPerCaller*(1+2*fdpass.MaxPutFDs); accepted PUTs then count against the
// token store's bounds (Tokens).
const (
	fdConnTimeout            = fdpass.DefaultTimeout
	defaultFDConns           = 256
	defaultFDConnsPerHolder  = 64
	defaultFDConnsPerCaller  = 32
	defaultFDConnsIdentified = 1024
)

// Socket serves agent.fd.sock.
type Socket struct {
	ln       *net.UnixListener
	tokens   *Tokens
	identify func(ctx context.Context, conn *net.UnixConn) (identity.Caller, error)
	// timeout bounds one connection from accept to close (default fdConnTimeout); maxConns and maxPerHolder
	// bound the connections waiting to be identified, in all and per holder (defaults defaultFDConns and
	// defaultFDConnsPerHolder). Over a limit a connection is answered RESOURCE_EXHAUSTED and closed at once.
	timeout      time.Duration
	maxConns     int
	maxPerHolder int
	// holderOf names whom a connection not identified yet counts against; nil: its peer's uid.
	holderOf func(*net.UnixConn, identity.PeerCred) string
	// maxPerCaller and maxIdentified bound identified connections, per caller key and in all.
	maxPerCaller  int
	maxIdentified int

	// edge counts the socket's refusals (the server's edge_refusals_total).
	edge refusals.Edge

	mu           sync.Mutex
	unidentified sockio.Counts[string] // by holder, until identification
	identified   sockio.Counts[string] // by caller key
}

// NewSocket serves the fd socket on ln: descriptors callers PUT wait in tokens for the gRPC call that names
// them; identify says who is behind a connection (and refuses callers the pool does not admit); edge counts the
// socket's refusals.
func NewSocket(ln *net.UnixListener, tokens *Tokens, identify func(ctx context.Context, conn *net.UnixConn) (identity.Caller, error),
	holderOf func(*net.UnixConn, identity.PeerCred) string, edge refusals.Edge) *Socket {
	return &Socket{ln: ln, tokens: tokens, identify: identify, holderOf: holderOf, edge: edge}
}

// Serve accepts connections until the listener is closed.
func (s *Socket) Serve(ctx context.Context) {
	for {
		conn, err := sockio.Accept(s.ln.AcceptUnix, func() { s.edge.Refused("fd", "accept_emfile") })
		if err != nil {
			return // listener closed on shutdown
		}
		cred, err := identity.PeerCredOf(conn)
		if err != nil {
			s.edge.Refused("fd", "no_peercred")
			conn.Close()
			continue
		}
		holder := fmt.Sprintf("uid=%d", cred.UID)
		if s.holderOf != nil {
			holder = s.holderOf(conn, cred)
		}
		if why := s.enter(holder); why != "" {
			s.edge.Refused("fd", "busy")
			_ = conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = fmt.Fprintf(conn, "ERR %s%s\n", fdpass.ExhaustedPrefix, why)
			conn.Close()
			continue
		}
		go s.handle(ctx, conn, holder)
	}
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// enter counts a connection of holder, or says which limit refuses it.
func (s *Socket) enter(holder string) string {
	maxConns, maxPerHolder := orDefault(s.maxConns, defaultFDConns), orDefault(s.maxPerHolder, defaultFDConnsPerHolder)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch total, mine, ok := s.unidentified.Enter(holder, maxConns, maxPerHolder); {
	case ok:
		return ""
	case total >= maxConns:
		return fmt.Sprintf("%d connections are open on the fd socket (limit %d)", total, maxConns)
	default:
		return fmt.Sprintf("%s has %d connections open on the fd socket (limit %d)", holder, mine, maxPerHolder)
	}
}

func (s *Socket) leave(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unidentified.Leave(holder)
}

// enterCaller counts an identified connection of caller key, or says which limit refuses it.
func (s *Socket) enterCaller(key string) string {
	maxPerCaller, maxIdentified := orDefault(s.maxPerCaller, defaultFDConnsPerCaller), orDefault(s.maxIdentified, defaultFDConnsIdentified)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch total, mine, ok := s.identified.Enter(key, maxIdentified, maxPerCaller); {
	case ok:
		return ""
	case total >= maxIdentified:
		return fmt.Sprintf("%d identified connections are open on the fd socket (limit %d)", total, maxIdentified)
	default:
		return fmt.Sprintf("this caller has %d connections open on the fd socket (limit %d)", mine, maxPerCaller)
	}
}

func (s *Socket) leaveCaller(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.identified.Leave(key)
}

func (s *Socket) handle(ctx context.Context, conn *net.UnixConn, holder string) {
	defer conn.Close()
	unidentified := true
	defer func() {
		if unidentified {
			s.leave(holder)
		}
	}()
	timeout := s.timeout
	if timeout <= 0 {
		timeout = fdConnTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	reply := func(format string, args ...any) { _, _ = fmt.Fprintf(conn, format+"\n", args...) }
	refuse := func(err error) {
		if errors.Is(err, ErrExhausted) {
			reply("ERR %s%s", fdpass.ExhaustedPrefix, oneLine(err.Error()))
			return
		}
		reply("ERR %s", oneLine(err.Error()))
	}

	// Identify before reading: descriptors a refused caller sent stay in the socket's queue and the kernel
	// closes them with the connection, so an unidentified process never makes the agent hold any.
	caller, err := s.identify(ctx, conn)
	s.leave(holder)
	unidentified = false
	if err != nil {
		s.edge.Refused("fd", "unidentified")
		refuse(err)
		return
	}
	if why := s.enterCaller(caller.Key); why != "" {
		s.edge.Refused("fd", "busy")
		reply("ERR %s%s", fdpass.ExhaustedPrefix, why)
		return
	}
	defer s.leaveCaller(caller.Key)
	// A PUT <n> carries at most fdpass.MaxPutFDs descriptors, in the message that starts its line; any beyond,
	// or arriving later, are closed as they arrive.
	line, fds, err := fdpass.ReadRequestFDs(conn, fdpass.MaxPutFDs)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.edge.Refused("fd", "deadline")
		} else {
			s.edge.Refused("fd", "malformed")
		}
		_ = conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) // past the deadline: still say why
		reply("ERR malformed request: %v", oneLine(err.Error()))
		return
	}
	switch {
	case line == "PUT" || strings.HasPrefix(line, "PUT "):
		want, err := putCount(line)
		if err != nil {
			fdpass.CloseFDs(fds)
			s.edge.Refused("fd", "malformed")
			reply("ERR %s", err)
			return
		}
		if len(fds) != want {
			fdpass.CloseFDs(fds)
			s.edge.Refused("fd", "malformed")
			reply("ERR %s announces %d descriptors, got %d (send them with the line, in one message)", truncate(line, 16), want, len(fds))
			return
		}
		if err := notMemory(fds); err != nil {
			s.edge.Refused("fd", "not_memory")
			reply("ERR %s%s", fdpass.NotMemoryPrefix, err)
			fdpass.CloseFDs(fds) // after the answer: closing may take as long as the caller made it
			return
		}
		files := make([]*os.File, len(fds))
		for i, fd := range fds {
			files[i] = os.NewFile(uintptr(fd), "caller-fd")
		}
		token, err := s.tokens.AddFiles(caller.Key, files, false)
		if err != nil {
			s.edge.Refused("fd", "tokens")
			refuse(err)
			return
		}
		reply("OK %s", token)
	case strings.HasPrefix(line, "GET "):
		fdpass.CloseFDs(fds)
		f, err := s.tokens.Take(caller.Key, strings.TrimPrefix(line, "GET "), true)
		if err != nil {
			refuse(err)
			return
		}
		defer f.Close()
		if _, _, err := conn.WriteMsgUnix([]byte("OK\n"), syscall.UnixRights(int(f.Fd())), nil); err != nil {
			return // the caller went away; its copy is closed with f
		}
	default:
		fdpass.CloseFDs(fds)
		s.edge.Refused("fd", "malformed")
		reply("ERR unknown request %q (want PUT or GET <token>)", truncate(line, 32))
	}
}

// notMemory refuses descriptors that cannot be memory by their type, before the agent holds them: memory comes
// as a memfd, a VMM allocation's handle or a dma-buf, never a socket, pipe, directory or block device, nor a file
// of a FUSE file system. Those are what closing can stall on (a socket lingering toward a peer that does not
// read, a FUSE daemon that does not answer the flush); the agent closes descriptors it was handed as tokens
// expire and callers go. Whatever passes is checked again where it is used.
func notMemory(fds []int) error {
	for i, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("descriptor %d: %w", i, err)
		}
		kind := ""
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFSOCK:
			kind = "a socket"
		case unix.S_IFIFO:
			kind = "a pipe"
		case unix.S_IFDIR:
			kind = "a directory"
		case unix.S_IFBLK:
			kind = "a block device"
		case unix.S_IFREG:
			var fs unix.Statfs_t
			if err := unix.Fstatfs(fd, &fs); err == nil && fs.Type == unix.FUSE_SUPER_MAGIC {
				kind = "a file of a FUSE file system"
			}
		}
		if kind != "" {
			return fmt.Errorf("descriptor %d is %s (pass a memfd, a VMM allocation's handle or a dma-buf)", i, kind)
		}
	}
	return nil
}

// putCount is how many descriptors a PUT line announces: "PUT" one, "PUT <n>" n (1 to fdpass.MaxPutFDs).
func putCount(line string) (int, error) {
	if line == "PUT" {
		return 1, nil
	}
	arg := strings.TrimPrefix(line, "PUT ")
	n, err := strconv.Atoi(arg)
	if err != nil || n < 1 || n > fdpass.MaxPutFDs || strconv.Itoa(n) != arg {
		return 0, fmt.Errorf("PUT takes a count of 1 to %d descriptors, not %q", fdpass.MaxPutFDs, truncate(arg, 16))
	}
	return n, nil
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
