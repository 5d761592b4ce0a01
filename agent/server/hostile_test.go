// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket/fdsockettest"
	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
	"github.com/fabricxfer/fabricxfer/internal/sockio"
)

// hostileBed is an agent with a victim pod holding two regions of known bytes; every hostile case ends by
// checking that the agent is up, the victim's regions and bytes are untouched, and a new client registers
// and transfers.
type hostileBed struct {
	a      *agent
	proc   *procFixture
	victim *client.Client
	src    *client.SharedMemory
	dst    *client.SharedMemory
	rs, rd *client.Region
	want   []byte
}

func newHostileBed(t *testing.T) *hostileBed {
	t.Helper()
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Policy = identity.StaticPolicy{"infer"}
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, AllowLocal: true,
		Pods: pods{podInfer: {Namespace: "infer", Name: "victim-0"}, podFresh: {Namespace: "infer", Name: "fresh-0"}}}
	b := &hostileBed{a: startAgent(t, opts), proc: proc}
	proc.setPod(t, podInfer)
	b.victim = dial(t, b.a)
	b.src, b.dst = shm(t, 1<<20), shm(t, 1<<20)
	fill(t, b.src.Bytes)
	var err error
	if b.rs, err = b.victim.RegisterHost(ctxT(t), b.src.File, 0, b.src.Size()); err != nil {
		t.Fatal(err)
	}
	if b.rd, err = b.victim.RegisterHost(ctxT(t), b.dst.File, 0, b.dst.Size()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.victim.Write(ctxT(t), b.rs, 0, client.ToRegion(b.rd), 0, b.src.Size()); err != nil {
		t.Fatal(err)
	}
	b.want = bytes.Clone(b.dst.Bytes)
	proc.setLocal(t)
	return b
}

// podFresh is the pod of the client that checks a new caller is still served (another identity than the
// hostile local process, which may exhaust its own limits).
const podFresh = "bbbbbbbb-cccc-dddd-eeee-ffffffffffff"

// check asserts the agent survived: the victim's bytes are as they were, its regions still transfer, and a
// new client of another pod registers and transfers.
func (b *hostileBed) check(t *testing.T) {
	t.Helper()
	select {
	case err := <-b.a.done:
		t.Fatalf("the agent stopped: %v", err)
	default:
	}
	if !bytes.Equal(b.dst.Bytes, b.want) || !bytes.Equal(b.src.Bytes, b.want) {
		t.Fatal("the victim's bytes changed")
	}
	b.proc.setPod(t, podInfer)
	if _, err := b.victim.Write(ctxT(t), b.rs, 0, client.ToRegion(b.rd), 0, b.src.Size()); err != nil {
		t.Fatalf("the victim's transfer: %v", err)
	}
	if !bytes.Equal(b.dst.Bytes, b.want) {
		t.Fatal("the victim's transfer moved other bytes")
	}
	b.proc.setPod(t, podFresh)
	defer b.proc.setLocal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, b.a.srv.SocketPath())
	if err != nil {
		t.Fatalf("a new client cannot dial: %v", err)
	}
	defer c.Close()
	s, d := shm(t, 64<<10), shm(t, 64<<10)
	fill(t, s.Bytes)
	// Identities are read from the fixture when a connection is identified, and all connections of this test
	// come from one process: hostile fd-socket connections still waiting to be identified when the fixture
	// turned to podFresh count as podFresh's, until their deadline closes them. So the fresh client may wait
	// out that deadline (5 s), as a pod whose own connections hung would.
	var rs *client.Region
	for {
		rs, err = c.RegisterHost(ctx, s.File, 0, s.Size())
		if client.Code(err) != codes.ResourceExhausted || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("a new client cannot register: %v", err)
	}
	rd, err := c.RegisterHost(ctx, d.File, 0, d.Size())
	if err != nil {
		t.Fatalf("a new client cannot register: %v", err)
	}
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, s.Size()); err != nil || !bytes.Equal(s.Bytes, d.Bytes) {
		t.Fatalf("a new client's transfer: %v", err)
	}
}

func (b *hostileBed) sockets() map[string]string {
	return map[string]string{"agent.sock": b.a.srv.SocketPath(), "agent.fd.sock": b.a.srv.FDSocketPath(),
		"agent.fast.sock": b.a.srv.FastSocketPath()}
}

