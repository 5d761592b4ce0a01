// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
)

// oneBlockLayouts are two host layouts of 4 KiB blocks and their memory, for calls that must move bytes.
func oneBlockLayouts(t *testing.T, ctx context.Context, c *client.Client) (src, dst *client.Layout, srcMem, dstMem *client.SharedMemory) {
	t.Helper()
	srcMem, dstMem = sharedMemory(t, "src", 1<<14), sharedMemory(t, "dst", 1<<14)
	layout := func(m *client.SharedMemory) *client.Layout {
		r, err := c.RegisterHost(ctx, m.File, 0, m.Size())
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.RegisterLayout(ctx, []*client.Region{r}, 4096)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	return layout(srcMem), layout(dstMem), srcMem, dstMem
}

// moveOne writes block 1 of src to block 2 of dst with fresh bytes, and fails the test unless they landed.
func moveOne(t *testing.T, ctx context.Context, c *client.Client, src, dst *client.Layout, srcMem, dstMem *client.SharedMemory, round byte) {
	t.Helper()
	for i := 4096; i < 8192; i++ {
		srcMem.Bytes[i] = byte(i) + round
	}
	if _, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{}); err != nil {
		t.Fatalf("round %d: %v", round, err)
	}
	if !bytes.Equal(dstMem.Bytes[8192:12288], srcMem.Bytes[4096:8192]) {
		t.Fatalf("round %d: block 2 of the destination is not block 1 of the source", round)
	}
}

// TestAFastPathDroppedAfterADeadlineIsOpenedAgain: a call the agent does not answer by its deadline reads
// DeadlineExceeded (errors.Is too, each time: it read so in 6 of 20), and the client opens the fast connection
// again by itself; it stayed on gRPC, 50 times slower a call, until Recover.
func TestAFastPathDroppedAfterADeadlineIsOpenedAgain(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "reopen")
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx, c)
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 0)
	for round := range 5 {
		client.StallFastPath(t, c)
		short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
		_, err := c.TransferBlocks(short, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
		cancel()
		if client.Code(err) != codes.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: a call the agent did not answer: %v (code %v), want DeadlineExceeded that errors.Is finds", round, err, client.Code(err))
		}
		// Meanwhile calls go through gRPC, and land.
		moveOne(t, ctx, c, src, dst, srcMem, dstMem, byte(round+1))
		deadline := time.Now().Add(10 * time.Second)
		for !client.FastPathOpen(c) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no fast connection 10 s after the dropped one", round)
			}
			moveOne(t, ctx, c, src, dst, srcMem, dstMem, byte(round+1))
			time.Sleep(10 * time.Millisecond)
		}
		_, before := client.MailboxRequests(c)
		moveOne(t, ctx, c, src, dst, srcMem, dstMem, byte(round+100))
		if attached, after := client.MailboxRequests(c); !attached || after != before+1 {
			t.Fatalf("round %d: the call after the reopen did not take the fast connection's mailbox (%v, %d -> %d)", round, attached, before, after)
		}
	}
}

// TestACallBehindAHeldFastConnectionGoesThroughGRPC: a call that finds the fast connection held by another call
// (a long waited transfer, or one the agent does not answer) goes through gRPC after fastQueueWait, and lands,
// instead of queueing behind it: a goroutine's 4 KiB call waited 9 ms behind another's 256 MiB one, and three
// 300 ms calls queued behind a stalled 3 s one took 3 s each before calls ended at their own deadlines. The held
// connection stays, and the next call takes it again.
func TestACallBehindAHeldFastConnectionGoesThroughGRPC(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "queued")
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx, c)
	_, before := client.MailboxRequests(c)
	release := client.HoldFastLock(c)
	start := time.Now()
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 7)
	for i := range 3 {
		if _, err := c.Do(ctx, client.Write, []client.Item{{Local: src.Regions()[0], Remote: client.ToRegion(dst.Regions()[0]), Length: 64}}, client.TransferOptions{}); err != nil {
			t.Fatalf("item transfer %d behind a held connection: %v", i, err)
		}
	}
	took := time.Since(start)
	release()
	_, during := client.MailboxRequests(c)
	if took > time.Second {
		t.Fatalf("four calls behind a held fast connection took %v", took)
	}
	if during != before {
		t.Fatalf("calls went through the held fast connection's mailbox (%d -> %d)", before, during)
	}
	if !client.FastPathOpen(c) {
		t.Fatal("a call that found the connection held dropped it")
	}
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 8)
	if _, after := client.MailboxRequests(c); after != during+1 {
		t.Fatalf("the call after the release did not take the fast connection (%d -> %d)", during, after)
	}
}

