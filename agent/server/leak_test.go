// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
)

// leakFailedRequests is how many failed requests the storm sends; each kind of failure gets an equal share.
const leakFailedRequests = 10_000

// openFDs counts this process's open file descriptors: the test's clients and the agent share the process, so
// an fd the agent keeps after a refused request (an SCM_RIGHTS fd it did not close, a connection it did not
// drop) shows here.
func openFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("counting open fds needs /proc/self/fd: %v", err)
	}
	return len(entries) - 1 // ReadDir's own handle on the directory
}

// fdsWithin returns the open fd count once it is at most limit, or after 5 s: connections of an agent that
// restarted close asynchronously.
func fdsWithin(t *testing.T, limit int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC() // finalizers close fds of dropped os.Files
		if n := openFDs(t); n <= limit || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits, up to a deadline, for goroutines and fds to come back to within slack of their baselines:
// gRPC and the agent end per-connection goroutines asynchronously after a client goes away.
func settle(t *testing.T, baseGoroutines, baseFDs int) (goroutines, fds int) {
	t.Helper()
	const goroutineSlack, fdSlack = 5, 2
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC() // finalizers close fds of os.Files the storm dropped
		goroutines, fds = runtime.NumGoroutine(), openFDs(t)
		if goroutines <= baseGoroutines+goroutineSlack && fds <= baseFDs+fdSlack {
			return goroutines, fds
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			links, _ := filepath.Glob("/proc/self/fd/*")
			var targets []string
			for _, l := range links {
				if dst, err := os.Readlink(l); err == nil {
					targets = append(targets, dst)
				}
			}
			t.Fatalf("after %d failed requests: %d goroutines (baseline %d, slack %d), %d fds (baseline %d, slack %d)\nfds: %v\ngoroutines:\n%s",
				leakFailedRequests, goroutines, baseGoroutines, goroutineSlack, fds, baseFDs, fdSlack, targets, buf)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestNoLeakAfterTenThousandFailedRequests sends failed requests of every kind a hostile or buggy caller can
// make — unknown regions, out-of-range items, malformed requests, an fd token nobody issued, an fd of the wrong
// kind, unknown transfers and segments, and connections that make one bad call and hang up — and checks that
// the agent keeps no goroutine, fd or registration from them, and that a caller registered before the storm
// still moves bytes correctly.
func TestNoLeakAfterTenThousandFailedRequests(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	ctx := ctxT(t)

	// The bystander registers before the storm and must be unaffected by it.
	good := dial(t, a)
	const size = 64 << 10
	src, dst := shm(t, size), shm(t, size)
	fill(t, src.Bytes)
	rs, err := good.RegisterHost(ctx, src.File, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	rd, err := good.RegisterHost(ctx, dst.File, 0, size, client.Segment("bystander"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := good.Write(ctx, rs, 0, client.ToRegion(rd), 0, size/2); err != nil {
		t.Fatalf("bystander write before the storm: %v", err)
	}

	bad := dial(t, a)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close(); pw.Close() })
	usage := func() *agentv1.Usage {
		info, err := good.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return info.Usage
	}
	before := usage()
	baseGoroutines, baseFDs := settle(t, runtime.NumGoroutine(), openFDs(t))

	api := bad.API()
	unknownRegion := uint64(1<<62 + 7)
	remote := &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: rd.ID()}}
	type failure struct {
		name string
		want codes.Code // codes.Unknown: any error will do, only success is wrong
		call func(i int) error
	}
	failures := []failure{
		{"unknown local region", codes.Unknown, func(int) error {
			_, err := api.Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_WRITE, Wait: true,
				Items: []*agentv1.TransferItem{{LocalRegionId: unknownRegion, Length: 64, Remote: remote}}})
			return err
		}},
		{"out-of-range item on the fast path", codes.OutOfRange, func(int) error {
			_, err := bad.Do(ctx, client.Write, []client.Item{{Local: rs, Remote: client.ToRegion(rd), RemoteOffset: size - 8, Length: 64, Tag: "overrun"}}, client.TransferOptions{})
			return err
		}},
		{"malformed: no op", codes.InvalidArgument, func(int) error {
			_, err := api.Transfer(ctx, &agentv1.TransferRequest{Items: []*agentv1.TransferItem{{LocalRegionId: rs.ID(), Length: 1, Remote: remote}}})
			return err
		}},
		{"malformed: junk descriptor", codes.InvalidArgument, func(i int) error {
			_, err := api.Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_READ, Items: []*agentv1.TransferItem{{LocalRegionId: rs.ID(), Length: 1,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_Desc{Desc: []byte(fmt.Sprintf("junk-%d", i))}}}}})
			return err
		}},
		{"fd token nobody issued", codes.InvalidArgument, func(i int) error {
			_, err := api.RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
				HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: fmt.Sprintf("%032x", i), Length: 4096})
			return err
		}},
		{"fd of the wrong kind (a pipe)", codes.InvalidArgument, func(int) error {
			_, err := bad.RegisterHost(ctx, pr, 0, 4096)
			return err
		}},
		{"wait on an unknown transfer", codes.Unknown, func(i int) error {
			_, err := api.Wait(ctx, &agentv1.WaitRequest{TransferId: uint64(1<<40 + i)})
			return err
		}},
		{"unknown segment", codes.Unknown, func(i int) error {
			_, err := bad.ResolveSegment(ctx, "node-a", fmt.Sprintf("no-such-segment-%d", i))
			return err
		}},
		{"deregister an unknown region", codes.Unknown, func(i int) error {
			_, err := api.DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: unknownRegion + uint64(i)})
			return err
		}},
		{"a connection that makes one bad call and hangs up", codes.Unknown, func(int) error {
			c, err := client.Dial(ctx, a.srv.SocketPath())
			if err != nil {
				return err // refused at the door: failed too, and nothing to hang up
			}
			defer c.Close()
			_, err = c.API().Transfer(ctx, &agentv1.TransferRequest{Op: agentv1.Op_OP_WRITE})
			return err
		}},
	}
	// Fresh connections are far slower than calls on an open one; a few hundred exercise connection teardown.
	const hangUps = 200
	perKind := (leakFailedRequests - hangUps) / (len(failures) - 1)
	sent := 0
	start := time.Now()
	for k, f := range failures {
		n := perKind
		if k == len(failures)-1 {
			n = leakFailedRequests - sent
		}
		for i := 0; i < n; i++ {
			err := f.call(i)
			if err == nil {
				t.Fatalf("%s (request %d): succeeded, want an error", f.name, i)
			}
			if f.want != codes.Unknown && client.Code(err) != f.want {
				t.Fatalf("%s (request %d): %v, want %s", f.name, i, err, f.want)
			}
		}
		sent += n
	}
	if sent != leakFailedRequests {
		t.Fatalf("sent %d failed requests, want %d", sent, leakFailedRequests)
	}
	t.Logf("%d failed requests in %s", sent, time.Since(start).Round(time.Millisecond))

	goroutines, fds := settle(t, baseGoroutines, baseFDs)
	t.Logf("goroutines %d (baseline %d), fds %d (baseline %d)", goroutines, baseGoroutines, fds, baseFDs)
	if after := usage(); after.Regions != before.Regions || after.RegisteredBytes != before.RegisteredBytes || after.InFlight != 0 {
		t.Errorf("the storm changed the agent's usage from %v to %v", before, after)
	}
	// The bystander still moves bytes, and the ones it moved before are intact.
	if _, err := good.Write(ctx, rs, size/2, client.ToRegion(rd), size/2, size/2); err != nil {
		t.Fatalf("bystander write after the storm: %v", err)
	}
	if !bytes.Equal(dst.Bytes, src.Bytes) {
		t.Fatal("bystander's destination differs from its source after the storm")
	}
}
