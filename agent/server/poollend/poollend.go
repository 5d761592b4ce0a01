// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poollend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	"github.com/fabricxfer/fabricxfer/agent/server/regiontable"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// Allocation is a pool slice lent to a caller, registered as one of its regions.
type Allocation struct {
	id     string
	slice  *poolmem.Slice
	region *regiontable.Region
}

// ID is the allocation's id, as its caller names it.
func (a *Allocation) ID() string { return a.id }

// Region is the region the slice is registered as.
func (a *Allocation) Region() *regiontable.Region { return a.region }

// Loans are the pool slices lent to one session, by allocation id (under the table's lock). They go back when
// the session ends.
type Loans map[string]*Allocation

// Config is what a Lender is built from.
type Config struct {
	// Pool lends the memory; nil answers AllocateFromPool with Unavailable.
	Pool  poolmem.Allocator
	Table *regiontable.Table
	// Tokens carry the slice's descriptor to the caller (GET on the fd socket).
	Tokens   *fdsocket.Tokens
	GPUs     []regiontable.GPU
	Refusals *refusals.Counters
}

// Lender lends pool memory to callers: a slice of the pool, registered as a region of the caller's session and
// handed over by descriptor, until the caller releases it or its session ends.
type Lender struct {
	pool     poolmem.Allocator
	table    *regiontable.Table
	tokens   *fdsocket.Tokens
	gpus     []regiontable.GPU
	refusals *refusals.Counters
}

// giveBackWait bounds how long a loan that failed waits for its region's removal before giving the slice back
// (a session's default grace).
const giveBackWait = 30 * time.Second

// New makes a lender.
func New(cfg Config) *Lender {
	return &Lender{pool: cfg.Pool, table: cfg.Table, tokens: cfg.Tokens, gpus: cfg.GPUs, refusals: cfg.Refusals}
}

// AllocateFromPool serves the Agent API call of that name for the caller of sess, whose loans the slice joins.
func (s *Lender) AllocateFromPool(ctx context.Context, sess *regiontable.Session, loans Loans, req *agentv1.AllocateFromPoolRequest) (*agentv1.AllocateFromPoolResponse, error) {
	if s.pool == nil {
		return nil, status.Error(codes.Unavailable, "this agent has no pool memory to lend (the pool's spec sets none for this node; a standalone agent lends it with --pool-host-bytes)")
	}
	if err := regiontable.CheckSegmentName(req.SegmentName); err != nil {
		return nil, err
	}
	if err := regiontable.CheckGrants(req.SegmentGrants); err != nil {
		return nil, err
	}
	if req.Length == 0 {
		return nil, status.Error(codes.InvalidArgument, "length must be positive")
	}
	want := agentv1.MemoryKind_MEMORY_KIND_HOST
	if s.pool.Kind() == poolmem.GPU {
		want = agentv1.MemoryKind_MEMORY_KIND_GPU
	}
	if req.Kind != agentv1.MemoryKind_MEMORY_KIND_UNSPECIFIED && req.Kind != want {
		return nil, status.Errorf(codes.InvalidArgument, "this node's pool memory is %s, not %s", want, req.Kind)
	}
	sl, desc, handleType, err := s.lend(sess.Caller.Key, req, want)
	if err != nil {
		return nil, err
	}
	r, err := s.table.AddRegion(ctx, sess, want, desc, req.SegmentName, req.SegmentGrants)
	if err != nil {
		_ = s.pool.Free(sl.ID)
		return nil, err
	}
	// giveBack removes the slice's region, then frees the slice, only once the engines let go of it (a removal
	// the session's teardown started is waited for, whatever this call's context says): a slice freed under a
	// registration still undoing could be lent to another caller while it covers it. One whose region cannot be
	// removed stays lent, as the region stays registered.
	giveBack := func() {
		wait, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackWait)
		defer cancel()
		if s.table.RemoveRegion(wait, r) == nil {
			_ = s.pool.Free(sl.ID)
		}
	}
	dup, err := syscall.Dup(int(sl.File.Fd()))
	if err != nil {
		giveBack()
		return nil, status.Errorf(codes.Internal, "duplicating the pool fd: %v", err)
	}
	syscall.CloseOnExec(dup)
	token, err := s.tokens.Add(sess.Caller.Key, os.NewFile(uintptr(dup), "pool"), true)
	if err != nil {
		giveBack()
		return nil, status.Errorf(codes.ResourceExhausted, "%v", err)
	}
	a := &Allocation{id: fmt.Sprintf("%s-%d", sl.ID, r.ID()), slice: sl, region: r}
	s.table.Lock()
	if sess.Ended {
		// The connection closed while this call ran: the session's cleanup has already passed, so nothing
		// would ever free the slice, nor close the descriptor waiting for a caller who will never hear its token.
		s.table.Unlock()
		if f, err := s.tokens.Take(sess.Caller.Key, token, true); err == nil {
			f.Close()
		}
		giveBack()
		return nil, status.Error(codes.Unavailable, "the connection closed while pool memory was being lent; it was given back")
	}
	r.SetAllocLocked(a.id)
	loans[a.id] = a
	s.table.Unlock()
	return &agentv1.AllocateFromPoolResponse{AllocationId: a.id, FdToken: token, HandleType: handleType,
		Offset: sl.Offset, Length: sl.Length, Region: r.Proto(), AllocationSize: allocationSize(sl)}, nil
}

