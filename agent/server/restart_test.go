// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// TestAgentRestartFailsFastAndClientsReregister stops the agent under a client with registered regions and a
// pending wait, starts a new one on the same socket, and checks that nothing hangs, that stale regions fail
// fast, and that Recover makes the client whole again.
func TestAgentRestartFailsFastAndClientsReregister(t *testing.T) {
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	src, dst := shm(t, 1<<20), shm(t, 1<<20)
	fill(t, src.Bytes)
	rs, err := c.RegisterHost(ctx, src.File, 0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, 1<<20, client.Segment("dst"))
	if err != nil {
		t.Fatal(err)
	}
	oldID := rs.ID()
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096); err != nil {
		t.Fatal(err)
	}
	// A watch is open while the agent goes away: it must end, not hang.
	watch, err := c.API().Watch(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	watchEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := watch.Recv(); err != nil {
				watchEnded <- err
				return
			}
		}
	}()
	// A transfer submitted and not yet waited for when the agent goes.
	unwaited, err := c.Submit(ctx, client.Write, []client.Item{{Local: rs, Remote: client.ToRegion(rd), Length: 4096}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}

	a.stop(t)
	select {
	case err := <-watchEnded:
		t.Logf("watch ended with: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a watch stream hung across the agent's shutdown")
	}

	// While no agent runs, calls fail fast.
	start := time.Now()
	_, err = c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096)
	if err == nil {
		t.Fatal("a write succeeded with no agent running")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("a write with no agent took %s to fail, want fast", d)
	}
	t.Logf("with no agent: %v", err)

	// A new agent on the same socket: the client's regions are gone there, and it is told so. A registration
	// made before the client noticed is refused (its call names the old session), not made in the new session
	// behind the client's back, where Recover would then find its name taken.
	b := startAgent(t, opts)
	late := shm(t, 4096)
	if _, err := c.RegisterHost(ctx, late.File, 0, 4096, client.Segment("after-restart")); !errors.Is(err, client.ErrSessionLost) || client.Code(err) != codes.Aborted {
		t.Fatalf("a registration on the new agent before Recover: %v (code %v), want ErrSessionLost, Aborted", err, client.Code(err))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096)
		if errors.Is(err, client.ErrSessionLost) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write after restart: %v, want ErrSessionLost", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	// The unwaited transfer went with the old agent: its wait, cancel and WaitAll say so (ErrLost), not "call
	// Recover and retry", which a Recover-and-retry loop would follow for ever.
	lost := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, client.ErrLost) || errors.Is(err, client.ErrSessionLost) || client.Code(err) != codes.NotFound {
			t.Fatalf("%s of a transfer of the agent before the restart, after Recover: %v (code %v), want ErrLost, NotFound", what, err, client.Code(err))
		}
	}
	_, err = unwaited.Wait(ctx)
	lost("Wait", err)
	_, err = unwaited.Cancel(ctx)
	lost("Cancel", err)
	_, err = c.WaitAll(ctx, unwaited)
	lost("WaitAll", err)
	if rs.ID() == oldID {
		t.Errorf("region id %d survived a restart: ids must differ between agent instances", oldID)
	}
	// Recover again, from several goroutines at once, on the session it recovered: the agent holds every region
	// already (its instance and session are the same), so nothing is registered twice and no id changes.
	recovered := rs.ID()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := c.Recover(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Usage.GetRegions() != 2 || rs.ID() != recovered {
		t.Fatalf("after Recover on a live session: the agent holds %d regions of the caller (want 2), id %d (was %d)",
			info.Usage.GetRegions(), rs.ID(), recovered)
	}
	if _, err := c.RegisterHost(ctx, late.File, 0, 4096, client.Segment("after-restart")); err != nil {
		t.Fatalf("the registration refused before Recover, made after it: %v", err)
	}
	clear(dst.Bytes)
	if _, err := c.Write(ctx, rs, 0, client.ToSegment("", "dst"), 0, 1<<20); err != nil {
		t.Fatalf("write after Recover: %v", err)
	}
	if !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatal("bytes differ after Recover")
	}
	_ = b
}