func rawDial(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatalf("dialing %s: %v", path, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// Idle, half-open, garbage and oversized input on each of the three sockets.
func TestHostileConnectionsOnEverySocket(t *testing.T) {
	b := newHostileBed(t)
	half := map[string][]byte{
		"agent.sock":      []byte("PRI * HTTP/2.0\r\n"), // half the HTTP/2 preface
		"agent.fd.sock":   []byte("PU"),
		"agent.fast.sock": {0, 0}, // half a frame header
	}
	garbage := map[string][][]byte{
		"agent.sock":      {randomBytes(64 << 10), append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), randomBytes(4096)...)},
		"agent.fd.sock":   {bytes.Repeat([]byte("A"), 4096), []byte("GARBAGE\n"), []byte("GET \n"), append(randomBytes(100), '\n')},
		"agent.fast.sock": {{0xff, 0xff, 0xff, 0xff}, {0, 0, 0, 64, 1, 2, 3}, append([]byte{0, 0, 0, 32}, randomBytes(32)...)},
	}
	// Every connection stays open until the test ends (rawDial closes it then).
	for name, path := range b.sockets() {
		for i := 0; i < 8; i++ {
			rawDial(t, path) // idle: connect, send nothing
		}
		c := rawDial(t, path)
		if _, err := c.Write(half[name]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, g := range garbage[name] {
			_, _ = rawDial(t, path).Write(g)
		}
	}
	b.check(t) // while all of them are held
	// The fd socket closes idle and half-open connections at its deadline (5 s).
	time.Sleep(6 * time.Second)
	b.check(t)
}

// Unauthenticated connections to the fd socket that sit idle are closed within 10 s.
func TestHostileIdleFDConnectionsAreClosed(t *testing.T) {
	b := newHostileBed(t)
	c := rawDial(t, b.a.srv.FDSocketPath())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil && time.Since(start) >= 10*time.Second {
		t.Fatalf("idle fd connection still open after %s", time.Since(start))
	}
	buf := make([]byte, 1)
	if _, err := c.Read(buf); err == nil {
		t.Fatal("idle fd connection still open after its refusal")
	}
	b.check(t)
}

// Connections pushing descriptors as fast as they can leave the agent with a bounded number of them.
func TestHostileFDFlood(t *testing.T) {
	b := newHostileBed(t)
	const conns = 21
	peak := fdsockettest.FloodPeak(t, b.a.srv.FDSocketPath(), conns, 255, time.Second)
	// The flood's own connections, plus what the fd socket may hold: 64 connections of the flood's uid, each
	// with one message's descriptors in hand and one kept.
	if bound := conns + 64*6 + 64; peak > bound {
		t.Fatalf("%d descriptors above the baseline at the flood's peak, bound %d", peak, bound)
	}
	t.Logf("peak %d descriptors above the baseline", peak)
	b.check(t)
}

// A thousand idle connections to each socket: the agent stays up and serves others.
func TestHostileThousandIdleConnections(t *testing.T) {
	b := newHostileBed(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(b.a.srv.Collector())
	for _, path := range b.sockets() {
		for i := 0; i < 1000; i++ {
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("connection %d to %s: %v", i, path, err)
			}
			defer c.Close()
		}
	}
	// The fast socket names a connection's holder from its process's cgroup, which this test's fixture turns to
	// another pod for the check: wait until the agent has counted (64) or refused (936) every silent one as this
	// local process's, as it would at once for connections of two processes.
	deadline := time.Now().Add(10 * time.Second)
	for promtest.Gather(t, reg)["fabricxfer_agent_edge_refusals_total{reason=busy,socket=fast}"] < 1000-64 {
		if time.Now().After(deadline) {
			t.Fatal("the fast socket did not refuse the silent connections past 64 within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.check(t)
}

// Unsealed and truncated memory is refused; the agent keeps serving.
func TestHostileUnsealedAndTruncatedMemory(t *testing.T) {
	b := newHostileBed(t)
	c := dial(t, b.a)
	unsealed := memfd(t, 1<<20, 0x0002) // MFD_ALLOW_SEALING, left unsealed
	if err := registerRaw(t, b.a, c, unsealed, 0, 1<<20); client.Code(err) != codes.InvalidArgument {
		t.Fatalf("unsealed memfd: %v", err)
	}
	sealed := memfd(t, 1<<20, 0x0002)
	if err := client.SealShrink(sealed); err != nil {
		t.Fatal(err)
	}
	if err := sealed.Truncate(4096); err == nil {
		t.Fatal("truncated a sealed memfd")
	}
	short := memfd(t, 1<<20, 0x0002)
	_ = short.Truncate(4096) // shrunk before sealing: too short for the range
	_ = client.SealShrink(short)
	if err := registerRaw(t, b.a, c, short, 0, 1<<20); client.Code(err) != codes.InvalidArgument {
		t.Fatalf("truncated memfd: %v", err)
	}
	b.check(t)
}

// A hugetlb memfd is a sealed memfd too, but its pages can vanish under the agent's mapping (a hole punched while
// the huge page pool is taken: SIGBUS in the agent) and it cannot be unmapped in the pieces the agent maps (every
// mailbox of one leaked a mapping until the agent ran out of them): it is refused as memory, as a mailbox and as an
// id arena, saying why, and the agent keeps serving. The memfd needs no huge pages to exist.
func TestHostileHugetlbMemoryIsRefused(t *testing.T) {
	b := newHostileBed(t)
	c := dial(t, b.a)
	fd, err := unix.MemfdCreate("hostile-huge", unix.MFD_CLOEXEC|unix.MFD_HUGETLB|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Skipf("this kernel makes no hugetlb memfd (%v)", err)
	}
	huge := os.NewFile(uintptr(fd), "hostile-huge")
	defer huge.Close()
	if err := huge.Truncate(2 << 20); err != nil {
		t.Fatal(err)
	}
	if err := client.SealShrink(huge); err != nil {
		t.Fatal(err)
	}
	err = registerRaw(t, b.a, c, huge, 0, 1<<20)
	if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "hugetlb") {
		t.Fatalf("hugetlb memfd registered: %v, want InvalidArgument naming hugetlb", err)
	}
	for _, what := range []string{"mailbox", "id arena"} {
		if err := setFastMemory(t, b.a, what, huge, 16<<10); err == nil || !strings.Contains(err.Error(), "hugetlb") {
			t.Errorf("hugetlb memfd as the fast connection's %s: %v, want a refusal naming hugetlb", what, err)
		}
	}
	b.check(t)
}

// Descriptors that cannot be memory are refused on the fd socket before the agent holds them, saying what they
// are: closing one can stall as long as its maker wants (a socket lingering toward a peer that never reads held
// the token store's lock, and every caller's registrations, for the linger time when its token expired).
func TestHostileDescriptorsThatAreNoMemory(t *testing.T) {
	b := newHostileBed(t)
	a, peer, err := socketPair()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer peer.Close()
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	pipe, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	for _, tc := range []struct {
		f    *os.File
		want string
	}{{a, "is a socket"}, {dir, "is a directory"}, {pipe, "is a pipe"}} {
		_, err := fdpass.Put(ctxT(t), b.a.srv.FDSocketPath(), tc.f)
		if !errors.Is(err, fdpass.ErrNotMemory) || !strings.Contains(err.Error(), tc.want) || client.Code(err) != codes.InvalidArgument {
			t.Errorf("PUT of a descriptor that %s: %v, want a refusal saying so", tc.want, err)
		}
	}
	b.check(t)
}

// socketPair is two connected Unix stream sockets.
func socketPair() (*os.File, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "socket-a"), os.NewFile(uintptr(fds[1]), "socket-b"), nil
}

// setFastMemory binds a fast connection of a new client of the agent and hands it f as its mailbox or its id
// arena, as a hostile caller would; it returns the agent's refusal, nil when it took f.
func setFastMemory(t *testing.T, a *agent, what string, f *os.File, size uint64) error {
	t.Helper()
	c := dial(t, a)
	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	defer conn.Close()
	token, err := fdpass.Put(ctxT(t), a.srv.FDSocketPath(), f)
	if err != nil {
		t.Fatal(err)
	}
	if what == "mailbox" {
		r = setMailbox(t, conn, token, size)
	} else {
		r = rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_IdArena{
			IdArena: &agentv1.IdArena{FdToken: token, Size: size}}}))
	}
	if r.Code != 0 {
		return status.Error(codes.Code(r.Code), r.Message)
	}
	return nil
}

