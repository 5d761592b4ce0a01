// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

func fill(t *testing.T, b []byte) {
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
}

func TestSocketModeAndRemovalOnShutdown(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	for _, p := range []string{a.srv.SocketPath(), a.srv.FDSocketPath()} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: mode %v, want a socket with 0660", p, fi.Mode())
		}
	}
	if !strings.HasSuffix(a.srv.SocketPath(), "/kv/agent.sock") {
		t.Errorf("socket at %s, want <dir>/<pool>/agent.sock", a.srv.SocketPath())
	}
	a.stop(t)
	for _, p := range []string{a.srv.SocketPath(), a.srv.FDSocketPath()} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after shutdown (%v)", p, err)
		}
	}
}

// bind gives a socket the mode the umask leaves: under umask 0, everyone's. A watcher listing the pool's directory
// while agents start must never see a socket at its path with a mode other than 0660, nor a directory beside
// them that others may enter (where the agent binds before the chmod); after each start only the three sockets
// are there. The old window between bind and chmod was microseconds: the watcher meets it by chance, which over
// 60 starts it did in 6 of 6 runs against the old agent.
func TestSocketsAppearOnlyWithTheirFinalMode(t *testing.T) {
	defer syscall.Umask(syscall.Umask(0))
	opts := baseOptions(t, newProcFixture(t))
	dir := filepath.Join(opts.SocketDir, opts.PoolName)
	stop, seen := make(chan struct{}), make(chan []string, 1)
	go func() {
		var wrong []string
		defer func() { seen <- wrong }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				fi, err := e.Info()
				if err != nil {
					continue // removed between the listing and the look
				}
				socket := fi.Mode()&os.ModeSocket != 0 && fi.Mode().Perm() == 0o660
				private := fi.IsDir() && fi.Mode().Perm() == 0o700
				if !socket && !private {
					wrong = append(wrong, fmt.Sprintf("%s %v", e.Name(), fi.Mode()))
				}
			}
		}
	}()
	for range 60 {
		a := startAgent(t, opts)
		// The fd socket is linked last, and its private directory removed right after.
		want := []string{server.FastSocketName, server.FDSocketName, server.SocketName}
		var names []string
		for deadline := time.Now().Add(2 * time.Second); !slices.Equal(names, want) && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			names = names[:0]
			for _, e := range entries {
				names = append(names, e.Name())
			}
		}
		if !slices.Equal(names, want) {
			t.Fatalf("socket directory holds %v after the start, want %v", names, want)
		}
		a.stop(t)
	}
	close(stop)
	if wrong := <-seen; len(wrong) > 0 {
		t.Errorf("seen in the socket directory while agents started: %v", wrong)
	}
}

func TestGetInfoNegotiatesVersion(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	info := c.Info()
	if info.ApiVersion != "v1" || info.NodeName != "node-a" || info.PoolName != "kv" || !strings.HasPrefix(info.Caller.Identity, "local/") {
		t.Fatalf("GetInfo = %v", info)
	}
	if int(info.Caller.Pid) != os.Getpid() {
		t.Errorf("caller pid %d, want this process %d", info.Caller.Pid, os.Getpid())
	}
	_, err := c.API().GetInfo(ctxT(t), &agentv1.GetInfoRequest{ApiVersions: []string{"v9"}})
	if client.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "v1") {
		t.Fatalf("GetInfo with only v9: %v, want FailedPrecondition naming v1", err)
	}
}