// TestACallNamingAnotherSessionIsRefused: a call whose session header names another session than its
// connection's (a stale one, garbage, a long string) is refused with Aborted "session lost" before it does
// anything, unary and streaming alike, EndSession included (the session goes on); GetInfo, the correct name, and
// no header at all pass.
func TestACallNamingAnotherSessionIsRefused(t *testing.T) {
	a, c, info := agentSession(t)
	ctx := ctxT(t)
	mine := info.Instance + "/" + strconv.FormatUint(info.Session, 10)
	if info.Instance == "" || info.Session == 0 {
		t.Fatalf("GetInfo names no instance or session: %v", info)
	}
	m := shm(t, 4096)
	register := func(name string) error {
		token, err := fdpass.Put(ctx, a.srv.FDSocketPath(), m.File)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.API().RegisterMemory(metadata.AppendToOutgoingContext(ctx, server.SessionHeader, name), &agentv1.RegisterMemoryRequest{
			Kind: agentv1.MemoryKind_MEMORY_KIND_HOST, HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Length: 4096})
		return err
	}
	for _, name := range []string{info.Instance + "/" + strconv.FormatUint(info.Session+1, 10), "00000001/1", "", strings.Repeat("x", 4096)} {
		err := register(name)
		if status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "session lost") {
			t.Fatalf("a registration naming session %.20q: %v, want Aborted, session lost", name, err)
		}
		stream, err := c.API().Notifications(metadata.AppendToOutgoingContext(ctx, server.SessionHeader, name), &agentv1.NotificationsRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Aborted {
			t.Fatalf("notifications naming session %.20q: %v, want Aborted", name, err)
		}
		if _, err := c.API().GetInfo(metadata.AppendToOutgoingContext(ctx, server.SessionHeader, name), &agentv1.GetInfoRequest{}); err != nil {
			t.Fatalf("GetInfo naming session %.20q: %v", name, err)
		}
		// EndSession ends the connection's own session only, and not one its header does not name.
		if _, err := c.API().EndSession(metadata.AppendToOutgoingContext(ctx, server.SessionHeader, name), &agentv1.EndSessionRequest{}); status.Code(err) != codes.Aborted {
			t.Fatalf("EndSession naming session %.20q: %v, want Aborted", name, err)
		}
	}
	if got, _ := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}); got.GetUsage().GetRegions() != 0 {
		t.Fatalf("refused registrations left %d regions", got.GetUsage().GetRegions())
	}
	if err := register(mine); err != nil {
		t.Fatalf("a registration naming its own session: %v", err)
	}
	if _, err := c.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{}); status.Code(err) == codes.Aborted {
		t.Fatalf("a call without the header was refused as another session's: %v", err)
	}
}

// TestWaitNeverOutlivesItsDeadline: a Wait on a transfer that cannot finish returns PENDING at its timeout,
// and a call context's deadline bounds it too.
func TestWaitNeverOutlivesItsDeadline(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	m := shm(t, 64<<20)
	r1, _ := c.RegisterHost(ctx, m.File, 0, 32<<20)
	r2, err := c.RegisterHost(ctx, m.File, 32<<20, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: 32 << 20}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _ = tr.Wait(short) // either settled in time or cut by the deadline
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("wait with a 50 ms deadline took %s", d)
	}
	if _, err := tr.Wait(ctx); err != nil {
		t.Fatalf("full wait: %v", err)
	}
}

// TestWaitFindsAnEndedTransferDoneWhateverItsTimeout: a wait whose timeout is shorter than the call itself
// answers a transfer that already ended with how it ended, never PENDING, every time (the timeout bounds waiting;
// it does not race an answer that is already there).
func TestWaitFindsAnEndedTransferDoneWhateverItsTimeout(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	m := shm(t, 8192)
	r1, _ := c.RegisterHost(ctx, m.File, 0, 4096)
	r2, err := c.RegisterHost(ctx, m.File, 4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: 4096}}, client.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		st, err := c.API().Wait(ctx, &agentv1.WaitRequest{TransferId: tr.ID, Timeout: durationpb.New(time.Nanosecond)})
		if err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			t.Fatalf("wait %d with a 1 ns timeout on a transfer that ended: %v, %v", i, st, err)
		}
	}
}