// A process in a delegated cgroup that names the victim's pod UID is refused on every socket and cannot
// touch the victim's regions.
func TestHostileForgedCgroup(t *testing.T) {
	b := newHostileBed(t)
	b.proc.write(t, "0::/rt-user-65534/pod"+podInfer+"\n")
	ctx := ctxT(t)
	if _, err := client.Dial(ctx, b.a.srv.SocketPath()); client.Code(err) != codes.PermissionDenied {
		t.Fatalf("forged cgroup dialed the agent: %v", err)
	}
	m := shm(t, 4096)
	if tok, err := putRawFD(t, b.a.srv.FDSocketPath(), m.File); err == nil {
		t.Fatalf("forged cgroup got fd token %q", tok)
	}
	fc := rawDial(t, b.a.srv.FastSocketPath())
	_ = fc.SetDeadline(time.Now().Add(5 * time.Second))
	_ = sockio.WriteFrame(fc, []byte("0123456789abcdef0123456789abcdef"))
	if reply, err := sockio.ReadFrame(fc, 1<<20); err == nil && len(reply) == 0 {
		t.Fatal("forged cgroup bound a fast connection")
	}
	b.proc.setLocal(t)
	// A local caller (which is what that process is) cannot reach the victim's regions by id.
	c := dial(t, b.a)
	if _, err := c.API().DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: b.rs.ID()}); client.Code(err) != codes.NotFound {
		t.Fatalf("deregistering the victim's region: %v", err)
	}
	b.check(t)
}

