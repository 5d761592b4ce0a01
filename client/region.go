// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
	"github.com/fabricxfer/fabricxfer/internal/shmem"
)

// Region is memory registered with the agent. Its id changes on Recover; the value stays valid.
type Region struct {
	c       *Client
	segment string
	grants  []string
	// keep is this client's duplicate of the memory's fd, so the region can be registered again after an
	// agent restart; nil for pool slices and GPU memory.
	keep *os.File
	// gpu says how GPU memory is registered (with duplicates of its VMM fds); nil for host memory.
	gpu    *GPUMemory
	offset uint64
	length uint64

	mu    sync.Mutex
	id    uint64
	gen   uint64
	desc  []byte
	alloc string
	lost  bool
	back  notBack // under mu
}

// ID is the region's current id at the agent.
func (r *Region) ID() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.id
}

// Descriptor is the capability a peer names to reach this region (share it only with those who should).
func (r *Region) Descriptor() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.desc
}

// Len is the region's length.
func (r *Region) Len() uint64 { return r.length }

// Segment is the name peers resolve, if any.
func (r *Region) Segment() string { return r.segment }

// Lost reports a pool slice whose agent restarted: it must be allocated again.
func (r *Region) Lost() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

func (r *Region) current() (uint64, error) {
	// The client's generation first: Close holds the client's lock while it takes each region's, so taking the
	// client's under the region's would deadlock a call beside Close.
	gen := r.c.generation()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lost {
		return 0, fmt.Errorf("region %q: %w (pool slice; allocate again)", r.segment, ErrLost)
	}
	if r.gen != gen {
		if err := r.back.in(gen, fmt.Sprintf("region %q", r.segment)); err != nil {
			return 0, err
		}
		return 0, ErrSessionLost
	}
	return r.id, nil
}

// notBack is why Recover could not register a region or layout again in session gen (its name taken meanwhile,
// say): its calls say that, not ErrSessionLost, which a "Recover and retry" loop would repeat for good. Its
// owner's lock guards it.
type notBack struct {
	why error
	gen uint64
}

// record keeps why Recover failed in session gen, where the agent refused for a reason a retry alone does not
// mend (refusedForGood).
func (n *notBack) record(gen uint64, why error) {
	if refusedForGood(why) {
		n.why, n.gen = why, gen
	}
}

// in is the error of a call on what in session gen (the agent's refusal, whose code it keeps), nil when Recover
// did not fail in it.
func (n *notBack) in(gen uint64, what string) error {
	if n.why == nil || n.gen != gen {
		return nil
	}
	return fmt.Errorf("%s was not registered again after the agent restarted (the next Recover tries again): %w", what, n.why)
}

// heldRegions are the regions this client holds now (none lost).
func (c *Client) heldRegions() []*Region {
	c.mu.Lock()
	defer c.mu.Unlock()
	held := make([]*Region, 0, len(c.regions))
	for r := range c.regions {
		if r.Lost() {
			continue
		}
		held = append(held, r)
	}
	return held
}

// failedRecover records why Recover could not register the region again in session gen.
func (r *Region) failedRecover(gen uint64, why error) {
	r.mu.Lock()
	r.back.record(gen, why)
	r.mu.Unlock()
}

// refusedForGood says whether the agent refused a registration for a reason that a retry alone does not mend (a
// name taken, a permission, the request itself): its calls then say so. Anything else (the agent's sockets not
// back yet, Recover's context ending) leaves ErrSessionLost, for a "Recover and retry" loop to go on.
func refusedForGood(err error) bool {
	switch Code(err) {
	case codes.AlreadyExists, codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition:
		return !errors.Is(err, ErrSessionLost) && !errors.Is(err, ErrClosed)
	}
	return false
}

// RegionOption tunes a registration.
type RegionOption func(*Region)

// Segment publishes the region under name, so peers can name it without its descriptor.
func Segment(name string) RegionOption { return func(r *Region) { r.segment = name } }

// Grant lets pods of these namespaces (besides the caller's own; "*" for every namespace the pool admits) reach
// the published segment, as "<caller's namespace>/<name>".
func Grant(namespaces ...string) RegionOption {
	return func(r *Region) { r.grants = append(r.grants, namespaces...) }
}

