// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/enginetest"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
)

const domain = "nvlink:0f1e2d3c-0000-0000-0000-000000000001.7"

type twoNodes struct {
	f    *fakeFabric
	a, b *fabric.Engine
	next atomic.Uint64
}

func newTwoNodes(t *testing.T) *twoNodes {
	f := newFakeFabric()
	n := &notifier{nodes: map[string]*fabric.Engine{}}
	mk := func(node string) *fabric.Engine {
		e, err := fabric.New(fabric.Options{Node: node, Runtime: &fakeRuntime{f: f, available: true}, Notifier: n})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		n.nodes[node] = e
		return e
	}
	return &twoNodes{f: f, a: mk("node-a"), b: mk("node-b")}
}

// region allocates size bytes at offset 4096 of a fresh allocation on node
// (a sub-allocation, as a KV pool hands out) and registers it there.
func (n *twoNodes) region(t testing.TB, e *fabric.Engine, node string, size uint64, exportable bool) (engines.MemoryDesc, []byte) {
	a := n.f.alloc(int(size)+8192, exportable)
	buf := a.buf[4096 : 4096+size]
	d := engines.MemoryDesc{ID: engines.MemoryID(fmt.Sprintf("%s/%d", node, n.next.Add(1))), Node: node, Size: size,
		FabricDomain: domain, Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA},
		Handles: engines.Handles{Ptr: uintptr(addr(buf))}}
	out, err := e.Register(context.Background(), d)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	return out, buf
}

func TestContract(t *testing.T) {
	n := newTwoNodes(t)
	h := enginetest.Harness{
		Engine:     n.a,
		Directions: []engines.Direction{engines.DirWrite, engines.DirRead},
		NewPair: func(t testing.TB, dir engines.Direction, size uint64) enginetest.Pair {
			local, lbuf := n.region(t, n.a, "node-a", size, true)
			remote, rbuf := n.region(t, n.b, "node-b", size, true)
			if err := n.a.Import(context.Background(), remote.Remote()); err != nil {
				t.Fatalf("Import: %v", err)
			}
			src, dst, sbuf, dbuf := local.ID, remote.ID, lbuf, rbuf
			if dir == engines.DirRead {
				src, dst, sbuf, dbuf = remote.ID, local.ID, rbuf, lbuf
			}
			return enginetest.Pair{Src: src, Dst: dst, Size: size,
				Fill: func(off uint64, b []byte) { copy(sbuf[off:], b) },
				Read: func(off, k uint64) []byte { return append([]byte(nil), dbuf[off:off+k]...) }}
		},
		Gate: n.f.closeGate,
		SetDstNotify: func(dir engines.Direction, fn engines.NotifyFunc) {
			if dir == engines.DirWrite {
				n.b.SetNotifyHandler(fn)
			} else {
				n.a.SetNotifyHandler(fn)
			}
		},
	}
	enginetest.Run(t, h)
}

func TestExportCarriesSubAllocationOffsetAndSize(t *testing.T) {
	n := newTwoNodes(t)
	d, _ := n.region(t, n.a, "node-a", 1<<16, true)
	h := d.Handles.Fabric
	if h == nil {
		t.Fatal("exportable GPU memory registered without a fabric handle")
	}
	if h.Offset != 4096 || h.AllocSize != 1<<16+8192 {
		t.Fatalf("fabric handle offset %d alloc size %d, want 4096 and %d", h.Offset, h.AllocSize, 1<<16+8192)
	}
}

func TestRefusalReasons(t *testing.T) {
	n := newTwoNodes(t)
	plainLocal, _ := n.region(t, n.a, "node-a", 4096, false)
	local, _ := n.region(t, n.a, "node-a", 4096, true)
	plainRemote, _ := n.region(t, n.b, "node-b", 4096, false)
	remote, _ := n.region(t, n.b, "node-b", 4096, true)
	other := remote
	other.ID, other.FabricDomain = "node-b/other-domain", "nvlink:ffff.1"
	host := engines.MemoryDesc{ID: "node-b/host", Node: "node-b", Size: 4096, Location: engines.Location{Kind: engines.LocationHost}}
	same := local
	same.ID = "node-a/same"
	for _, c := range []struct {
		name     string
		src, dst engines.MemoryDesc
		want     string
	}{
		{"remote not exportable", local, plainRemote.Remote(), "not fabric-exportable"},
		{"different domains", local, other.Remote(), "different fabric domains"},
		{"host memory", local, host, "host memory"},
		{"same node", local, same, "same-node engine"},
	} {
		ok, why := n.a.CanHandle(&c.src, &c.dst)
		if ok || !strings.Contains(why, c.want) {
			t.Errorf("%s: CanHandle = %v %q, want a refusal mentioning %q", c.name, ok, why, c.want)
		}
	}
	if ok, why := n.a.CanHandle(&local, ptrTo(remote.Remote())); !ok {
		t.Errorf("exportable pair refused: %s", why)
	}
	// Only the remote side is mapped through the fabric: local memory without
	// a fabric handle is still reachable by the local GPU.
	if ok, why := n.a.CanHandle(&plainLocal, ptrTo(remote.Remote())); !ok {
		t.Errorf("local non-exportable to remote exportable refused: %s", why)
	}
	if plainLocal.Handles.Fabric != nil {
		t.Error("a non-exportable allocation got a fabric handle")
	}
}