func putRawFD(t *testing.T, path string, f *os.File) (string, error) {
	t.Helper()
	c := rawDial(t, path)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.WriteMsgUnix([]byte("PUT\n"), syscall.UnixRights(int(f.Fd())), nil); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) > 3 && line[:3] == "OK " {
		return line[3:], nil
	}
	return "", &net.OpError{Op: "put", Err: os.ErrPermission}
}

// bindFast opens a fast connection bound to a new session of c.
func bindFastRaw(t *testing.T, b *hostileBed, c *client.Client) *net.UnixConn {
	t.Helper()
	resp, err := c.API().OpenFastPath(ctxT(t), &agentv1.OpenFastPathRequest{})
	if err != nil {
		t.Fatal(err)
	}
	fc := rawDial(t, resp.Socket)
	_ = fc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := sockio.WriteFrame(fc, []byte(resp.Token)); err != nil {
		t.Fatal(err)
	}
	if _, err := sockio.ReadFrame(fc, 1<<20); err != nil {
		t.Fatal(err)
	}
	_ = fc.SetDeadline(time.Time{})
	return fc
}

// Bound fast connections that declare the largest frames and send nothing must not grow the agent's memory
// by the frames they declare.
func TestHostileFastSocketDeclaredFrames(t *testing.T) {
	b := newHostileBed(t)
	c := dial(t, b.a)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < 8; i++ {
		fc := bindFastRaw(t, b, c)
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], 64<<20-1)
		if _, err := fc.Write(hdr[:]); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Skipf("waiting for the fast-socket limits: 8 declared 64 MiB frames grew the heap by %d MiB", grew>>20)
	}
	b.check(t)
}

// A bound fast connection idles as long as its session does (it is capped per caller, so holding it costs a
// bounded amount), and is closed as soon as the session ends: an idle caller cannot keep it beyond its
// connection to the agent.
func TestHostileIdleBoundFastConnection(t *testing.T) {
	b := newHostileBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, b.a.srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	fc := bindFastRaw(t, b, c)
	_ = fc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := fc.Read(make([]byte, 64)); err == nil {
		t.Fatal("the agent wrote to an idle fast connection")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("an idle bound fast connection was closed while its session lives: %v", err)
	}
	c.Close()
	_ = fc.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	for {
		if _, err := fc.Read(make([]byte, 64)); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("the fast connection outlived its session by %s", time.Since(start))
			}
			break
		}
	}
	b.check(t)
}