// RegisterHost registers [offset, offset+length) of shared memory f: a memfd opened read-write and sealed
// against shrinking (the agent refuses memory that could shrink under its mapping). NewSharedMemory makes such
// memory; a memfd created with MFD_ALLOW_SEALING is sealed here (F_SEAL_SHRINK, which cannot be undone). Pages of
// the range nobody has touched yet are loaded from here, within ctx, so that they are allocated now and count
// against this process's memory limit (the agent refuses ranges with such pages); fresh memory costs about as
// long as writing it once. The client keeps a duplicate of f until Deregister or Close.
func (c *Client) RegisterHost(ctx context.Context, f *os.File, offset, length uint64, opts ...RegionOption) (*Region, error) {
	if f == nil {
		return nil, status.Errorf(codes.InvalidArgument, "registering host memory: no file")
	}
	_ = SealShrink(f) // the agent says how to fix memory that cannot be sealed
	// Pages nobody touched would be allocated by the agent's copies, charged to the agent: they are touched here,
	// charged to this process. What cannot be (a range past the end, a memory limit reached) the agent refuses.
	if _, err := shmem.Populate(ctx, f, offset, length); err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("registering host memory: %w", status.Error(status.FromContextError(ctx.Err()).Code(), err.Error()))
	}
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if errors.Is(err, unix.EBADF) {
		return nil, fmt.Errorf("registering host memory: %w (%w)", status.Errorf(codes.InvalidArgument,
			"file %q is closed: pass the memory's open file (close it after registering, if at all)", f.Name()), err)
	}
	if err != nil {
		return nil, fmt.Errorf("registering host memory: duplicating its fd: %w", err)
	}
	r := &Region{c: c, keep: os.NewFile(uintptr(fd), f.Name()), offset: offset, length: length}
	for _, o := range opts {
		o(r)
	}
	if err := c.register(ctx, r); err != nil {
		r.keep.Close()
		return nil, err
	}
	c.mu.Lock()
	c.regions[r] = struct{}{}
	c.mu.Unlock()
	return r, nil
}

// SealShrink seals memfd f against shrinking (F_ADD_SEALS F_SEAL_SHRINK), as the agent requires of host memory.
// It fails for files that cannot be sealed: memfds created without MFD_ALLOW_SEALING, shm_open files, others.
func SealShrink(f *os.File) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%s is not a memfd: %w", f.Name(), err)
	}
	if seals&unix.F_SEAL_SHRINK != 0 {
		return nil
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK); err != nil {
		return fmt.Errorf("sealing %s against shrinking (was it created with MFD_ALLOW_SEALING?): %w", f.Name(), err)
	}
	return nil
}

// newSealedMemfd creates a memfd of size bytes sealed against shrinking.
func newSealedMemfd(name string, size uint64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("creating shared memory %q: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("sizing shared memory %q to %d bytes: %w", name, size, err)
	}
	if err := SealShrink(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (c *Client) register(ctx context.Context, r *Region) error {
	if c.closed.Load() {
		return ErrClosed // before its fd is passed: nothing may be left with the agent
	}
	gen := c.generation()
	if r.gpu != nil {
		resp, err := c.registerGPU(ctx, r, gen)
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.id, r.desc, r.gen, r.lost = resp.Region.Id, resp.Region.Desc, gen, false
		r.mu.Unlock()
		return nil
	}
	// The fd is passed under the region's lock: Deregister or Close (release) would otherwise close it meanwhile,
	// and its number could then name other memory by the time it is passed.
	r.mu.Lock()
	if r.keep == nil {
		r.mu.Unlock()
		return fmt.Errorf("registering host memory: the region was deregistered, or its client closed")
	}
	token, err := c.putFD(ctx, r.keep)
	r.mu.Unlock()
	if err != nil {
		return c.wrap(ctx, "registering host memory: passing its fd", gen, err)
	}
	resp, err := c.api.RegisterMemory(ctx, &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
		HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Offset: r.offset, Length: r.length,
		SegmentName: r.segment, SegmentGrants: r.grants})
	if err != nil {
		return c.wrap(ctx, "registering host memory", gen, err)
	}
	r.mu.Lock()
	r.id, r.desc, r.gen, r.lost = resp.Region.Id, resp.Region.Desc, gen, false
	r.mu.Unlock()
	return nil
}

// Deregister forgets the region at the agent (after its in-flight transfers settle) and here.
func (c *Client) Deregister(ctx context.Context, r *Region) error {
	id, err := r.current()
	if err != nil {
		c.forget(r)
		return nil // nothing left at the agent
	}
	if r.alloc != "" {
		return status.Errorf(codes.InvalidArgument, "deregistering region %d: it is a pool slice; use Release", id)
	}
	if _, err := c.api.DeregisterMemory(ctx, &agentv1.DeregisterMemoryRequest{RegionId: id}); err != nil {
		return c.wrap(ctx, fmt.Sprintf("deregistering region %d", id), r.gen, err)
	}
	c.forget(r)
	return nil
}

func (c *Client) forget(r *Region) {
	c.mu.Lock()
	delete(c.regions, r)
	c.mu.Unlock()
	r.release()
}

// release closes what the client kept to register r again.
func (r *Region) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keep != nil {
		r.keep.Close()
		r.keep = nil
	}
	if r.gpu != nil {
		closeFiles(r.gpu.VMMFiles)
		r.gpu.VMMFiles = nil
	}
}