// TestDialSaysWhatToDial: a path where no agent can answer is refused at once (Unavailable), naming what to dial:
// the agent's other sockets ("error reading server preface"), a name misspelled beside the socket, a folder and
// a file ("connection refused"), a folder of pools, nothing at all.
func TestDialSaysWhatToDial(t *testing.T) {
	dir := t.TempDir()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	pool := filepath.Join(dir, "kv")
	if err := os.Mkdir(pool, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"agent.sock", client.FastSocketName, client.FDSocketName} {
		l, err := net.Listen("unix", filepath.Join(pool, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	file := filepath.Join(dir, "notes")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(pool, "agent.sock")
	for _, tc := range []struct{ path, want string }{
		{filepath.Join(pool, client.FastSocketName), "the agent's fast socket, which the client opens itself: dial " + sock},
		{filepath.Join(pool, client.FDSocketName), "the agent's descriptor socket, which the client opens itself: dial " + sock},
		{filepath.Join(pool, "agnt.sock"), "beside it: dial " + sock},
		{pool, "it is a folder, not a socket: dial " + sock},
		{filepath.Join(dir, "agent.sock"), "pools' sockets are in that folder: dial " + filepath.Join(real, "kv", "agent.sock")},
		{file, "it is not a socket"},
		{filepath.Join(t.TempDir(), "kv", "agent.sock"), "there is no socket there"},
		{"unix://" + sock, "without the unix: scheme: dial " + sock},
		{filepath.Join(dir, strings.Repeat("d", 100), "agent.sock"), "more than a Unix socket address holds"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		c, err := client.Dial(ctx, tc.path)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("dialled %s", tc.path)
		}
		if took := time.Since(start); took > time.Second || client.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Dial(%s) after %v: %v (code %v), want Unavailable at once saying %q", tc.path, took, err, client.Code(err), tc.want)
		}
	}
}

// pastDeadline is a context whose deadline has passed but whose timer has not fired yet (ctx.Err() still nil), as
// a call meets its context for a moment after the deadline.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestACallPastItsDeadlineIsNotPosted: a call whose deadline passed before it took the fast connection sends
// nothing, reads DeadlineExceeded, and leaves the connection up (it posted the request, failed at once, and
// dropped a sound connection while the agent might still run it).
func TestACallPastItsDeadlineIsNotPosted(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "past-deadline")
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx, c)
	_, before := client.MailboxRequests(c)
	_, err := c.TransferBlocks(pastDeadline{ctx}, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nothing sent") {
		t.Fatalf("a call past its deadline: %v, want DeadlineExceeded saying nothing was sent", err)
	}
	if _, after := client.MailboxRequests(c); after != before || !client.FastPathOpen(c) {
		t.Fatalf("a call past its deadline posted its request (%d -> %d) or dropped the connection (open %v)", before, after, client.FastPathOpen(c))
	}
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 1)
}

// TestRecoverBesideCloseLeavesNoConnection: a Recover whose fast connection opened after Close ran installed
// it for good (its descriptor and mappings leaked: Close had closed the one before).
func TestRecoverBesideCloseLeavesNoConnection(t *testing.T) {
	srv := startLocal(t)
	for i := range 40 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := client.Dial(ctx, srv.SocketPath())
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = c.Recover(ctx)
		}()
		time.Sleep(time.Duration(i%8) * 50 * time.Microsecond)
		c.Close()
		<-done
		cancel()
		if client.FastPathOpen(c) {
			t.Fatalf("round %d: a fast connection stayed open after Close", i)
		}
	}
}

// TestAClosedFileIsRefusedAsClosed: a closed file said "duplicating its fd: bad file descriptor".
func TestAClosedFileIsRefusedAsClosed(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "closed-file")
	m, err := client.NewSharedMemory("closed", 4096)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if _, err := c.RegisterHost(ctx, m.File, 0, 4096); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is closed: pass the memory's open file") {
		t.Fatalf("registering a closed file: %v (code %v), want InvalidArgument saying it is closed", err, client.Code(err))
	}
}

// TestDialThroughALinkElsewhere: a link to the agent socket in another folder dials the agent's fast and
// descriptor sockets beside the socket itself (they were looked for beside the link, and Dial failed).
func TestDialThroughALinkElsewhere(t *testing.T) {
	srv := startLocal(t)
	link := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.Symlink(srv.SocketPath(), link); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, link)
	if err != nil {
		t.Fatalf("dialling a link to the socket: %v", err)
	}
	defer c.Close()
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx, c) // through the descriptor socket
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 1)
	if attached, n := client.MailboxRequests(c); !attached || n == 0 {
		t.Fatalf("the call through a link did not take the fast connection's mailbox (%v, %d)", attached, n)
	}
}

