// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fdsocket

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// tempFiles makes n distinct files; their inodes tell them apart once they come back from the agent.
func tempFiles(t *testing.T, n int) []*os.File {
	t.Helper()
	dir := t.TempDir()
	files := make([]*os.File, n)
	for i := range files {
		f, err := os.Create(fmt.Sprintf("%s/f%d", dir, i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		files[i] = f
	}
	return files
}

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// sameFiles fails unless got are the same files as want, in order.
func sameFiles(t *testing.T, got, want []*os.File) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d files, want %d", len(got), len(want))
	}
	for i := range got {
		if inode(t, got[i]) != inode(t, want[i]) {
			t.Fatalf("file %d is inode %d, want %d (order lost)", i, inode(t, got[i]), inode(t, want[i]))
		}
	}
}

// rawPut sends line with files as rights in one message (none when files is empty) and returns the reply.
func rawPut(t *testing.T, path, line string, files []*os.File) string {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var rights []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		rights = syscall.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix([]byte(line), rights, nil); err != nil {
		t.Fatal(err)
	}
	reply, _ := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(reply)
}

// A PUT <n> of up to 253 descriptors gets one token that gives them back in order; fd_tokens concatenate.
func TestFDSocketPutManyKeepsOrder(t *testing.T) {
	s := &Socket{identify: anyone, timeout: 2 * time.Second, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	ctx := context.Background()
	files := tempFiles(t, fdpass.MaxPutFDs+3)
	first, err := fdpass.PutMany(ctx, path, files[:fdpass.MaxPutFDs])
	if err != nil {
		t.Fatal(err)
	}
	second, err := fdpass.PutMany(ctx, path, files[fdpass.MaxPutFDs:])
	if err != nil {
		t.Fatal(err)
	}
	if tok, fds := s.tokens.Waiting("local/uid=0"); tok != 2 || fds != len(files) {
		t.Fatalf("waiting: %d tokens, %d descriptors; want 2, %d", tok, fds, len(files))
	}
	// Fewer or more descriptors than the tokens name: refused, nothing taken.
	if _, err := s.tokens.TakeAll("local/uid=0", []string{first, second}, len(files)-1); err == nil {
		t.Fatal("takeAll of the wrong count succeeded")
	}
	got, err := s.tokens.TakeAll("local/uid=0", []string{first, second}, len(files))
	if err != nil {
		t.Fatal(err)
	}
	defer CloseFiles(got)
	sameFiles(t, got, files)
	if tok, fds := s.tokens.Waiting("local/uid=0"); tok != 0 || fds != 0 {
		t.Fatalf("after takeAll: %d tokens, %d descriptors wait", tok, fds)
	}
	// A multi-descriptor token where one descriptor goes (fd_token) is refused and stays usable.
	multi, err := fdpass.PutMany(ctx, path, files[:2])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.tokens.Take("local/uid=0", multi, false); err == nil || !strings.Contains(err.Error(), "names 2 descriptors") {
		t.Fatalf("take of a 2-descriptor token: %v", err)
	}
	got2, err := s.tokens.TakeAll("local/uid=0", []string{multi}, 2)
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(got2)
}

// Malformed PUTs are refused with a reason and every descriptor they carried is closed.
func TestFDSocketRefusesMalformedPuts(t *testing.T) {
	s := &Socket{identify: anyone, timeout: time.Second, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	files := tempFiles(t, 4)
	base := openFDCount(t)
	cases := []struct {
		line  string
		files []*os.File
		says  string
	}{
		{"PUT 3\n", files[:2], "announces 3 descriptors, got 2"},
		{"PUT 2\n", files[:3], "announces 2 descriptors, got 3"},
		{"PUT\n", files[:2], "announces 1 descriptors, got 2"},
		{"PUT 2\n", nil, "announces 2 descriptors, got 0"},
		{"PUT 0\n", files[:1], "count of 1 to 253"},
		{"PUT 254\n", files[:1], "count of 1 to 253"},
		{"PUT -1\n", files[:1], "count of 1 to 253"},
		{"PUT 02\n", files[:2], "count of 1 to 253"},
		{"PUT two\n", files[:2], "count of 1 to 253"},
		{"PUT 2 2\n", files[:2], "count of 1 to 253"},
		{"PUTS\n", files[:1], "unknown request"},
		{"\x00\xff\n", files[:4], "unknown request"},
	}
	before := s.edge.Value("fd", "malformed")
	for _, tc := range cases {
		if reply := rawPut(t, path, tc.line, tc.files); !strings.HasPrefix(reply, "ERR ") || !strings.Contains(reply, tc.says) {
			t.Errorf("%q with %d fds: %q, want ERR saying %q", tc.line, len(tc.files), reply, tc.says)
		}
	}
	if got := s.edge.Value("fd", "malformed") - before; got != float64(len(cases)) {
		t.Errorf("%v malformed refusals counted, want %d", got, len(cases))
	}
	if tok, fds := s.tokens.Waiting("local/uid=0"); tok != 0 || fds != 0 {
		t.Fatalf("refused PUTs left %d tokens, %d descriptors", tok, fds)
	}
	waitFDs(t, base)
}

// waitFDs waits for this process's open descriptors to come back to base (the agent closes refused ones
// after answering).
func waitFDs(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for openFDCount(t) > base {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open, %d before: refused descriptors were kept", openFDCount(t), base)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Descriptors sent after the message that starts the line are not part of the PUT: they are closed, and the
// count the line announced does not match.
func TestFDSocketPutTakesDescriptorsOfTheFirstMessageOnly(t *testing.T) {
	s := &Socket{identify: anyone, timeout: time.Second, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	files := tempFiles(t, 3)
	base := openFDCount(t)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.WriteMsgUnix([]byte("PU"), syscall.UnixRights(int(files[0].Fd())), nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the agent read the first message on its own
	if _, _, err := c.WriteMsgUnix([]byte("T 3\n"), syscall.UnixRights(int(files[1].Fd()), int(files[2].Fd())), nil); err != nil {
		t.Fatal(err)
	}
	reply, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(reply, "announces 3 descriptors, got 1") {
		t.Fatalf("PUT split over two messages: %q", reply)
	}
	c.Close()
	waitFDs(t, base)
}

// A caller that closes in the middle of a PUT <n> leaves nothing behind.
func TestFDSocketPutClosedMidMessage(t *testing.T) {
	s := &Socket{identify: anyone, timeout: 2 * time.Second, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	files := tempFiles(t, 100)
	base := openFDCount(t)
	for i := 0; i < 10; i++ {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		// The line never ends: the agent holds the descriptors until the connection goes.
		if _, _, err := c.WriteMsgUnix([]byte("PUT 100"), syscall.UnixRights(fds...), nil); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	waitFDs(t, base)
	if tok, n := s.tokens.Waiting("local/uid=0"); tok != 0 || n != 0 {
		t.Fatalf("half-sent PUTs left %d tokens, %d descriptors", tok, n)
	}
}

// The token store bounds the descriptors one caller, and all callers, keep waiting; refusals are
// RESOURCE_EXHAUSTED, close what was sent, and leave every other caller's tokens alone.
func TestFDTokensBoundDescriptors(t *testing.T) {
	tk := NewTokens(time.Minute, 64)
	tk.maxFDsPerOwner, tk.maxFDs = 10, 15
	defer tk.CloseAll()
	files := func(n int) []*os.File { return tempFiles(t, n) }
	a1, err := tk.AddFiles("pod/a", files(6), false)
	if err != nil {
		t.Fatal(err)
	}
	over := files(5)
	if _, err := tk.AddFiles("pod/a", over, false); err == nil || !strings.Contains(err.Error(), "limit of 10") {
		t.Fatalf("a's 11th descriptor: %v", err)
	}
	if _, err := over[0].Stat(); err == nil {
		t.Fatal("a refused PUT's descriptors were kept open")
	}
	b1, err := tk.AddFiles("pod/b", files(8), false)
	if err != nil {
		t.Fatalf("b under its own limit: %v", err)
	}
	if _, err := tk.AddFiles("pod/c", files(2), false); err == nil || !strings.Contains(err.Error(), "limit of 15") {
		t.Fatalf("c over the agent's limit: %v", err)
	}
	// Another caller's token: refused as if unknown, nothing of either caller taken.
	if _, err := tk.TakeAll("pod/b", []string{b1, a1}, 14); err == nil || !strings.Contains(err.Error(), "not yours") {
		t.Fatalf("b naming a's token: %v", err)
	}
	if _, err := tk.TakeAll("pod/b", []string{b1, b1}, 16); err == nil || !strings.Contains(err.Error(), "named twice") {
		t.Fatalf("a token named twice: %v", err)
	}
	if tok, n := tk.Waiting("pod/a"); tok != 1 || n != 6 {
		t.Fatalf("a's tokens after b's refusals: %d tokens, %d descriptors", tok, n)
	}
	if tok, n := tk.Waiting("pod/b"); tok != 1 || n != 8 {
		t.Fatalf("b's tokens after its refusals: %d tokens, %d descriptors", tok, n)
	}
	got, err := tk.TakeAll("pod/a", []string{a1}, 6)
	if err != nil {
		t.Fatal(err)
	}
	CloseFiles(got)
	// Expired tokens are closed and refused; the counts come back down.
	tk.ttl = 0
	b2, err := tk.AddFiles("pod/b", files(1), false)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond)
	if _, err := tk.TakeAll("pod/b", []string{b2}, 1); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired token: %v", err)
	}
	tk.Sweep(time.Now().Add(time.Hour))
	if tok, n := tk.Waiting("pod/b"); tok != 0 || n != 0 || tk.fds != 0 {
		t.Fatalf("after expiry: b %d tokens, %d descriptors; %d in all", tok, n, tk.fds)
	}
}

// Connections that each send a full PUT 253 without finishing the line hold at most one message's worth each,
// and only while they last.
func TestFDSocketPutManyFloodIsBounded(t *testing.T) {
	const maxConns = 4
	s := &Socket{identify: anyone, timeout: 500 * time.Millisecond, maxConns: maxConns, maxPerHolder: maxConns,
		maxPerCaller: maxConns, maxIdentified: maxConns, edge: refusals.NewEdge()}
	path := startFDSocket(t, s)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	fds := make([]int, fdpass.MaxPutFDs)
	for i := range fds {
		fds[i] = int(r.Fd())
	}
	rights := syscall.UnixRights(fds...)
	base := openFDCount(t)
	const conns = 12
	var held []*net.UnixConn
	for i := 0; i < conns; i++ {
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		for j := 0; j < 4; j++ {
			if _, _, err := c.WriteMsgUnix([]byte("P"), rights, nil); err != nil {
				break
			}
		}
	}
	time.Sleep(100 * time.Millisecond)
	peak := openFDCount(t) - base
	// Client side: conns connections. Agent: maxConns identified connections, each with one message's
	// descriptors kept and one more in hand, plus maxConns waiting to be identified.
	if bound := conns + maxConns*(1+2*fdpass.MaxPutFDs) + maxConns + 16; peak > bound {
		t.Fatalf("%d descriptors above the baseline, bound %d", peak, bound)
	}
	for _, c := range held {
		c.Close()
	}
	waitFDs(t, base)
}