func TestLocalTransfersBothWaysChecksumsMatch(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	const size = 1 << 20
	src, dst := shm(t, size), shm(t, size)
	fill(t, src.Bytes)
	rs, err := c.RegisterHost(ctx, src.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, size, client.Segment("dst"))
	if err != nil {
		t.Fatal(err)
	}
	// Write the first half in 64 KiB items, asynchronously.
	var items []client.Item
	for off := uint64(0); off < size/2; off += 64 << 10 {
		items = append(items, client.Item{Local: rs, LocalOffset: off, Remote: client.ToRegion(rd), RemoteOffset: off, Length: 64 << 10, Tag: "half"})
	}
	tr, err := c.Submit(ctx, client.Write, items, client.TransferOptions{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Engines) == 0 || tr.Engines[0] != "xgmi" {
		t.Errorf("engines %v, want xgmi (same-node host copy)", tr.Engines)
	}
	st, err := tr.Wait(ctx)
	if err != nil || st.State != agentv1.TransferState_TRANSFER_STATE_SUCCEEDED {
		t.Fatalf("wait: %v %v", st, err)
	}
	// Read the second half back, in one round trip.
	if _, err := c.Do(ctx, client.Read, []client.Item{{Local: rd, LocalOffset: size / 2, Remote: client.ToRegion(rs), RemoteOffset: size / 2, Length: size / 2}}, client.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(src.Bytes) != sha256.Sum256(dst.Bytes) {
		t.Fatal("checksums differ after writing one half and reading the other")
	}
	// Wait on a settled transfer returns the same status again.
	if st2, err := tr.Wait(ctx); err != nil || st2.State != st.State {
		t.Fatalf("second wait: %v %v", st2, err)
	}
}

// TestBadRequestsGetClearErrorsAndChangeNothing covers a malformed request, a bad fd and an out-of-range item.
func TestBadRequestsGetClearErrorsAndChangeNothing(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)
	src, dst := shm(t, 8192), shm(t, 8192)
	fill(t, src.Bytes)
	rs, err := c.RegisterHost(ctx, src.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	usage := func() *agentv1.Usage {
		info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return info.Usage
	}
	before := usage()
	zero := make([]byte, 8192)

	// Malformed: no op, no items, a remote naming nothing.
	for name, req := range map[string]*agentv1.TransferRequest{
		"no op":     {Items: []*agentv1.TransferItem{{LocalRegionId: rs.ID(), Length: 1, Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: rd.ID()}}}}},
		"no items":  {Op: agentv1.Op_OP_WRITE},
		"no remote": {Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{LocalRegionId: rs.ID(), Length: 1}}},
		"bad descriptor": {Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{LocalRegionId: rs.ID(), Length: 1,
			Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_Desc{Desc: []byte("junk")}}}}},
	} {
		_, err := c.API().Transfer(ctx, req)
		if client.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}

	// Bad fd: a pipe is not shared memory; a range beyond the memory; a token nobody issued.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if _, err := c.RegisterHost(ctx, pr, 0, 4096); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is a pipe") {
		t.Errorf("registering a pipe: %v, want InvalidArgument saying it is a pipe", err)
	}
	if _, err := c.RegisterHost(ctx, src.File, 4096, 8192); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "outside") {
		t.Errorf("registering beyond the memory: %v, want InvalidArgument", err)
	}
	_, err = c.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
		HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: "00112233445566778899aabbccddeeff", Length: 4096})
	if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "token") {
		t.Errorf("registering with an unknown token: %v, want InvalidArgument about the token", err)
	}

	// Out of range: one good item and one overrunning item; the batch is refused whole.
	_, err = c.Do(ctx, client.Write, []client.Item{
		{Local: rs, Remote: client.ToRegion(rd), Length: 4096, Tag: "good"},
		{Local: rs, LocalOffset: 4096, Remote: client.ToRegion(rd), RemoteOffset: 8000, Length: 4096, Tag: "overrun"},
	}, client.TransferOptions{})
	if client.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), `"overrun"`) {
		t.Errorf("overrunning item: %v, want OutOfRange naming tag overrun", err)
	}
	if !bytes.Equal(dst.Bytes, zero) {
		t.Error("a refused batch changed the destination")
	}
	after := usage()
	if after.Regions != before.Regions || after.RegisteredBytes != before.RegisteredBytes || after.InFlight != 0 {
		t.Errorf("usage changed from %v to %v", before, after)
	}
	// The good item still works on its own.
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, 4096); err != nil || !bytes.Equal(dst.Bytes[:4096], src.Bytes[:4096]) {
		t.Fatalf("valid write after refusals: %v", err)
	}
}