// TestWaitsRaceTheSettlingOfUnwaitedTransfers: unwaited transfers that end after their submission returned (host
// copies past the inline size) are waited for at once, again and again, so a wait often records a transfer
// before the goroutine started to record it has run; nothing may read what the wait already cleared (before
// the fix, that goroutine read the engines' transfer from the record and crashed the agent), and every wait
// answers the transfer's end.
func TestWaitsRaceTheSettlingOfUnwaitedTransfers(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	const size = 256 << 10 // past the size a host copy runs within its submission
	m := shm(t, 2*size)
	r1, _ := c.RegisterHost(ctx, m.File, 0, size)
	r2, err := c.RegisterHost(ctx, m.File, size, size)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		tr, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: size}}, client.TransferOptions{})
		if err != nil {
			t.Fatalf("submission %d: %v", i, err)
		}
		if st, err := tr.Wait(ctx); err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			t.Fatalf("wait %d: %v, %v", i, st, err)
		}
	}
	runtime.Gosched()
	time.Sleep(20 * time.Millisecond) // the settling goroutines of the last transfers run now, if they are to crash
	if _, err := c.Submit(ctx, client.Write, []client.Item{{Local: r1, Remote: client.ToRegion(r2), Length: 4096}}, client.TransferOptions{}); err != nil {
		t.Fatalf("the agent after the waits: %v", err)
	}
}

// TestTransferIDsOfAPreviousAgentAreNotFound: transfer ids carry the agent instance's epoch, as region and layout
// ids do. One agent's ids are distinct and increasing; after a restart, a wait (gRPC, fast socket, one id or a
// list), a cancel or a watch on an id the previous instance handed out is NotFound saying so, never the status of
// the new instance's transfer that happens to count to the same number (before the fix: SUCCEEDED, with that
// transfer's bytes).
func TestTransferIDsOfAPreviousAgentAreNotFound(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	a := startAgent(t, opts)
	ctx := ctxT(t)
	m := shm(t, 1<<20)
	regions := func(c *client.Client) (src, dst *client.Region) {
		src, err := c.RegisterHost(ctx, m.File, 0, 1<<19)
		if err != nil {
			t.Fatal(err)
		}
		dst, err = c.RegisterHost(ctx, m.File, 1<<19, 1<<19)
		if err != nil {
			t.Fatal(err)
		}
		return src, dst
	}
	submit := func(c *client.Client, src, dst *client.Region, length uint64, wait bool) *agentv1.TransferResponse {
		t.Helper()
		resp, err := c.API().Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_WRITE, Wait: wait,
			Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: dst.ID()}},
			Items:  []*agentv1.TransferItem{{LocalRegionId: src.ID(), Length: length}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	ca := dial(t, a)
	srcA, dstA := regions(ca)
	var old []uint64
	for i := range 5 {
		old = append(old, submit(ca, srcA, dstA, 4096*uint64(i+1), false).TransferId) // not waited for
	}
	if old[0]>>32 == 0 {
		t.Errorf("transfer id %#x carries no epoch in its high 32 bits", old[0])
	}
	for i, id := range old {
		if i > 0 && id <= old[i-1] {
			t.Fatalf("transfer ids of one agent are not distinct and increasing: %d after %d", id, old[i-1])
		}
	}
	a.stop(t)

	b := startAgent(t, opts)
	cb := dial(t, b)
	srcB, dstB := regions(cb)
	var fresh []uint64
	for range 2 * len(old) { // the new instance counts past every id the old one handed out
		resp := submit(cb, srcB, dstB, 12345, true)
		if resp.Status.GetState() != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
			t.Fatalf("a transfer of the new agent: %v", resp.Status)
		}
		fresh = append(fresh, resp.TransferId)
	}
	if fresh[0]>>32 == old[0]>>32 {
		t.Errorf("the new agent's transfer id %#x has the previous agent's epoch (its first id was %#x)", fresh[0], old[0])
	}
	for i, id := range fresh {
		if i > 0 && id <= fresh[i-1] {
			t.Fatalf("transfer ids of one agent are not distinct and increasing: %d after %d", id, fresh[i-1])
		}
	}

	const says = "not one of this agent's"
	notFound := func(what string, st *agentv1.TransferStatus, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s on transfer %d of the previous agent answered %v, want NotFound", what, old[4], st)
		}
		if client.Code(err) != codes.NotFound || !strings.Contains(err.Error(), says) {
			t.Fatalf("%s on transfer %d of the previous agent: %v, want NotFound saying %q", what, old[4], err, says)
		}
	}
	for _, id := range old {
		st, err := cb.API().Wait(ctx, &agentv1.WaitRequest{TransferId: id})
		if err == nil {
			t.Fatalf("wait on transfer %d of the previous agent answered %v, want NotFound", id, st)
		}
	}
	st, err := cb.API().Wait(ctx, &agentv1.WaitRequest{TransferId: old[4], Timeout: durationpb.New(time.Second)})
	notFound("wait", st, err)
	st, err = cb.API().Cancel(ctx, &agentv1.CancelRequest{TransferId: old[4]})
	notFound("cancel", st, err)
	watch, err := cb.API().Watch(ctx, &agentv1.WatchRequest{TransferIds: []uint64{old[4]}})
	if err == nil {
		st, err = watch.Recv()
	}
	notFound("watch", st, err)
	conn := fastConn(t, b, cb)
	for _, ids := range [][]uint64{{old[4]}, {fresh[0], old[4]}} {
		r := rawFrame(t, conn, waitFrame(t, time.Second, ids...))
		if codes.Code(r.Code) != codes.NotFound || !strings.Contains(r.Message, says) {
			t.Fatalf("fast wait on %v (the last of the previous agent): %v %q %v, want NotFound saying %q",
				ids, codes.Code(r.Code), r.Message, r.Response, says)
		}
	}
	// The new agent's own ids still answer.
	if st, err := cb.API().Wait(ctx, &agentv1.WaitRequest{TransferId: fresh[4]}); err != nil || st.Bytes != 12345 {
		t.Fatalf("wait on the new agent's own transfer: %v, %v", st, err)
	}
	if r := rawFrame(t, conn, waitFrame(t, time.Second, fresh...)); r.Code != 0 || r.Response.GetStatus().GetTransferId() != fresh[len(fresh)-1] {
		t.Fatalf("fast wait on the new agent's own transfers: %v", r)
	}
}

