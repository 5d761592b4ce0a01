// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package xgmi_test

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
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
)

func newHostHarness(t *testing.T) (enginetest.Harness, *xgmi.Engine) {
	backend := enginetest.NewGatedHost()
	eng, err := xgmi.New(xgmi.Options{Node: "node-a", CheckDisjoint: true}, backend)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	var next atomic.Uint64
	return enginetest.Harness{
		Engine:     eng,
		Directions: []engines.Direction{engines.DirLocal},
		NewPair: func(t testing.TB, _ engines.Direction, size uint64) enginetest.Pair {
			src, dst := make([]byte, size), make([]byte, size)
			var ids [2]engines.MemoryID
			for i, buf := range [][]byte{src, dst} {
				ids[i] = engines.MemoryID(fmt.Sprintf("node-a/%d", next.Add(1)))
				d := engines.MemoryDesc{ID: ids[i], Node: "node-a", Location: engines.Location{Kind: engines.LocationHost},
					Size: size, Handles: engines.Handles{Host: buf}}
				if _, err := eng.Register(context.Background(), d); err != nil {
					t.Fatalf("Register: %v", err)
				}
			}
			return enginetest.Pair{Src: ids[0], Dst: ids[1], Size: size,
				Fill: func(off uint64, b []byte) { copy(src[off:], b) },
				Read: func(off, n uint64) []byte { return append([]byte(nil), dst[off:off+n]...) },
			}
		},
		Gate:         backend.Gate.Shut,
		SetDstNotify: func(_ engines.Direction, fn engines.NotifyFunc) { eng.SetNotifyHandler(fn) },
	}, eng
}

func TestContract(t *testing.T) {
	h, _ := newHostHarness(t)
	enginetest.Run(t, h)
}

func TestRefusesWhatItCannotMove(t *testing.T) {
	eng, err := xgmi.New(xgmi.Options{Node: "node-a"}, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	host := engines.MemoryDesc{ID: "node-a/h", Node: "node-a", Location: engines.Location{Kind: engines.LocationHost}, Size: 64,
		Handles: engines.Handles{Host: make([]byte, 64)}}
	gpu := engines.MemoryDesc{ID: "node-a/g", Node: "node-a", Size: 64,
		Location: engines.Location{Kind: engines.LocationGPU, Vendor: engines.VendorAMD, Device: 1}}
	remote := engines.MemoryDesc{ID: "node-b/h", Node: "node-b", Location: engines.Location{Kind: engines.LocationHost}, Size: 64,
		Handles: engines.Handles{TCP: "10.0.0.2:7000"}}
	for _, c := range []struct {
		src, dst *engines.MemoryDesc
		want     string
	}{
		{&host, &gpu, "node-a/g is gpu memory"},
		{&host, &remote, "not both on this node"},
	} {
		ok, reason := eng.CanHandle(c.src, c.dst)
		if ok || !strings.Contains(reason, c.want) {
			t.Errorf("CanHandle(%s, %s) = %v %q, want refusal mentioning %q", c.src.ID, c.dst.ID, ok, reason, c.want)
		}
	}
	if _, err := eng.Register(context.Background(), remote); err == nil {
		t.Error("Register accepted another node's memory")
	}
	bad := host
	bad.Handles.Host = make([]byte, 10)
	if _, err := eng.Register(context.Background(), bad); err == nil {
		t.Error("Register accepted a host view shorter than the region")
	}
}

// stuckHost ignores cancellation until released, like a GPU kernel that cannot be stopped.
type stuckHost struct {
	*xgmi.HostBackend
	release chan struct{}
}

func (s stuckHost) Copy(ctx context.Context, w engines.Work) error {
	<-s.release
	return s.HostBackend.Copy(ctx, w)
}

func TestDeregisterNeverFreesUnderARunningCopy(t *testing.T) {
	stuck := stuckHost{xgmi.NewHostBackend(), make(chan struct{})}
	eng, err := xgmi.New(xgmi.Options{Node: "node-a", Grace: 100 * time.Millisecond}, stuck)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for _, id := range []string{"node-a/1", "node-a/2"} {
		d := engines.MemoryDesc{ID: engines.MemoryID(id), Node: "node-a", Location: engines.Location{Kind: engines.LocationHost},
			Size: 1 << 20, Handles: engines.Handles{Host: make([]byte, 1<<20)}}
		if _, err := eng.Register(context.Background(), d); err != nil {
			t.Fatal(err)
		}
	}
	b := eng.NewPlan()
	if err := b.Add(engines.Item{Src: "node-a/1", Dst: "node-a/2", Size: 1 << 20, Tag: 1}); err != nil {
		t.Fatal(err)
	}
	tr, err := eng.Submit(context.Background(), b.Build(), engines.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := eng.Deregister(ctx, "node-a/2"); !errors.Is(err, engines.ErrBusy) {
		t.Fatalf("Deregister under a copy that cannot stop = %v, want ErrBusy", err)
	}
	if err := eng.NewPlan().Add(engines.Item{Src: "node-a/1", Dst: "node-a/2", Size: 8, Tag: 2}); !errors.Is(err, engines.ErrUnknownMemory) {
		t.Fatalf("planning against a region being deregistered: %v, want ErrUnknownMemory", err)
	}
	close(stuck.release)
	// The copy ran to its end after cancellation: success is the truth; a backend that noticed would say
	// ErrDeregistered.
	if err := tr.Wait(context.Background()); err != nil && !errors.Is(err, engines.ErrDeregistered) {
		t.Fatalf("the stuck transfer ended with %v", err)
	}
	if err := eng.Deregister(context.Background(), "node-a/2"); err != nil {
		t.Fatalf("Deregister once the copy stopped: %v", err)
	}
}
