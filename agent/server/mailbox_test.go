// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server/fastwire"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
)

// testMailbox is a caller's side of a fast connection's mailbox (agent.proto, Mailbox), written the way any
// process could: every word is the caller's to write.
type testMailbox struct {
	t       *testing.T
	file    *os.File
	mem     []byte
	conn    net.Conn
	seq     uint64
	checked bool // frames carry seals (Mailbox.checked)
}

func (m *testMailbox) u64(off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&m.mem[off]))
}
func (m *testMailbox) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&m.mem[off]))
}
func (m *testMailbox) area() int { return (len(m.mem) - 4096) / 2 }

// post writes a frame of payload (announcing length bytes) and raises the request sequence, ringing the socket
// when the agent does not watch.
func (m *testMailbox) post(payload []byte, length uint32) {
	m.write(payload, length, m.seq+1)
	m.raise()
}

// write writes a frame (and in a checked mailbox its seal, for sequence seq) into the request area.
func (m *testMailbox) write(payload []byte, length uint32, seq uint64) {
	binary.BigEndian.PutUint32(m.mem[4096:], length)
	copy(m.mem[4100:], payload)
	if m.checked {
		end := 4100 + len(payload)
		binary.LittleEndian.PutUint32(m.mem[end:], fastwire.Seal(seq, m.mem[4096:end]))
	}
}

// raise raises the request sequence, ringing the socket when the agent does not watch.
func (m *testMailbox) raise() {
	m.seq++
	m.u64(0).Store(m.seq)
	if m.u32(192).Load() == 0 {
		m.ring()
	}
}

func (m *testMailbox) ring() {
	m.t.Helper()
	_ = m.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := m.conn.Write([]byte{0, 0, 0, 0}); err != nil {
		m.t.Fatalf("ringing: %v", err)
	}
}

// reply waits (5 s at most, ringing once after 100 ms as a caller that lost the race with a sleeping agent
// does) for the answer to the last request.
func (m *testMailbox) reply() *agentv1.FastReply {
	m.t.Helper()
	start := time.Now()
	rang := false
	for m.u64(128).Load() != m.seq {
		if !rang && time.Since(start) > 100*time.Millisecond && m.u64(64).Load() != m.seq {
			m.ring()
			rang = true
		}
		if time.Since(start) > 5*time.Second {
			m.t.Fatalf("no reply to mailbox request %d within 5 s", m.seq)
		}
		time.Sleep(20 * time.Microsecond)
	}
	at := 4096 + m.area()
	n := binary.BigEndian.Uint32(m.mem[at:])
	if int(n) > m.area()-4 {
		m.t.Fatalf("a reply of %d bytes in an area of %d", n, m.area())
	}
	if m.checked {
		end := at + 4 + int(n)
		if got, want := binary.LittleEndian.Uint32(m.mem[end:]), fastwire.Seal(m.seq, m.mem[at:end]); got != want {
			m.t.Fatalf("the reply to request %d is sealed %08x, want %08x", m.seq, got, want)
		}
	}
	var r agentv1.FastReply
	if err := proto.Unmarshal(m.mem[at+4:at+4+int(n)], &r); err != nil {
		m.t.Fatalf("the mailbox's reply: %v", err)
	}
	return &r
}

func (m *testMailbox) call(payload []byte) *agentv1.FastReply {
	m.t.Helper()
	m.post(payload, uint32(len(payload)))
	return m.reply()
}

// attachMailbox binds a fast connection and gives it a sealed mailbox of size bytes.
func attachMailbox(t *testing.T, a *agent, c *client.Client, size uint64) *testMailbox {
	t.Helper()
	return attachMailboxChecked(t, a, c, size, false)
}

