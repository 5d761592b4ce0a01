// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// endSessionOnAdd has the next region the agent records end its session before the call that added it goes on:
// victim's connection is closed and the call waits until the session's teardown finished, leaving others
// sessions. The channel closes once that happened.
func endSessionOnAdd(t *testing.T, a *agent, victim *client.Client, others int) <-chan struct{} {
	t.Helper()
	ended := make(chan struct{})
	var once sync.Once
	a.srv.OnRegionAdded(func() {
		once.Do(func() {
			defer close(ended)
			victim.Close()
			for deadline := time.Now().Add(5 * time.Second); a.srv.Sessions() > others; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("the closed connection's session was not torn down within 5 s (%d sessions)", a.srv.Sessions())
					return
				}
			}
		})
	})
	t.Cleanup(func() { a.srv.OnRegionAdded(nil) })
	return ended
}

// memfdHeld counts this process's descriptors and mappings of the memfd named name.
func memfdHeld(t *testing.T, name string) (fds, maps int) {
	t.Helper()
	target := "/memfd:" + name + " (deleted)"
	links, err := filepath.Glob("/proc/self/fd/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if dst, err := os.Readlink(l); err == nil && dst == target {
			fds++
		}
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("counting mappings needs /proc/self/maps: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(line, target) {
			maps++
		}
	}
	return fds, maps
}

// noGC turns the garbage collector off until the test ends: the finalizer of an os.File the agent dropped
// without closing would close its descriptor, hiding the leak.
func noGC(t *testing.T) {
	was := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(was) })
}

// released waits up to 5 s for the open descriptors to come back to base and for held (when set) to say the agent
// keeps nothing more.
func released(t *testing.T, base int, held func() string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds, more := openFDs(t), ""
		if held != nil {
			more = held()
		}
		if fds <= base && more == "" {
			return
		}
		if time.Now().After(deadline) {
			links, _ := filepath.Glob("/proc/self/fd/*")
			var targets []string
			for _, l := range links {
				if dst, err := os.Readlink(l); err == nil {
					targets = append(targets, dst)
				}
			}
			t.Fatalf("the session ended, yet the agent holds %d fds (baseline %d) %s\nfds: %v", fds, base, more, targets)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A registration whose session ends (its connection closes) while it runs must leave nothing once both settle:
// here the session's teardown runs to its end right after the region was recorded, before the call that made it
// goes on. The memory's descriptor and mapping are released, the region and its segment name are gone, and a
// bystander session of the same caller keeps its region and its usage. The same holds for a pool slice lent
// then: its region, the descriptor waiting for the caller and the slice go back.
func TestLateRegistrationKeepsNothing(t *testing.T) {
	const size = 64 << 10
	const late = "late"
	// scene starts an agent and a bystander connection of the same caller holding a region of its own, which no
	// one else's teardown may touch, then dials the victim; check waits until the agent holds no more descriptors
	// than before the victim and held says nothing more is kept, then that the late region is gone (gone).
	type scene struct {
		a      *agent
		c      *client.Client
		kept   *client.Region
		usage  func() *agentv1.Usage
		before *agentv1.Usage
		base   int
		victim *client.Client
	}
	newScene := func(t *testing.T, opts server.Options) *scene {
		sc := &scene{a: startAgent(t, opts)}
		sc.c = dial(t, sc.a)
		ctx := ctxT(t)
		kept, err := sc.c.RegisterHost(ctx, shm(t, size).File, 0, size, client.Segment("bystander"))
		if err != nil {
			t.Fatal(err)
		}
		sc.kept = kept
		sc.usage = func() *agentv1.Usage {
			info, err := sc.c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			return info.Usage
		}
		sc.before = sc.usage()
		sc.base = fdsWithin(t, openFDs(t))
		noGC(t)
		sc.victim = dial(t, sc.a)
		return sc
	}
	// gone checks that the late region, which would have come right after kept, and its segment name are unknown,
	// and that the bystander's usage is as it was.
	gone := func(t *testing.T, c *client.Client, kept *client.Region, usage func() *agentv1.Usage, before *agentv1.Usage) {
		t.Helper()
		ctx := ctxT(t)
		if after := usage(); after.Regions != before.Regions || after.RegisteredBytes != before.RegisteredBytes {
			t.Errorf("the bystander's usage went from %v to %v", before, after)
		}
		if _, err := c.API().DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: kept.ID() + 1}); client.Code(err) != codes.NotFound {
			t.Errorf("deregistering the late region %d: %v, want NotFound", kept.ID()+1, err)
		}
		if _, err := c.ResolveSegment(ctx, "node-a", late); client.Code(err) != codes.NotFound {
			t.Errorf("resolving segment %q: %v, want NotFound", late, err)
		}
		if _, err := c.RegisterHost(ctx, shm(t, size).File, 0, size, client.Segment(late)); err != nil {
			t.Errorf("registering segment %q again: %v", late, err)
		}
	}

	t.Run("host memfd", func(t *testing.T) {
		sc := newScene(t, baseOptions(t, newProcFixture(t)))
		a, ctx, victim := sc.a, ctxT(t), sc.victim
		name := "late-registration"
		mem, err := client.NewSharedMemory(name, size)
		if err != nil {
			t.Fatal(err)
		}
		token, err := fdpass.Put(ctx, a.srv.FDSocketPath(), mem.File)
		if err != nil {
			t.Fatal(err)
		}
		mem.Close() // from here on every descriptor and mapping of the memfd is the agent's
		ended := endSessionOnAdd(t, a, victim, 1)
		if _, err := victim.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
			HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Length: size, SegmentName: late}); err == nil {
			t.Fatal("the registration answered on a connection closed while it ran")
		}
		<-ended
		released(t, sc.base, func() string {
			if fds, maps := memfdHeld(t, name); fds+maps > 0 {
				return fmt.Sprintf("and keeps %d descriptors and %d mappings of the registered memfd", fds, maps)
			}
			return ""
		})
		gone(t, sc.c, sc.kept, sc.usage, sc.before)
	})

	t.Run("pool slice", func(t *testing.T) {
		opts := baseOptions(t, newProcFixture(t))
		pool := newHostPool(t, 1<<20)
		opts.Pool = pool
		sc := newScene(t, opts)
		a, ctx, victim := sc.a, ctxT(t), sc.victim
		ended := endSessionOnAdd(t, a, victim, 1)
		if _, err := victim.API().AllocateFromPool(ctx, &agentv1.AllocateFromPoolRequest{Length: size, SegmentName: late}); err == nil {
			t.Fatal("the allocation answered on a connection closed while it ran")
		}
		<-ended
		released(t, sc.base, func() string {
			if total, free := pool.Usage(); free != total {
				return fmt.Sprintf("and %d bytes of the pool are still lent", total-free)
			}
			return ""
		})
		gone(t, sc.c, sc.kept, sc.usage, sc.before)
	})
}