// TestARegistrationAfterARestartIsNotMadeBehindTheClientsBack: the agent restarts while the client makes no
// call; the client's next registration reaches the new agent, which refuses it (it names the old session), so
// the client hears ErrSessionLost, nothing is held for it there, and after Recover the same name registers.
func TestARegistrationAfterARestartIsNotMadeBehindTheClientsBack(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	m := shm(t, 8192)
	if _, err := c.RegisterHost(ctx, m.File, 0, 4096, client.Segment("before")); err != nil {
		t.Fatal(err)
	}
	a.stop(t)
	startAgent(t, opts)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := c.RegisterHost(ctx, m.File, 4096, 4096, client.Segment("after"))
		if errors.Is(err, client.ErrSessionLost) {
			break
		}
		if err == nil {
			t.Fatal("a registration after the agent restarted was made in a session the client does not know of")
		}
		if time.Now().After(deadline) {
			t.Fatalf("registering after the restart: %v, want ErrSessionLost", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := c.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, m.File, 4096, 4096, client.Segment("after")); err != nil {
		t.Fatalf("registering the name after Recover: %v", err)
	}
	info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Usage.GetRegions() != 2 {
		t.Fatalf("the new agent holds %d regions of the caller, want 2", info.Usage.GetRegions())
	}
}

// TestRecoverAndCloseAtOnce: Close while Recover registers the regions again after a restart: neither hangs,
// and (under the race detector) the fd a registration passes is never closed under it.
func TestRecoverAndCloseAtOnce(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	a := startAgent(t, opts)
	c, err := client.Dial(ctxT(t), a.srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	m := shm(t, 256<<10)
	var first *client.Region
	for i := range uint64(64) {
		r, err := c.RegisterHost(ctx, m.File, i*4096, 4096)
		if err != nil {
			t.Fatal(err)
		}
		first = cmp.Or(first, r)
	}
	old := first.ID()
	a.stop(t)
	startAgent(t, opts)
	done := make(chan error, 1)
	go func() { done <- c.Recover(ctx) }()
	for deadline := time.Now().Add(10 * time.Second); first.ID() == old && time.Now().Before(deadline); {
		runtime.Gosched() // close once Recover is registering
	}
	_ = c.Close()
	select {
	case err := <-done:
		t.Logf("Recover beside Close: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Recover beside Close did not end")
	}
}

// TestACallAfterCloseSaysTheClientIsClosed: every kind of call on a closed client fails with ErrClosed (not
// gRPC's "the client connection is closing"), and closing again does nothing.
func TestACallAfterCloseSaysTheClientIsClosed(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c, err := client.Dial(ctxT(t), a.srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	m := shm(t, 8192)
	r, err := c.RegisterHost(ctx, m.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("closing again: %v", err)
	}
	if _, err := c.Write(ctx, r, 0, client.ToRegion(r), 4096, 16); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a write after Close: %v, want ErrClosed", err)
	}
	if _, err := c.RegisterHost(ctx, m.File, 4096, 4096); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a registration after Close: %v, want ErrClosed", err)
	}
	if _, err := c.Submit(ctx, client.Write, []client.Item{{Local: r, Remote: client.ToRegion(r), RemoteOffset: 4096, Length: 16}}, client.TransferOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a submission after Close: %v, want ErrClosed", err)
	}
	// These said gRPC's "the client connection is closing", or succeeded (PrepareBlocks).
	if _, err := c.ResolveSegment(ctx, "", "kv"); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a segment resolved after Close: %v, want ErrClosed", err)
	}
	if _, _, err := c.Notifications(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("notifications after Close: %v, want ErrClosed", err)
	}
	if err := c.Recover(ctx); !errors.Is(err, client.ErrClosed) {
		t.Errorf("a recovery after Close: %v, want ErrClosed", err)
	}
	if _, err := c.PrepareBlocks(client.Write, nil, nil, client.RemoteLayout{}, nil, client.TransferOptions{}); !errors.Is(err, client.ErrClosed) {
		t.Errorf("blocks prepared after Close: %v, want ErrClosed", err)
	}
	if got := client.Code(client.ErrClosed); got != codes.Canceled {
		t.Errorf("Code(ErrClosed) = %v, want Canceled (gRPC's own call on a closed connection)", got)
	}
}

