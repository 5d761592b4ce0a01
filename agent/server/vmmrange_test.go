// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/engines/xgmi"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// vmmSeen is what the stand-in GPU backend was handed for one region.
type vmmSeen struct {
	inodes            []uint64
	offset, allocSize uint64
}

// stubGPUBackend stands in for the CUDA backend at the hardware edge: it claims NVIDIA GPU memory, records the
// VMM handles it is given (by inode, since the agent's descriptors are its own duplicates), and fails the import
// when told to.
type stubGPUBackend struct {
	mu       sync.Mutex
	seen     map[engines.MemoryID]vmmSeen
	released int
	fail     error
}

func (b *stubGPUBackend) Name() string { return "cuda-stub" }
func (b *stubGPUBackend) Claims(src, dst *engines.MemoryDesc) (bool, string) {
	if src.Location.Kind == engines.LocationGPU && dst.Location.Kind == engines.LocationGPU {
		return true, ""
	}
	return false, "not GPU memory"
}

func (b *stubGPUBackend) Register(_ context.Context, d engines.MemoryDesc) (engines.MemoryDesc, error) {
	if d.Location.Kind != engines.LocationGPU {
		return d, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return d, b.fail
	}
	s := vmmSeen{offset: d.Handles.VMM.Offset, allocSize: d.Handles.VMM.AllocSize}
	for _, f := range d.Handles.VMM.FDs {
		var st syscall.Stat_t
		if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
			return d, err
		}
		s.inodes = append(s.inodes, st.Ino)
	}
	b.seen[d.ID] = s
	return d, nil
}

func (b *stubGPUBackend) Release(_ context.Context, d *engines.MemoryDesc) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[d.ID]; ok {
		b.released++
	}
	return nil
}

func (b *stubGPUBackend) Copy(context.Context, engines.Work) error {
	return errors.New("no copies here")
}
func (b *stubGPUBackend) Limits() engines.Limits { return engines.Limits{} }

func fileInode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// stubGPUAgent starts an agent whose one GPU ("GPU-0000") is served by a stand-in backend.
func stubGPUAgent(t *testing.T) (*agent, *stubGPUBackend) {
	t.Helper()
	opts := baseOptions(t, newProcFixture(t))
	opts.GPUs = []server.GPUInfo{{Index: 0, UUID: "GPU-0000", Vendor: engines.VendorNVIDIA, BusID: "0000:c1:00.0"}}
	be := &stubGPUBackend{seen: map[engines.MemoryID]vmmSeen{}}
	x, err := xgmi.New(xgmi.Options{Node: "node-a"}, be, xgmi.NewHostBackend())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Engine, err = engines.NewComposite(engines.CompositeOptions{Node: "node-a"}, x); err != nil {
		t.Fatal(err)
	}
	return startAgent(t, opts), be
}

