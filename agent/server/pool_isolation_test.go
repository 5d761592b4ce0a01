// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fabricxfer/fabricxfer/agent/server/identity"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	fxv1 "github.com/fabricxfer/fabricxfer/api/v1alpha1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// lentSlice is pool memory as a borrower holds it: the agent's answer, the fd it fetched and its mapping of
// everything that fd reaches.
type lentSlice struct {
	resp *agentv1.AllocateFromPoolResponse
	file *os.File
	mem  []byte
}

// TestPoolSlicesReachOnlyTheirBorrower: two pods borrow host pool memory through the real socket. Each gets a
// descriptor of its own slice and nothing more, and neither can reach the other's slice through the agent.
func TestPoolSlicesReachOnlyTheirBorrower(t *testing.T) {
	kube := startAPIServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	podA := createPod(t, kube, "infer", "prefill-0", "node-a")
	podB := createPod(t, kube, "infer", "decode-0", "node-a")
	if err := kube.Create(ctx, &fxv1.TransferPool{ObjectMeta: metav1.ObjectMeta{Namespace: "infer", Name: "kv"}}); err != nil {
		t.Fatalf("creating the TransferPool: %v", err)
	}
	proc := newProcFixture(t)
	opts := baseOptions(t, proc)
	opts.Identifier = identity.Identifier{ProcRoot: proc.root, Pods: &identity.APIPodResolver{Reader: kube, NodeName: "node-a"}}
	opts.Policy = &identity.APIPoolPolicy{Reader: kube, Namespace: "infer", Name: "kv", TTL: time.Minute}
	pool := newHostPool(t, 1<<20)
	opts.Pool = pool
	a := startAgent(t, opts)
	proc.setPod(t, podA)
	ca := dial(t, a)
	proc.setPod(t, podB)
	cb := dial(t, a)

	borrow := func(c *client.Client, pod string, length uint64) lentSlice {
		t.Helper()
		proc.setPod(t, pod) // the fd socket identifies the caller on its own connection
		resp, err := c.API().AllocateFromPool(ctx, &agentv1.AllocateFromPoolRequest{Length: length})
		if err != nil {
			t.Fatal(err)
		}
		f, err := fdpass.Get(ctx, a.srv.FDSocketPath(), resp.FdToken)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		// The descriptor is the slice: its size is the slice's, and it is what the answer says to map.
		if uint64(st.Size) != length || resp.Offset != 0 || resp.Length != length || resp.AllocationSize != length {
			t.Fatalf("pod %s lent [%d, +%d) of %d bytes through an fd of %d bytes; want an fd of exactly its %d bytes",
				pod, resp.Offset, resp.Length, resp.AllocationSize, st.Size, length)
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(m) })
		return lentSlice{resp: resp, file: f, mem: m}
	}
	sa := borrow(ca, podA, 5000)
	sb := borrow(cb, podB, 3*4096)
	var ia, ib unix.Stat_t
	if err := unix.Fstat(int(sa.file.Fd()), &ia); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(sb.file.Fd()), &ib); err != nil {
		t.Fatal(err)
	}
	if ia.Ino == ib.Ino {
		t.Fatal("both pods were lent descriptors of one file")
	}
	fill(t, sa.mem)
	keepA := append([]byte(nil), sa.mem...)
	if !bytes.Equal(sb.mem, make([]byte, len(sb.mem))) {
		t.Fatal("B's descriptor reaches bytes A wrote")
	}

	t.Run("B cannot register beyond its own slice", func(t *testing.T) {
		proc.setPod(t, podB)
		token, err := fdpass.Put(ctx, a.srv.FDSocketPath(), sb.file)
		if err != nil {
			t.Fatal(err)
		}
		_, err = cb.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
			HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Offset: 0, Length: uint64(len(sb.mem)) + 5000})
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "outside the passed memory") {
			t.Fatalf("B registering past the end of its slice: %v", err)
		}
	})

	t.Run("B cannot fetch A's descriptor", func(t *testing.T) {
		proc.setPod(t, podA)
		resp, err := ca.API().AllocateFromPool(ctx, &agentv1.AllocateFromPoolRequest{Length: 4096})
		if err != nil {
			t.Fatal(err)
		}
		proc.setPod(t, podB)
		if f, err := fdpass.Get(ctx, a.srv.FDSocketPath(), resp.FdToken); err == nil {
			f.Close()
			t.Fatal("B fetched the descriptor of A's slice with A's token")
		}
		// The token was refused for who asked, not spent: A still fetches it.
		proc.setPod(t, podA)
		f, err := fdpass.Get(ctx, a.srv.FDSocketPath(), resp.FdToken)
		if err != nil {
			t.Fatalf("A fetching its own token after B's attempt: %v", err)
		}
		f.Close()
		if _, err := ca.API().Release(ctx, &agentv1.ReleaseRequest{AllocationId: resp.AllocationId}); err != nil {
			t.Fatal(err)
		}
		_, err = ca.API().Release(ctx, &agentv1.ReleaseRequest{AllocationId: resp.AllocationId})
		if client.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "released already") {
			t.Fatalf("releasing a slice twice: %v, want NotFound saying it may be released already", err)
		}
	})

	t.Run("B cannot transfer, release or deregister A's slice", func(t *testing.T) {
		regionA, regionB := sa.resp.Region.Id, sb.resp.Region.Id
		for name, req := range map[string]*agentv1.TransferRequest{
			"read A into B": {Op: agentv1.Op_OP_READ, Items: []*agentv1.TransferItem{{LocalRegionId: regionB, Length: 4096,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: regionA}}}}},
			"write B into A": {Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{LocalRegionId: regionB, Length: 4096,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: regionA}}}}},
			"A's slice as B's local side": {Op: agentv1.Op_OP_WRITE, Items: []*agentv1.TransferItem{{LocalRegionId: regionA, Length: 4096,
				Remote: &agentv1.RemoteRef{Target: &agentv1.RemoteRef_RegionId{RegionId: regionB}}}}},
		} {
			if _, err := cb.API().Transfer(ctx, req); client.Code(err) != codes.NotFound {
				t.Errorf("%s: %v, want NotFound", name, err)
			}
		}
		if _, err := cb.API().Release(ctx, &agentv1.ReleaseRequest{AllocationId: sa.resp.AllocationId}); client.Code(err) != codes.NotFound {
			t.Errorf("B releasing A's allocation: %v, want NotFound", err)
		}
		if _, err := cb.API().DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: regionA}); client.Code(err) != codes.NotFound {
			t.Errorf("B deregistering A's slice: %v, want NotFound", err)
		}
		if !bytes.Equal(sa.mem, keepA) {
			t.Error("A's slice changed")
		}
		if !bytes.Equal(sb.mem, make([]byte, len(sb.mem))) {
			t.Error("B's slice received A's bytes")
		}
	})

	t.Run("a released slice's pages leave the borrower's mapping", func(t *testing.T) {
		fill(t, sb.mem)
		if _, err := cb.API().Release(ctx, &agentv1.ReleaseRequest{AllocationId: sb.resp.AllocationId}); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(sb.mem, make([]byte, len(sb.mem))) {
			t.Error("B's bytes survive the release of its slice")
		}
		page := uint64(os.Getpagesize())
		if _, free := pool.Usage(); free != 1<<20-(5000+page-1)/page*page {
			t.Errorf("pool free %d with only A's 5000-byte slice lent", free)
		}
	})
}

// TestAnAgentWithoutPoolMemorySaysHowToLendIt: AllocateFromPool on an agent that lends no memory is Unavailable
// naming both remedies (the pool's spec in a cluster, --pool-host-bytes standalone).
func TestAnAgentWithoutPoolMemorySaysHowToLendIt(t *testing.T) {
	c := dial(t, startAgent(t, baseOptions(t, newProcFixture(t))))
	_, err := c.AllocateFromPool(ctxT(t), 4096)
	if client.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--pool-host-bytes") {
		t.Fatalf("allocating from an agent without pool memory: %v, want Unavailable naming --pool-host-bytes", err)
	}
}