// TestCloseEndsACallTheAgentDoesNotAnswer: Close during a call the agent does not answer ends that call at once
// with ErrClosed (Close waited for the call's whole deadline, 9.8 s of a 10 s one).
func TestCloseEndsACallTheAgentDoesNotAnswer(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "close-stalled")
	src, dst, _, _ := oneBlockLayouts(t, ctx, c)
	client.StallFastPath(t, c)
	ended := make(chan error, 1)
	go func() {
		long, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := c.TransferBlocks(long, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{})
		ended <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is waiting for its reply
	start := time.Now()
	c.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Close took %v beside a call the agent did not answer", took)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, client.ErrClosed) {
			t.Fatalf("the call Close ended: %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the call was still waiting 2 s after Close")
	}
	if client.FastPathOpen(c) {
		t.Fatal("a fast connection stayed open after Close")
	}
}

// TestAgentSocketMountedAloneSaysToMountTheFolder: a pod that mounts agent.sock alone (a hostPath of the file)
// reaches the agent but not the sockets beside it. Dial said only "connecting to the fast socket: no such file
// or directory", and a registration the same of the descriptor socket; each now names the socket that is
// missing, the folder to mount, and for the fast socket how to go without it. The agent serves others as before.
func TestAgentSocketMountedAloneSaysToMountTheFolder(t *testing.T) {
	srv := startLocal(t)
	alone := filepath.Join(t.TempDir(), "agent.sock")
	if err := os.Link(srv.SocketPath(), alone); err != nil { // the socket itself, without its folder
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := client.Dial(ctx, alone)
	if err == nil {
		t.Fatal("Dial with no fast socket beside agent.sock succeeded")
	}
	for _, want := range []string{filepath.Join(filepath.Dir(alone), client.FastSocketName), "mount the agent's whole socket folder"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Dial's error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "WithoutFastPath") { // it would fail on the missing descriptor socket next
		t.Errorf("Dial's error %q offers WithoutFastPath with the descriptor socket missing too", err)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Dial's error %v does not wrap the missing file", err)
	}
	// With the descriptor socket beside it, going without the fast path is offered.
	withFD := filepath.Join(t.TempDir(), "agent.sock")
	for _, name := range []string{"agent.sock", client.FDSocketName} {
		if err := os.Link(filepath.Join(filepath.Dir(srv.SocketPath()), name), filepath.Join(filepath.Dir(withFD), name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Dial(ctx, withFD); err == nil || !strings.Contains(err.Error(), "WithoutFastPath") {
		t.Errorf("Dial with the fast socket alone missing: %v, want it to offer WithoutFastPath", err)
	}
	c, err := client.Dial(ctx, alone, client.WithoutFastPath())
	if err != nil {
		t.Fatalf("Dial without the fast path: %v", err)
	}
	defer c.Close()
	m := sharedMemory(t, "alone", 1<<14)
	_, err = c.RegisterHost(ctx, m.File, 0, m.Size())
	if err == nil || !strings.Contains(err.Error(), filepath.Join(filepath.Dir(alone), client.FDSocketName)) ||
		!strings.Contains(err.Error(), "mount the agent's whole socket folder") {
		t.Fatalf("RegisterHost with no descriptor socket beside agent.sock: %v", err)
	}
	other, ctx2 := dialLocal(t, srv, "beside")
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx2, other)
	moveOne(t, ctx2, other, src, dst, srcMem, dstMem, 1)
}

// TestNotifyPayloadsTheAgentWouldNotDeliverAreRefused: an empty Notify travelled as none (the listener waited for
// nothing), and one past the agent's limit was refused only by the agent; both are refused before they are sent,
// naming the limit the agent now tells, and the largest payload it takes is delivered whole.
func TestNotifyPayloadsTheAgentWouldNotDeliverAreRefused(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "notify-limits")
	most := int(c.Info().GetLimits().GetMaxNotifyBytes())
	if most != 64<<10 {
		t.Fatalf("Info().Limits.MaxNotifyBytes = %d, want the agent's 65536", most)
	}
	src, dst, srcMem, dstMem := oneBlockLayouts(t, ctx, c)
	for _, payload := range [][]byte{{}, make([]byte, most+1), make([]byte, 5<<20)} {
		_, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{Notify: payload})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Notify") {
			t.Errorf("TransferBlocks with a %d-byte Notify: %v, want InvalidArgument naming Notify", len(payload), err)
		}
		_, err = c.Submit(ctx, client.Write, []client.Item{{Local: src.Regions()[0], Remote: client.ToRegion(dst.Regions()[0]), Length: 64}}, client.TransferOptions{Notify: payload})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Notify") {
			t.Errorf("Submit with a %d-byte Notify: %v, want InvalidArgument naming Notify", len(payload), err)
		}
	}
	listen, stop := context.WithCancel(ctx)
	defer stop()
	notes, _, err := c.Notifications(listen, dst.Regions()[0])
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{'n'}, most)
	if _, err := c.TransferBlocks(ctx, client.Write, src, []uint32{1}, client.ToLayout(dst), []uint32{2}, client.TransferOptions{Notify: want}); err != nil {
		t.Fatalf("TransferBlocks with a %d-byte Notify: %v", most, err)
	}
	select {
	case n := <-notes:
		if !bytes.Equal(n.GetPayload(), want) {
			t.Fatalf("the notification carried %d bytes, want the %d sent", len(n.GetPayload()), most)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5 s")
	}
	moveOne(t, ctx, c, src, dst, srcMem, dstMem, 3)
}