// TestAnUnavailableTheAgentAnswersIsMarked: the Unavailable the agent answers itself (a node it has no peer
// channel to) carries AnsweredHeader with its instance, so a client need not watch its
// connection to tell it from one that broke; other errors and successes carry no such trailer.
func TestAnUnavailableTheAgentAnswersIsMarked(t *testing.T) {
	_, c, info := agentSession(t)
	ctx := ctxT(t)
	var trailer metadata.MD
	_, err := c.API().ResolveSegment(ctx, &agentv1.ResolveSegmentRequest{Node: "node-nowhere", Segment: "kv"}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("resolving a segment of a node without a peer channel: %v, want Unavailable", err)
	}
	if got := trailer.Get(server.AnsweredHeader); len(got) != 1 || got[0] != info.Instance {
		t.Fatalf("the agent's own Unavailable carries %s %q, want the instance %q", server.AnsweredHeader, got, info.Instance)
	}
	for name, call := range map[string]func(opt grpc.CallOption) error{
		"a refusal (NotFound)": func(opt grpc.CallOption) error {
			_, err := c.API().ResolveSegment(ctx, &agentv1.ResolveSegmentRequest{Segment: "no-such-segment"}, opt)
			return err
		},
		"a success": func(opt grpc.CallOption) error {
			_, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{}, opt)
			return err
		},
	} {
		trailer = nil
		err := call(grpc.Trailer(&trailer))
		if len(trailer.Get(server.AnsweredHeader)) != 0 {
			t.Fatalf("%s (%v) carries %s", name, err, server.AnsweredHeader)
		}
	}
}

// agentSession starts an agent and a client of it, and returns what GetInfo told that client.
func agentSession(t *testing.T) (*agent, *client.Client, *agentv1.GetInfoResponse) {
	t.Helper()
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	info, err := c.API().GetInfo(ctxT(t), &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return a, c, info
}

// TestCallsBesideCloseDoNotDeadlock: Close takes each region's lock under the client's, and a call reading a
// region's id took the client's under the region's: a call beside Close could deadlock both. Calls on every
// region run while the client closes; all of them and Close end.
func TestCallsBesideCloseDoNotDeadlock(t *testing.T) {
	for round := range 20 {
		a := startAgent(t, baseOptions(t, newProcFixture(t)))
		c, err := client.Dial(ctxT(t), a.srv.SocketPath(), client.WithoutFastPath())
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxT(t)
		m := shm(t, 64<<10)
		var regions []*client.Region
		for i := range uint64(16) {
			r, err := c.RegisterHost(ctx, m.File, i*4096, 4096)
			if err != nil {
				t.Fatal(err)
			}
			regions = append(regions, r)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, r := range regions {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = c.Deregister(ctx, r) // reads the region's id first
				}
			})
		}
		closed := make(chan struct{})
		go func() { _ = c.Close(); close(stop); wg.Wait(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Close and the calls beside it did not end within 10 s", round)
		}
		a.stop(t)
	}
}