func TestLimitsPerCaller(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.Limits = server.Limits{MaxRegions: 2, MaxRegisteredBytes: 1 << 20, MaxInFlight: 8, MaxItemsPerTransfer: 4}
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	m := shm(t, 4<<20)
	r1, err := c.RegisterHost(ctx, m.File, 0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, m.File, 4096, 2<<20); client.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "limit") {
		t.Errorf("registering past the byte limit: %v, want ResourceExhausted", err)
	}
	r2, err := c.RegisterHost(ctx, m.File, 8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, m.File, 16384, 4096); client.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "2 regions") {
		t.Errorf("third region: %v, want ResourceExhausted naming 2 regions", err)
	}
	var items []client.Item
	for i := range 5 {
		items = append(items, client.Item{Local: r1, LocalOffset: uint64(i) * 8, Remote: client.ToRegion(r2), RemoteOffset: uint64(i) * 8, Length: 8})
	}
	if _, err := c.Do(ctx, client.Write, items, client.TransferOptions{}); client.Code(err) != codes.InvalidArgument {
		t.Errorf("5 items with a limit of 4: %v, want InvalidArgument", err)
	}
	// Deregistering frees the quota.
	if err := c.Deregister(ctx, r2); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterHost(ctx, m.File, 16384, 4096); err != nil {
		t.Fatalf("registering after a deregistration: %v", err)
	}
}

func TestConnectionEndDeregistersRegions(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	ctx := ctxT(t)
	observer := dial(t, a) // same caller key (this process, local): sees the usage
	c := dial(t, a)
	m := shm(t, 8192)
	if _, err := c.RegisterHost(ctx, m.File, 0, 8192, client.Segment("gone-soon")); err != nil {
		t.Fatal(err)
	}
	info, _ := observer.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if info.Usage.Regions != 1 {
		t.Fatalf("usage %v, want 1 region", info.Usage)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		info, _ := observer.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
		_, segErr := observer.ResolveSegment(ctx, "", "gone-soon")
		if info.Usage.Regions == 0 && client.Code(segErr) == codes.NotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("regions of a closed connection still registered: %v, segment: %v", info.Usage, segErr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNotificationsReachTheTarget(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	ctx := ctxT(t)
	c := dial(t, a)
	src, dst := shm(t, 4096), shm(t, 4096)
	rs, _ := c.RegisterHost(ctx, src.File, 0, 4096)
	rd, err := c.RegisterHost(ctx, dst.File, 0, 4096, client.Segment("inbox"))
	if err != nil || rs == nil {
		t.Fatal(err)
	}
	ch, _, err := c.Notifications(ctx, rd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Do(ctx, client.Write, []client.Item{{Local: rs, Remote: client.ToSegment("", "inbox"), Length: 4096}},
		client.TransferOptions{Notify: []byte("kv-block-7 ready")}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-ch:
		if string(n.Payload) != "kv-block-7 ready" || n.RegionId != rd.ID() || n.Segment != "inbox" || n.SourceNode != "node-a" {
			t.Fatalf("notification %v", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification within 5 s")
	}
}

func TestPoolMemoryIsLentAndReturned(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	pool := newHostPool(t, 1<<20)
	opts.Pool = pool
	a := startAgent(t, opts)
	ctx := ctxT(t)
	c := dial(t, a)
	if pm := c.Info().PoolMemory; pm == nil || pm.TotalBytes != 1<<20 || pm.FreeBytes != 1<<20 {
		t.Fatalf("pool memory info %v", pm)
	}
	slice, err := c.AllocateFromPool(ctx, 64<<10, client.Segment("pooled"))
	if err != nil {
		t.Fatal(err)
	}
	fill(t, slice.Bytes)
	dst := shm(t, 64<<10)
	rd, err := c.RegisterHost(ctx, dst.File, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, slice.Region, 0, client.ToRegion(rd), 0, 64<<10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(slice.Bytes, dst.Bytes) {
		t.Fatal("bytes written from the pool slice differ")
	}
	if _, free := pool.Usage(); free != 1<<20-64<<10 {
		t.Fatalf("pool free %d after lending 64 KiB", free)
	}
	if _, err := c.AllocateFromPool(ctx, 2<<20); client.Code(err) != codes.ResourceExhausted {
		t.Errorf("allocating more than the pool: %v, want ResourceExhausted", err)
	}
	if err := c.Release(ctx, slice); err != nil {
		t.Fatal(err)
	}
	if _, free := pool.Usage(); free != 1<<20 {
		t.Fatalf("pool free %d after release, want all", free)
	}
	// A slice held by a connection that ends goes back too.
	other := dial(t, a)
	if _, err := other.AllocateFromPool(ctx, 4096); err != nil {
		t.Fatal(err)
	}
	other.Close()
	deadline := time.Now().Add(5 * time.Second)
	for _, free := pool.Usage(); free != 1<<20; _, free = pool.Usage() {
		if time.Now().After(deadline) {
			t.Fatalf("pool free %d after the borrower left", free)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