// TestNotificationsOfNoRegionsAreThisClientsOwn: a client that names no regions hears of its own regions only.
// The agent's filter is the caller, every client of one user without Kubernetes (or of one pod): another
// client's notified writes reached the stream, so two decode processes on one machine read each other's
// requests.
func TestNotificationsOfNoRegionsAreThisClientsOwn(t *testing.T) {
	srv := startLocal(t)
	mine, ctx := dialLocal(t, srv, "listener")
	other, _ := dialLocal(t, srv, "other")
	empty, _ := dialLocal(t, srv, "empty")
	if _, _, err := empty.Notifications(ctx); client.Code(err) != codes.InvalidArgument {
		t.Fatalf("notifications of a client that holds no regions: %v, want InvalidArgument", err)
	}
	theirs := sharedMemory(t, "theirs", 8192)
	rt, err := other.RegisterHost(ctx, theirs.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	ours := sharedMemory(t, "ours", 4096)
	ro, err := mine.RegisterHost(ctx, ours.File, 0, 4096, client.Segment("notified-ours"))
	if err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	if _, _, err := mine.Notifications(expired); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("notifications of an expired context: %v, want context.DeadlineExceeded", err)
	}
	listen, stop := context.WithCancel(ctx)
	defer stop()
	notes, _, err := mine.Notifications(listen)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Do(ctx, client.Write, []client.Item{{Local: rt, Remote: client.ToRegion(rt), RemoteOffset: 4096, Length: 64}},
		client.TransferOptions{Notify: []byte("theirs")}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Do(ctx, client.Write, []client.Item{{Local: rt, Remote: client.ToSegment("", "notified-ours"), Length: 64}},
		client.TransferOptions{Notify: []byte("ours")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notes:
		if string(n.GetPayload()) != "ours" || n.GetRegionId() != ro.ID() {
			t.Fatalf("the listener heard %q of region %d, want %q of its own region %d", n.GetPayload(), n.GetRegionId(), "ours", ro.ID())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5 s")
	}
}

// TestArgumentsTheClientRefusesReadInvalidArgument: arguments refused before anything is sent carry the code the
// agent gives the same mistakes (they read Unknown, so a caller's switch on Code missed them).
func TestArgumentsTheClientRefusesReadInvalidArgument(t *testing.T) {
	c, ctx := dialLocal(t, startLocal(t), "arguments")
	src, dst, _, _ := oneBlockLayouts(t, ctx, c)
	_, blocksErr := c.TransferBlocks(ctx, client.Write, src, []uint32{1, 2}, client.ToLayout(dst), []uint32{1}, client.TransferOptions{})
	_, prepErr := c.PrepareBlocks(client.Write, src, []uint32{1, 2}, client.ToLayout(dst), []uint32{1}, client.TransferOptions{})
	_, fileErr := c.RegisterHost(ctx, nil, 0, 4096)
	_, gpuErr := c.RegisterGPU(ctx, client.GPUMemory{IPCHandle: []byte{1}, Length: 4096})
	_, itemErr := c.Do(ctx, client.Write, []client.Item{{Remote: client.ToRegion(src.Regions()[0]), Length: 1}}, client.TransferOptions{})
	for what, err := range map[string]error{"unequal id counts": blocksErr, "unequal prepared id counts": prepErr,
		"no file": fileErr, "a short IPC handle": gpuErr, "an item without a local region": itemErr} {
		if client.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v (code %v), want InvalidArgument", what, err, client.Code(err))
		}
	}
}
