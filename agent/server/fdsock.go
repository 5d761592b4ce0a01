// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
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
		return "", fmt.Errorf("%w: %d descriptors already wait for a call from this caller (limit %d): use or let them expire", errFDExhausted, t.owned[owner], t.maxPerOwner)
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

// dropOwner closes the descriptors waiting for owner (a caller whose admission was revoked).
func (t *fdTokens) dropOwner(owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, e := range t.entries {
		if e.owner == owner {
			e.file.Close()
			delete(t.entries, k)
			t.owned[owner]--
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

// errFDExhausted marks fd-socket refusals that free up by themselves; the reply says RESOURCE_EXHAUSTED so
// clients back off and retry.
var errFDExhausted = errors.New("descriptor limit")

// Fd-socket connection limits. Every connection costs the agent one descriptor, plus at most fdpass.MaxFDs
// while a message is read and one kept for a PUT, and lives at most fdConnTimeout. Until it is identified a
// connection counts against defaultFDConns and defaultFDConnsPerUID (peer uid from SO_PEERCRED); once
// identified, against defaultFDConnsPerCaller (so an idle caller starves only itself) and
// defaultFDConnsIdentified in all. The socket thus holds at most
// (defaultFDConns+defaultFDConnsIdentified)*(2+fdpass.MaxFDs) descriptors however many processes push at it.
const (
	fdConnTimeout            = fdpass.DefaultTimeout
	defaultFDConns           = 256
	defaultFDConnsPerUID     = 64
	defaultFDConnsPerCaller  = 32
	defaultFDConnsIdentified = 1024
)

// fdSocket serves agent.fd.sock.
type fdSocket struct {
	ln       *net.UnixListener
	tokens   *fdTokens
	identify func(ctx context.Context, conn *net.UnixConn) (Caller, error)
	// timeout bounds one connection from accept to close (default fdConnTimeout); maxConns and maxPerUID
	// bound the connections open at once, in all and per peer uid (defaults defaultFDConns and
	// defaultFDConnsPerUID). Over a limit a connection is answered RESOURCE_EXHAUSTED and closed at once.
	timeout   time.Duration
	maxConns  int
	maxPerUID int
	// maxPerCaller and maxIdentified bound identified connections, per caller key and in all.
	maxPerCaller  int
	maxIdentified int

	// edge counts the socket's refusals (the server's edge_refusals_total).
	edge edgeCounter

	mu           sync.Mutex
	unidentified connCount[int32]  // by peer uid, until identification
	identified   connCount[string] // by caller key
}

func (s *fdSocket) serve(ctx context.Context) {
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				s.edge.refused("fd", "accept_emfile")
				time.Sleep(10 * time.Millisecond) // out of descriptors: let connections end before accepting more
				continue
			}
			return // listener closed on shutdown
		}
		cred, err := PeerCredOf(conn)
		if err != nil {
			s.edge.refused("fd", "no_peercred")
			conn.Close()
			continue
		}
		if why := s.enter(cred.UID); why != "" {
			s.edge.refused("fd", "busy")
			_ = conn.SetDeadline(time.Now().Add(100 * time.Millisecond))
			_, _ = fmt.Fprintf(conn, "ERR %s%s\n", fdpass.ExhaustedPrefix, why)
			conn.Close()
			continue
		}
		go s.handle(ctx, conn, cred.UID)
	}
}

// connCount counts open connections in all and per key.
type connCount[K comparable] struct {
	total int
	per   map[K]int
}

// enter counts a connection of key unless it would pass max in all or maxPer for the key; it returns the
// counts it found, and whether it entered.
func (c *connCount[K]) enter(key K, max, maxPer int) (total, mine int, ok bool) {
	if c.per == nil {
		c.per = map[K]int{}
	}
	total, mine = c.total, c.per[key]
	if total >= max || mine >= maxPer {
		return total, mine, false
	}
	c.total++
	c.per[key]++
	return total, mine, true
}

func (c *connCount[K]) leave(key K) {
	c.total--
	if c.per[key]--; c.per[key] <= 0 {
		delete(c.per, key)
	}
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}

// enter counts a connection of uid, or says which limit refuses it.
func (s *fdSocket) enter(uid int32) string {
	maxConns, maxPerUID := orDefault(s.maxConns, defaultFDConns), orDefault(s.maxPerUID, defaultFDConnsPerUID)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch total, mine, ok := s.unidentified.enter(uid, maxConns, maxPerUID); {
	case ok:
		return ""
	case total >= maxConns:
		return fmt.Sprintf("%d connections are open on the fd socket (limit %d)", total, maxConns)
	default:
		return fmt.Sprintf("uid %d has %d connections open on the fd socket (limit %d)", uid, mine, maxPerUID)
	}
}

func (s *fdSocket) leave(uid int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unidentified.leave(uid)
}

// enterCaller counts an identified connection of caller key, or says which limit refuses it.
func (s *fdSocket) enterCaller(key string) string {
	maxPerCaller, maxIdentified := orDefault(s.maxPerCaller, defaultFDConnsPerCaller), orDefault(s.maxIdentified, defaultFDConnsIdentified)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch total, mine, ok := s.identified.enter(key, maxIdentified, maxPerCaller); {
	case ok:
		return ""
	case total >= maxIdentified:
		return fmt.Sprintf("%d identified connections are open on the fd socket (limit %d)", total, maxIdentified)
	default:
		return fmt.Sprintf("this caller has %d connections open on the fd socket (limit %d)", mine, maxPerCaller)
	}
}

func (s *fdSocket) leaveCaller(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.identified.leave(key)
}

func (s *fdSocket) handle(ctx context.Context, conn *net.UnixConn, uid int32) {
	defer conn.Close()
	unidentified := true
	defer func() {
		if unidentified {
			s.leave(uid)
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
		if errors.Is(err, errFDExhausted) {
			reply("ERR %s%s", fdpass.ExhaustedPrefix, oneLine(err.Error()))
			return
		}
		reply("ERR %s", oneLine(err.Error()))
	}

	// Identify before reading: descriptors a refused caller sent stay in the socket's queue and the kernel
	// closes them with the connection, so an unidentified process never makes the agent hold any.
	caller, err := s.identify(ctx, conn)
	s.leave(uid)
	unidentified = false
	if err != nil {
		s.edge.refused("fd", "unidentified")
		refuse(err)
		return
	}
	if why := s.enterCaller(caller.Key); why != "" {
		s.edge.refused("fd", "busy")
		reply("ERR %s%s", fdpass.ExhaustedPrefix, why)
		return
	}
	defer s.leaveCaller(caller.Key)
	// One descriptor is the most any request carries; the rest are closed as they arrive.
	line, fds, err := fdpass.ReadLineFDs(conn, 1)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.edge.refused("fd", "deadline")
		} else {
			s.edge.refused("fd", "malformed")
		}
		_ = conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond)) // past the deadline: still say why
		reply("ERR malformed request: %v", oneLine(err.Error()))
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
			s.edge.refused("fd", "tokens")
			refuse(err)
			return
		}
		reply("OK %s", token)
	case strings.HasPrefix(line, "GET "):
		fdpass.CloseFDs(fds)
		f, err := s.tokens.take(caller.Key, strings.TrimPrefix(line, "GET "), true)
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
		s.edge.refused("fd", "malformed")
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
