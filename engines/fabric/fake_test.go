// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fabric_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"unsafe"

	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/fabric"
)

// fakeFabric stands in for an IMEX domain: allocations live in this process's
// memory and any "node" can map any exportable one by its token.
type fakeFabric struct {
	mu      sync.Mutex
	allocs  map[uint64]*fakeAlloc // by token id
	maps    int
	unmaps  int
	mapErr  error
	gate    chan struct{}
	copyErr error
}

type fakeAlloc struct {
	id         uint64
	buf        []byte
	exportable bool
}

func newFakeFabric() *fakeFabric { return &fakeFabric{allocs: map[uint64]*fakeAlloc{}} }

// alloc makes an allocation of size bytes, exportable or not.
func (f *fakeFabric) alloc(size int, exportable bool) *fakeAlloc {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := &fakeAlloc{id: uint64(len(f.allocs) + 1), buf: make([]byte, size), exportable: exportable}
	f.allocs[a.id] = a
	return a
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// runtime is one node's view of the fake fabric.
type fakeRuntime struct {
	f         *fakeFabric
	available bool
	reason    string
}

func (r *fakeRuntime) Available() (bool, string) { return r.available, r.reason }

func (r *fakeRuntime) owner(p uint64) (*fakeAlloc, uint64, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	for _, a := range r.f.allocs {
		if base := addr(a.buf); p >= base && p < base+uint64(len(a.buf)) {
			return a, p - base, nil
		}
	}
	return nil, 0, fmt.Errorf("pointer %#x is not GPU memory", p)
}

func (r *fakeRuntime) Local(d *engines.MemoryDesc) (uint64, int, error) {
	if _, _, err := r.owner(uint64(d.Handles.Ptr)); err != nil {
		return 0, 0, err
	}
	return uint64(d.Handles.Ptr), d.Location.Device, nil
}

func (r *fakeRuntime) Export(d *engines.MemoryDesc) (engines.FabricHandle, error) {
	a, off, err := r.owner(uint64(d.Handles.Ptr))
	if err != nil {
		return engines.FabricHandle{}, err
	}
	if !a.exportable {
		return engines.FabricHandle{}, fmt.Errorf("%w: allocation has no fabric handle type", fabric.ErrNotExportable)
	}
	var h engines.FabricHandle
	binary.LittleEndian.PutUint64(h.Token[:], a.id)
	h.Offset, h.AllocSize = off, uint64(len(a.buf))
	return h, nil
}

func (r *fakeRuntime) Map(gpu int, h engines.FabricHandle) (uint64, func() error, error) {
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if r.f.mapErr != nil {
		return 0, nil, r.f.mapErr
	}
	a, ok := r.f.allocs[binary.LittleEndian.Uint64(h.Token[:])]
	if !ok || uint64(len(a.buf)) != h.AllocSize {
		return 0, nil, errors.New("unknown fabric handle")
	}
	r.f.maps++
	return addr(a.buf), func() error {
		r.f.mu.Lock()
		r.f.unmaps++
		r.f.mu.Unlock()
		return nil
	}, nil
}

func (r *fakeRuntime) Copy(ctx context.Context, gpu int, segs []fabric.Segment) error {
	r.f.mu.Lock()
	gate, copyErr := r.f.gate, r.f.copyErr
	r.f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if copyErr != nil {
		return copyErr
	}
	for _, s := range segs {
		dst := unsafe.Slice((*byte)(ptr(s.Dst)), s.Size)
		src := unsafe.Slice((*byte)(ptr(s.Src)), s.Size)
		copy(dst, src)
	}
	return nil
}

// ptr turns a fake "device" address (Go memory kept alive by its allocation) back into a pointer.
func ptr(a uint64) unsafe.Pointer {
	p := uintptr(a)
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

func (f *fakeFabric) closeGate(testing.TB) func() {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.gate = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			f.gate = nil
			f.mu.Unlock()
			close(ch)
		})
	}
}

// notifier is the agent channel between the two fake nodes.
type notifier struct {
	mu    sync.Mutex
	nodes map[string]*fabric.Engine
}

func (n *notifier) SendNotification(_ context.Context, node string, msg engines.Notification) error {
	n.mu.Lock()
	e := n.nodes[node]
	n.mu.Unlock()
	if e == nil {
		return fmt.Errorf("no route to %s", node)
	}
	e.Deliver(msg)
	return nil
}