// PoolSlice is pool memory lent by the agent, mapped into this process.
type PoolSlice struct {
	*Region
	Bytes   []byte
	mapping []byte
}

// AllocateFromPool borrows length bytes of the pool's memory, mapped here and registered already.
func (c *Client) AllocateFromPool(ctx context.Context, length uint64, opts ...RegionOption) (*PoolSlice, error) {
	gen := c.generation()
	r := &Region{c: c, length: length}
	for _, o := range opts {
		o(r)
	}
	resp, err := c.api.AllocateFromPool(ctx, &agentv1.AllocateFromPoolRequest{Length: length, SegmentName: r.segment, SegmentGrants: r.grants})
	if err != nil {
		return nil, c.wrap(ctx, "allocating pool memory", gen, err)
	}
	if resp.HandleType != agentv1.HandleType_HANDLE_TYPE_SHM_FD {
		// GPU pool memory is a VMM fd: it is imported with the GPU runtime (cuMemImportFromShareableHandle, then
		// cuMemMap of allocation_size bytes), which this client does not load.
		_, _ = c.api.Release(ctx, &agentv1.ReleaseRequest{AllocationId: resp.AllocationId})
		return nil, fmt.Errorf("the pool lends %s memory (%d-byte allocation): map it with the GPU runtime; this client maps host memory only",
			resp.HandleType, resp.AllocationSize)
	}
	f, err := fdpass.Get(ctx, c.fdSocket(), resp.FdToken)
	if err != nil {
		_, _ = c.api.Release(ctx, &agentv1.ReleaseRequest{AllocationId: resp.AllocationId})
		return nil, fmt.Errorf("fetching the pool fd: %w", notBesideAgentSocket(c.fdSocket(), "descriptor", "", err))
	}
	defer f.Close() // the mapping keeps the memory
	page := uint64(os.Getpagesize())
	base := resp.Offset / page * page
	delta := resp.Offset - base
	m, err := unix.Mmap(int(f.Fd()), int64(base), int(resp.Length+delta), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_, _ = c.api.Release(ctx, &agentv1.ReleaseRequest{AllocationId: resp.AllocationId})
		return nil, fmt.Errorf("mapping the pool slice: %w", err)
	}
	r.id, r.desc, r.gen, r.alloc = resp.Region.Id, resp.Region.Desc, gen, resp.AllocationId
	c.mu.Lock()
	c.regions[r] = struct{}{}
	c.mu.Unlock()
	return &PoolSlice{Region: r, Bytes: m[delta : delta+resp.Length], mapping: m}, nil
}

// Release gives the slice back and unmaps it here.
func (c *Client) Release(ctx context.Context, s *PoolSlice) error {
	if s == nil || s.Region == nil || s.alloc == "" {
		// Said before anything is forgotten: a region of the caller's own memory wrapped as a slice stays
		// registered, and Recover keeps registering it again.
		return status.Error(codes.InvalidArgument, "releasing a pool slice: not one AllocateFromPool returned (Deregister a region of your own memory)")
	}
	defer func() {
		if s.mapping != nil {
			_ = unix.Munmap(s.mapping)
			s.mapping, s.Bytes = nil, nil
		}
	}()
	c.forget(s.Region)
	if _, err := s.current(); err != nil {
		return nil // the agent that lent it is gone
	}
	if _, err := c.api.Release(ctx, &agentv1.ReleaseRequest{AllocationId: s.alloc}); err != nil {
		return c.wrap(ctx, "releasing pool slice", s.gen, err)
	}
	return nil
}