// TestRegisterSpanningVMMAllocations: a region over several VMM allocations (fd_tokens, two PUT <n>) reaches the
// GPU backend as one handle listing every descriptor in order, with the offset from the first; wrong shapes are
// refused before anything is taken, a failing import leaves nothing registered, and deregistering releases the
// mapping and closes every descriptor.
func TestRegisterSpanningVMMAllocations(t *testing.T) {
	a, be := stubGPUAgent(t)
	c := dial(t, a)
	ctx := ctxT(t)
	const alloc = 2 << 20
	files := make([]*os.File, 5)
	for i := range files {
		files[i] = shm(t, 4096).File // stands in for a VMM fd: the stub only looks at which file it is
	}
	put := func(fs []*os.File) string {
		t.Helper()
		tok, err := fdpass.PutMany(ctx, a.srv.FDSocketPath(), fs)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	base := openFDs(t)
	gpu := func(r *agentv1.RegisterMemoryRequest) (*agentv1.RegisterMemoryResponse, error) {
		r.Kind, r.HandleType, r.GpuUuid = agentv1.MemoryKind_MEMORY_KIND_GPU, agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD, "GPU-0000"
		if r.AllocationSize == 0 {
			r.AllocationSize = alloc
		}
		return c.API().RegisterMemory(ctx, r)
	}

	// [1 MiB, 6 MiB + 1) touches allocations 0..3 of 2 MiB: four descriptors, from two PUTs.
	t1, t2 := put(files[:3]), put(files[3:4])
	refusals := []struct {
		name string
		req  *agentv1.RegisterMemoryRequest
		says string
	}{
		{"one allocation short", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1}, Offset: 1 << 20, Length: 5<<20 + 1}, "name 3 descriptors, 4 expected"},
		{"one allocation too many", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1, t2}, Offset: 1 << 20, Length: 2 << 20}, "name 4 descriptors, 2 expected"},
		{"offset past the first allocation", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1, t2}, Offset: alloc, Length: 1}, "past the first VMM allocation"},
		{"no allocation size", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1}, AllocationSize: 0, Length: 1}, ""},
		{"more than the bound", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1}, Length: (engines.MaxVMMAllocations + 1) * alloc}, "at most 8192"},
		{"a token twice", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1, t1}, Length: 6 * alloc}, "named twice"},
		{"an unknown token", &agentv1.RegisterMemoryRequest{FdTokens: []string{t1, "0123456789abcdef0123456789abcdef"}, Length: 4 * alloc}, "not yours"},
		{"fd_token and fd_tokens", &agentv1.RegisterMemoryRequest{FdToken: t2, FdTokens: []string{t1}, Length: 3 * alloc}, "instead of fd_token"},
	}
	for _, tc := range refusals {
		_, err := gpu(tc.req)
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want InvalidArgument saying %q", tc.name, err, tc.says)
		}
	}
	// Host memory takes one fd_token.
	if _, err := c.API().RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
		HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdTokens: []string{t2}, Length: 4096}); client.Code(err) != codes.InvalidArgument {
		t.Errorf("fd_tokens for host memory: %v, want InvalidArgument", err)
	}

	// The refusals took nothing: the same tokens now register.
	resp, err := gpu(&agentv1.RegisterMemoryRequest{FdTokens: []string{t1, t2}, Offset: 1 << 20, Length: 5<<20 + 1})
	if err != nil {
		t.Fatalf("registering 4 allocations: %v", err)
	}
	be.mu.Lock()
	var seen vmmSeen
	for _, s := range be.seen {
		seen = s
	}
	be.mu.Unlock()
	if seen.offset != 1<<20 || seen.allocSize != alloc || len(seen.inodes) != 4 {
		t.Fatalf("backend saw %+v", seen)
	}
	for i, ino := range seen.inodes {
		if ino != fileInode(t, files[i]) {
			t.Fatalf("allocation %d is inode %d, want %d: the order was lost", i, ino, fileInode(t, files[i]))
		}
	}
	if resp.Region.Length != 5<<20+1 {
		t.Fatalf("region length %d", resp.Region.Length)
	}

	// A failing import: refused with the backend's reason, nothing registered, the descriptors closed.
	be.mu.Lock()
	be.fail = errors.New("cuMemImportFromShareableHandle: CUDA_ERROR_INVALID_VALUE")
	be.mu.Unlock()
	if _, err := gpu(&agentv1.RegisterMemoryRequest{FdTokens: []string{put(files[:2])}, Length: 3 << 20}); err == nil ||
		!strings.Contains(err.Error(), "CUDA_ERROR_INVALID_VALUE") {
		t.Fatalf("failing import: %v", err)
	}
	info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Usage.Regions != 1 || info.Usage.RegisteredBytes != 5<<20+1 {
		t.Fatalf("usage after a failed import: %v", info.Usage)
	}

	if _, err := c.API().DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: resp.Region.Id}); err != nil {
		t.Fatal(err)
	}
	be.mu.Lock()
	released := be.released
	be.mu.Unlock()
	if released != 1 {
		t.Fatalf("backend released %d regions, want 1", released)
	}
	// The agent's ends of the fd socket's connections (this process's too) close asynchronously.
	if n := fdsWithin(t, base); n > base {
		t.Fatalf("%d descriptors open after deregistering, %d before registering: the agent kept some", n, base)
	}
}