func ptrTo(d engines.MemoryDesc) *engines.MemoryDesc { return &d }

func TestUnavailableRuntimeSaysWhy(t *testing.T) {
	const reason = "cuMemCreate with CU_MEM_HANDLE_TYPE_FABRIC: CUDA_ERROR_NOT_PERMITTED"
	f := newFakeFabric()
	e, err := fabric.New(fabric.Options{Node: "node-a", Runtime: &fakeRuntime{f: f, reason: reason}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if ok, why := e.Available(); ok || why != reason {
		t.Fatalf("Available = %v %q", ok, why)
	}
	a := f.alloc(8192, true)
	d := engines.MemoryDesc{ID: "node-a/1", Node: "node-a", Size: 8192, FabricDomain: domain,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorNVIDIA}, Handles: engines.Handles{Ptr: uintptr(addr(a.buf))}}
	out, err := e.Register(context.Background(), d)
	if err != nil {
		t.Fatal(err)
	}
	if out.Handles.Fabric != nil {
		t.Fatal("an unavailable fabric exported a handle")
	}
	remote := d
	remote.ID, remote.Node, remote.Handles = "node-b/1", "node-b", engines.Handles{Fabric: &engines.FabricHandle{AllocSize: 8192}}
	if ok, why := e.CanHandle(&out, &remote); ok || !strings.Contains(why, reason) {
		t.Fatalf("CanHandle = %v %q, want the runtime's reason", ok, why)
	}
}

func TestMapsOnceAndUnmapsOnDeregister(t *testing.T) {
	n := newTwoNodes(t)
	local, lbuf := n.region(t, n.a, "node-a", 1<<16, true)
	remote, rbuf := n.region(t, n.b, "node-b", 1<<16, true)
	if err := n.a.Import(context.Background(), remote.Remote()); err != nil {
		t.Fatal(err)
	}
	for i := range lbuf {
		lbuf[i] = byte(i * 7)
	}
	for round := 0; round < 3; round++ {
		move(t, n.a, engines.Item{Src: local.ID, Dst: remote.ID, SrcOffset: uint64(round), DstOffset: 100, Size: 999, Tag: 1})
		if string(rbuf[100:1099]) != string(lbuf[round:round+999]) {
			t.Fatalf("round %d: bytes differ", round)
		}
	}
	if n.f.maps != 1 {
		t.Fatalf("remote allocation mapped %d times, want once", n.f.maps)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := n.a.Deregister(ctx, remote.ID); err != nil {
		t.Fatal(err)
	}
	if n.f.unmaps != 1 {
		t.Fatalf("unmapped %d times after Deregister, want 1", n.f.unmaps)
	}
}

func TestFailedImportIsNotCached(t *testing.T) {
	n := newTwoNodes(t)
	local, _ := n.region(t, n.a, "node-a", 4096, true)
	remote, _ := n.region(t, n.b, "node-b", 4096, true)
	if err := n.a.Import(context.Background(), remote.Remote()); err != nil {
		t.Fatal(err)
	}
	n.f.mapErr = errors.New("IMEX daemon unreachable")
	err := tryMove(t, n.a, engines.Item{Src: local.ID, Dst: remote.ID, Size: 64, Tag: 5})
	var te *engines.TransferError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "IMEX daemon unreachable") || len(te.FailedTags()) != 1 || te.FailedTags()[0] != 5 {
		t.Fatalf("transfer with a failing import = %v", err)
	}
	n.f.mapErr = nil
	move(t, n.a, engines.Item{Src: local.ID, Dst: remote.ID, Size: 64, Tag: 6})
}

func tryMove(t *testing.T, e engines.Engine, it engines.Item) error {
	t.Helper()
	b := e.NewPlan()
	if err := b.Add(it); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tr, err := e.Submit(ctx, b.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Wait(ctx)
}

func move(t *testing.T, e engines.Engine, it engines.Item) {
	t.Helper()
	if err := tryMove(t, e, it); err != nil {
		t.Fatal(err)
	}
}