// attachMailboxChecked is attachMailbox, with frames sealed when checked.
func attachMailboxChecked(t *testing.T, a *agent, c *client.Client, size uint64, checked bool) *testMailbox {
	t.Helper()
	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	mem := shm(t, size)
	token, err := fdpass.Put(ctxT(t), a.srv.FDSocketPath(), mem.File)
	if err != nil {
		t.Fatal(err)
	}
	r = rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Mailbox{
		Mailbox: &agentv1.Mailbox{FdToken: token, Size: size, Checked: checked}}}))
	if r.Code != 0 {
		t.Fatalf("a sealed mailbox of %d bytes: %v", size, r)
	}
	return &testMailbox{t: t, file: mem.File, mem: mem.Bytes, conn: conn, checked: checked}
}

func setMailbox(t *testing.T, conn net.Conn, token string, size uint64) *agentv1.FastReply {
	return rawFrame(t, conn, fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Mailbox{
		Mailbox: &agentv1.Mailbox{FdToken: token, Size: size}}}))
}

// TestMailboxIsCheckedAndCarriesRequests: a mailbox must be a sealed memfd of a bounded size passed by its own
// caller; through it a block transfer moves exactly its blocks, and whatever a caller writes into it — a garbage
// frame, a length past its area, a mailbox request, its own words — is answered with a clear InvalidArgument in
// the mailbox, moves nothing, and leaves the connection serving, on the socket as in the mailbox, and another
// caller's transfers untouched.
func TestMailboxIsCheckedAndCarriesRequests(t *testing.T) {
	const bs, blocks = 64, 1024
	b := newFastBlocksBed(t, 7, blocks, bs)
	a, c, ctx, rng := b.a, b.c, b.ctx, b.rng
	src, srcMem, dst, dstMem := b.src, b.srcMem, b.dst, b.dstMem
	put, refused := b.put, b.refused

	conn, r := bindFast(t, c.API(), a.srv.FastSocketPath())
	if r.Code != 0 {
		t.Fatalf("binding: %v", r)
	}
	unsealed := memfd(t, 64<<10, unix.MFD_ALLOW_SEALING)
	refused("unsealed memfd", setMailbox(t, conn, put(unsealed), 64<<10), "not sealed against shrinking")
	untouched := memfd(t, 64<<10, unix.MFD_ALLOW_SEALING)
	if err := client.SealShrink(untouched); err != nil {
		t.Fatal(err)
	}
	refused("sealed memfd nobody touched", setMailbox(t, conn, put(untouched), 64<<10), "nobody has touched")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.srv.Collector())
	for _, reason := range []string{"unsealed", "untouched_pages"} {
		if n := promtest.Gather(t, reg)["fabricxfer_agent_edge_refusals_total{reason="+reason+",socket=fast}"]; n != 1 {
			t.Fatalf("fast socket refusals for %s counted %v, want 1", reason, n)
		}
	}
	good := shm(t, 64<<10)
	refused("a mailbox larger than its memfd", setMailbox(t, conn, put(good.File), 128<<10), "outside the passed memory")
	refused("a mailbox below the bound", setMailbox(t, conn, put(good.File), 4096), "between")
	refused("a mailbox past the bound", setMailbox(t, conn, put(good.File), 64<<20), "between")
	refused("unknown token", setMailbox(t, conn, "no-such-token", 64<<10), "mailbox")

	mb := attachMailbox(t, a, c, 64<<10)
	blocksFrame := func(local, remote []uint32) []byte {
		lb, rb := make([]byte, 4*len(local)), make([]byte, 4*len(remote))
		for i := range local {
			binary.LittleEndian.PutUint32(lb[4*i:], local[i])
		}
		for i := range remote {
			binary.LittleEndian.PutUint32(rb[4*i:], remote[i])
		}
		return fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
			Op: agentv1.Op_OP_WRITE, LayoutId: src.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: dst.ID()}},
			IdBytes: 4, LocalIds: lb, RemoteIds: rb, Wait: true}}})
	}
	before := b.snapshot()
	unchanged := func(what string) { b.unchanged(what, before) }

	// Hostile requests, each answered in the mailbox.
	garbage := make([]byte, 300)
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	refused("a garbage frame", mb.call(garbage), "not a FastRequest")
	mb.post(nil, uint32(mb.area())) // a length past the area
	refused("a frame past the area", mb.reply(), "at most")
	mb.post(nil, 0xffffffff)
	refused("a length of 4 GiB", mb.reply(), "at most")
	refused("a mailbox through the mailbox", mb.call(fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Mailbox{
		Mailbox: &agentv1.Mailbox{FdToken: "x", Size: 64 << 10}}})), "through the socket")
	refused("an id out of range", mb.call(blocksFrame([]uint32{1, 2}, []uint32{3, blocks})), "")
	// The caller scribbles over the agent's words and its own reply; doorbells with nothing posted are ignored.
	mb.u64(64).Store(^uint64(0))
	mb.u64(128).Store(12345)
	mb.u32(192).Store(7)
	for range 20 {
		mb.ring()
	}
	// A caller cannot shrink what the agent maps.
	if err := unix.Ftruncate(int(mb.file.Fd()), 4096); !errors.Is(err, unix.EPERM) {
		t.Fatalf("shrinking the mailbox: %v, want EPERM (sealed)", err)
	}
	unchanged("refused mailbox requests")

	// Another caller's transfer is untouched by all of that.
	other := dial(t, a)
	oSrc, oSrcMem := hostLayout(t, other, rng, 1, 16, bs)
	oDst, oDstMem := hostLayout(t, other, rng, 1, 16, bs)
	if _, err := other.TransferBlocks(ctx, client.Write, oSrc, []uint32{3}, client.ToLayout(oDst), []uint32{5}, client.TransferOptions{}); err != nil {
		t.Fatalf("another caller's transfer: %v", err)
	}
	if !bytes.Equal(oDstMem[0].Bytes[5*bs:6*bs], oSrcMem[0].Bytes[3*bs:4*bs]) {
		t.Fatal("another caller's block did not land")
	}

	// Good requests through the mailbox, and one on the socket of the same connection between them.
	const n = 200
	local, remote := rng.Perm(blocks)[:n], rng.Perm(blocks)[:n]
	l32, r32 := make([]uint32, n), make([]uint32, n)
	for i := range n {
		l32[i], r32[i] = uint32(local[i]), uint32(remote[i])
	}
	if r := mb.call(blocksFrame(l32[:n/2], r32[:n/2])); r.Code != 0 || r.Response.GetStatus().GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("blocks through the mailbox: %v", r)
	}
	if r := rawFrame(t, mb.conn, blocksFrame(l32[n/2:], r32[n/2:])); r.Code != 0 {
		t.Fatalf("blocks on the socket of a connection with a mailbox: %v", r)
	}
	for k := range dstMem {
		want := bytes.Clone(before[k])
		for i := range n {
			copy(want[remote[i]*bs:][:bs], srcMem[k].Bytes[local[i]*bs:][:bs])
		}
		if !bytes.Equal(dstMem[k].Bytes, want) {
			t.Fatalf("region %d: the blocks did not land exactly", k)
		}
	}
}