// gpuLender is a GPU pool: slices come from the GPU the caller names.
type gpuLender interface {
	AllocateOn(owner string, gpu int, size uint64) (*poolmem.Slice, error)
}

// lend takes a slice from the pool for owner (the caller's key: every connection of a pod shares its slabs)
// and describes it for the engines: host slices by the agent's view, GPU slices by the agent's device pointer
// and the slab's VMM fd (the engines export a fabric handle when the slab has one).
func (s *Lender) lend(owner string, req *agentv1.AllocateFromPoolRequest, kind agentv1.MemoryKind) (*poolmem.Slice, engines.MemoryDesc, agentv1.HandleType, error) {
	if kind == agentv1.MemoryKind_MEMORY_KIND_HOST {
		sl, err := s.pool.Allocate(owner, req.Length)
		if err != nil {
			s.refusals.LimitHit(refusals.LimitPoolMemory)
			return nil, engines.MemoryDesc{}, 0, status.Errorf(codes.ResourceExhausted, "%v", err)
		}
		return sl, engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationHost}, Size: uint64(len(sl.View)),
			Handles: engines.Handles{Host: sl.View}}, agentv1.HandleType_HANDLE_TYPE_SHM_FD, nil
	}
	lender, ok := s.pool.(gpuLender)
	if !ok {
		return nil, engines.MemoryDesc{}, 0, status.Error(codes.Unimplemented, "this agent's GPU pool memory cannot lend by GPU index")
	}
	sl, err := lender.AllocateOn(owner, int(req.GpuIndex), req.Length)
	if errors.Is(err, poolmem.ErrNoSuchGPU) || errors.Is(err, poolmem.ErrTooLarge) {
		return nil, engines.MemoryDesc{}, 0, status.Errorf(codes.InvalidArgument, "%v", err)
	}
	if err != nil {
		s.refusals.LimitHit(refusals.LimitPoolMemory)
		return nil, engines.MemoryDesc{}, 0, status.Errorf(codes.ResourceExhausted, "%v", err)
	}
	loc := engines.Location{Kind: engines.LocationGPU, Device: sl.GPU, Vendor: engines.VendorNVIDIA, BusID: sl.BusID}
	var domain string
	for i := range s.gpus {
		if g := &s.gpus[i]; g.Index == sl.GPU {
			loc.Vendor, domain = g.Vendor, s.table.FabricDomain(g)
		}
	}
	return sl, engines.MemoryDesc{Location: loc, Size: sl.Length, FabricDomain: domain,
			Handles: engines.Handles{Ptr: uintptr(sl.Ptr), VMM: &engines.VMMHandle{FDs: []*os.File{sl.File}, Offset: sl.Offset, AllocSize: sl.AllocSize}}},
		agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD, nil
}

// Release serves the Agent API call of that name for a session holding loans.
func (s *Lender) Release(ctx context.Context, loans Loans, req *agentv1.ReleaseRequest) (*agentv1.ReleaseResponse, error) {
	s.table.Lock()
	a, ok := loans[req.AllocationId]
	s.table.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "allocation %q is not lent to this connection (released already, or lent to another)", req.AllocationId)
	}
	if err := s.ReleaseAllocation(ctx, loans, a); err != nil {
		return nil, err
	}
	return &agentv1.ReleaseResponse{}, nil
}

// ReleaseAllocation deregisters the slice (waiting for its transfers) and gives it back to the pool.
func (s *Lender) ReleaseAllocation(ctx context.Context, loans Loans, a *Allocation) error {
	if err := s.table.RemoveRegion(ctx, a.region); err != nil {
		return status.Errorf(regiontable.StatusCode(err), "releasing %s: %v", a.id, err)
	}
	s.table.Lock()
	_, mine := loans[a.id]
	delete(loans, a.id)
	s.table.Unlock()
	if !mine {
		return nil // a Release and the session's teardown at once: the other one gives the slice back
	}
	if err := s.pool.Free(a.slice.ID); err != nil {
		return status.Errorf(codes.Internal, "releasing %s: %v", a.id, err)
	}
	return nil
}

// allocationSize is how much of the slice's fd a borrower maps: the whole slab for GPU slices (VMM maps whole
// allocations only), and up to the slice's end for host slices (the memfd is the slice).
func allocationSize(sl *poolmem.Slice) uint64 {
	if sl.AllocSize > 0 {
		return sl.AllocSize
	}
	return sl.Offset + sl.Length
}