// TestMailboxWakesAnAgentAsleepAndACallerAsleep: an agent that does not poll says so in the mailbox and serves a
// request once rung; a caller that says it sleeps gets a wake-up (a frame header no reply has) on the socket after
// its reply, and nothing when it does not.
func TestMailboxWakesAnAgentAsleepAndACallerAsleep(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.FastSpin = -1 // never polls
	a := startAgent(t, opts)
	c := dial(t, a)
	_, srcMem, _, dstMem, frame := oneBlockFrame(t, c, rand.New(rand.NewPCG(9, 10)))
	mb := attachMailbox(t, a, c, 16<<10)

	deadline := time.Now().Add(5 * time.Second)
	for mb.u32(192).Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("an agent that does not poll still says it watches the mailbox")
		}
		time.Sleep(time.Millisecond)
	}
	// Posted without a ring, the request waits; the ring serves it.
	binary.BigEndian.PutUint32(mb.mem[4096:], uint32(len(frame)))
	copy(mb.mem[4100:], frame)
	mb.seq++
	mb.u64(0).Store(mb.seq)
	time.Sleep(50 * time.Millisecond)
	if mb.u64(64).Load() == mb.seq {
		t.Fatal("an agent asleep on its socket took a request nobody rang for")
	}
	mb.ring()
	if r := mb.reply(); r.Code != 0 {
		t.Fatalf("a rung request: %v", r)
	}
	if !bytes.Equal(dstMem[0].Bytes[2*64:3*64], srcMem[0].Bytes[64:2*64]) {
		t.Fatal("the rung request's block did not land")
	}

	// A caller asleep is woken on the socket; one awake is not written to.
	mb.u32(196).Store(1)
	if r := mb.call(frame); r.Code != 0 {
		t.Fatalf("a caller asleep: %v", r)
	}
	_ = mb.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var wake [4]byte
	if _, err := io.ReadFull(mb.conn, wake[:]); err != nil || wake != [4]byte{0xff, 0xff, 0xff, 0xff} {
		t.Fatalf("the wake-up of a caller asleep: %v %v", wake, err)
	}
	mb.u32(196).Store(0)
	if r := mb.call(frame); r.Code != 0 {
		t.Fatalf("a caller awake: %v", r)
	}
	_ = mb.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if n, err := mb.conn.Read(wake[:]); n != 0 || !isTimeout(err) {
		t.Fatalf("a caller awake got %d bytes on the socket (%v)", n, err)
	}

	// A caller that says it sleeps and never reads its socket fills it with wake-ups (a few hundred fill a Unix
	// socket's buffer); the agent does not wait for room and goes on answering in the mailbox.
	mb.u32(196).Store(1)
	for i := range 3000 {
		if r := mb.call(frame); r.Code != 0 {
			t.Fatalf("call %d of a caller that never reads its socket: %v", i, r)
		}
	}
	mb.u32(196).Store(0)
	got, buf := 0, make([]byte, 64<<10)
	for {
		_ = mb.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := mb.conn.Read(buf)
		if k := bytes.IndexFunc(buf[:n], func(r rune) bool { return r != utf8.RuneError }); k >= 0 {
			t.Fatalf("something other than wake-ups (0xff bytes) on the socket: % x", buf[k:min(n, k+16)])
		}
		got += n
		if isTimeout(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if got == 0 || got%4 != 0 {
		t.Fatalf("%d bytes of wake-ups waited on the socket, want whole ones", got)
	}
}

// oneBlockFrame registers two host layouts of 64 blocks of 64 bytes and builds the fast frame of a waited
// transfer of the source's block 1 to the destination's block 2.
func oneBlockFrame(t *testing.T, c *client.Client, rng *rand.Rand) (src *client.Layout, srcMem []*client.SharedMemory, dst *client.Layout, dstMem []*client.SharedMemory, frame []byte) {
	t.Helper()
	src, srcMem = hostLayout(t, c, rng, 1, 64, 64)
	dst, dstMem = hostLayout(t, c, rng, 1, 64, 64)
	frame = fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
		Op: agentv1.Op_OP_WRITE, LayoutId: src.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: dst.ID()}},
		IdBytes: 4, LocalIds: []byte{1, 0, 0, 0}, RemoteIds: []byte{2, 0, 0, 0}, Wait: true}}})
	return src, srcMem, dst, dstMem, frame
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestCheckedMailboxSealsFramesBothWays: in a mailbox asked to be checked (for callers whose writes may become
// visible out of order), the agent says so in the checked word, seals its replies, and serves a request only
// once its seal matches: a frame whose bytes land after its sequence is served once they do, while a frame
// that never matches its seal — garbage, the previous call's frame under a new sequence, a length past the area
// — is refused with InvalidArgument after a millisecond, moving nothing, and the connection goes on serving.
func TestCheckedMailboxSealsFramesBothWays(t *testing.T) {
	const bs, blocks = 64, 256
	b := newFastBlocksBed(t, 11, blocks, bs)
	src, srcMem, dst, dstMem := b.src, b.srcMem, b.dst, b.dstMem
	frame := func(from, to uint32) []byte {
		return fastMsg(t, &agentv1.FastRequest{Request: &agentv1.FastRequest_Blocks{Blocks: &agentv1.TransferBlocksRequest{
			Op: agentv1.Op_OP_WRITE, LayoutId: src.ID(), Remote: &agentv1.LayoutRef{Target: &agentv1.LayoutRef_LayoutId{LayoutId: dst.ID()}},
			IdBytes: 4, LocalIds: binary.LittleEndian.AppendUint32(nil, from), RemoteIds: binary.LittleEndian.AppendUint32(nil, to), Wait: true}}})
	}
	landed := func(what string, from, to uint32) {
		t.Helper()
		for k := range dstMem {
			if !bytes.Equal(dstMem[k].Bytes[to*bs:][:bs], srcMem[k].Bytes[from*bs:][:bs]) {
				t.Fatalf("%s: block %d of region %d did not land", what, to, k)
			}
		}
	}
	unchecked := attachMailbox(t, b.a, b.c, 16<<10)
	if unchecked.u32(200).Load() != 0 {
		t.Fatal("the agent set the checked word of a mailbox nobody asked to be checked")
	}
	mb := attachMailboxChecked(t, b.a, b.c, 16<<10, true)
	if mb.u32(200).Load() != 1 {
		t.Fatal("the agent did not set the checked word of a checked mailbox")
	}

	if r := mb.call(frame(1, 2)); r.Code != 0 { // mb.reply checks the reply's seal
		t.Fatalf("a sealed request: %v", r)
	}
	landed("a sealed request", 1, 2)

	// The sequence is seen before the frame and its seal: the agent reads again until they match. Bytes that
	// come later than the agent's patience are refused, which a loaded machine's scheduler can cause here (never
	// a CPU's stores, which land within microseconds): such a try is made again.
	late := frame(3, 4)
	for try := 1; ; try++ {
		start := time.Now()
		mb.raise()
		for time.Since(start) < 100*time.Microsecond { // a sleep this short takes milliseconds on a loaded machine
		}
		mb.write(late, uint32(len(late)), mb.seq)
		wrote := time.Since(start)
		r := mb.reply()
		if r.Code == 0 {
			break
		}
		if try == 5 || wrote < fastwire.SealPatience/2 {
			t.Fatalf("a request whose bytes came %v after its sequence (try %d): %v", wrote, try, r)
		}
		t.Logf("try %d: the bytes came %v after the sequence, past the agent's patience; again", try, wrote)
	}
	landed("a request whose bytes came after its sequence", 3, 4)

	// The previous frame under the next sequence is not served again, even when its source changed.
	for k := range srcMem {
		copy(srcMem[k].Bytes[3*bs:][:bs], bytes.Repeat([]byte{0xa5}, bs))
	}
	before := b.snapshot()
	start := time.Now()
	mb.raise()
	b.refused("the previous frame under a new sequence", mb.reply(), "does not match its seal")
	if took := time.Since(start); took < fastwire.SealPatience {
		t.Fatalf("refused after %v, before the seal's patience of %v", took, fastwire.SealPatience)
	}
	b.unchanged("a stale frame", before)

	// A wrong seal, and a length past the area (whatever its seal), are refused and move nothing.
	f := frame(5, 6)
	mb.write(f, uint32(len(f)), mb.seq+1)
	mb.mem[4100+len(f)] ^= 1
	mb.raise()
	b.refused("a wrong seal", mb.reply(), "does not match its seal")
	mb.write(nil, uint32(mb.area()-4), mb.seq+1)
	mb.raise()
	b.refused("a length past the area", mb.reply(), "at most")
	b.unchanged("refused checked requests", before)

	// Both mailboxes still serve, each in its own form.
	if r := mb.call(frame(7, 8)); r.Code != 0 {
		t.Fatalf("a sealed request after the refusals: %v", r)
	}
	landed("a sealed request after the refusals", 7, 8)
	if r := unchecked.call(frame(9, 10)); r.Code != 0 {
		t.Fatalf("the unchecked mailbox beside it: %v", r)
	}
	landed("the unchecked mailbox beside it", 9, 10)
}
