// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package regiontable

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/shmem"
)

// MaxSegmentName bounds segment names.
const MaxSegmentName = 128

// Region is registered memory of one caller.
type Region struct {
	id      uint64
	mem     engines.MemoryID
	owner   string   // caller key
	holder  *Session // the connection that registered it
	kind    agentv1.MemoryKind
	length  uint64
	segment string
	pub     publication // who published segment, and who else may use it
	key     []byte
	engines []string
	desc    []byte // serialized SegmentDescriptor
	// mapping and files are the caller's memory as the agent holds it: given to the region as it is recorded and
	// released, once, by the RemoveRegion that takes it out, after the engines let go of it.
	mapping []byte
	files   []*os.File
	alloc   string // pool slice id when the region is pool memory
	// removing is closed when the RemoveRegion under way ends (nil when none runs).
	removing chan struct{}
}

// ID is the region's id, as its caller names it.
func (r *Region) ID() uint64 { return r.id }

// Mem is the region's memory id in the engines.
func (r *Region) Mem() engines.MemoryID { return r.mem }

// Owner is the key of the caller that registered the region.
func (r *Region) Owner() string { return r.owner }

// Segment is the name the region is published under ("" when it is not).
func (r *Region) Segment() string { return r.segment }

// Length is the region's size in bytes.
func (r *Region) Length() uint64 { return r.length }

// Alloc is the pool slice the region is, "" when the caller registered its own memory (read under the lock).
func (r *Region) Alloc() string { return r.alloc }

// SetAllocLocked marks the region as the pool slice alloc.
func (r *Region) SetAllocLocked(alloc string) { r.alloc = alloc }

// Proto is the region as the Agent API describes it.
func (r *Region) Proto() *agentv1.Region { return r.proto() }

func (r *Region) proto() *agentv1.Region {
	return &agentv1.Region{Id: r.id, Kind: r.kind, Length: r.length, SegmentName: r.segment,
		Desc: r.desc, Engines: r.engines}
}

// RegisterMemory serves the Agent API call of that name for the caller of sess.
func (tab *Table) RegisterMemory(ctx context.Context, sess *Session, req *agentv1.RegisterMemoryRequest) (*agentv1.RegisterMemoryResponse, error) {
	var err error
	if err := CheckSegmentName(req.SegmentName); err != nil {
		return nil, err
	}
	if err := CheckGrants(req.SegmentGrants); err != nil {
		return nil, err
	}
	if req.Length == 0 {
		return nil, status.Error(codes.InvalidArgument, "length must be positive")
	}
	var (
		desc    engines.MemoryDesc
		mapping []byte
		files   []*os.File
	)
	if len(req.FdTokens) > 0 && (req.FdToken != "" || req.HandleType != agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD) {
		return nil, status.Errorf(codes.InvalidArgument, "fd_tokens name the VMM allocations of HANDLE_TYPE_VMM_POSIX_FD memory, instead of fd_token (got %s, fd_token %t)",
			req.HandleType, req.FdToken != "")
	}
	switch req.Kind {
	case agentv1.MemoryKind_MEMORY_KIND_HOST:
		if req.HandleType != agentv1.HandleType_HANDLE_TYPE_SHM_FD {
			return nil, status.Errorf(codes.InvalidArgument, "host memory is passed as HANDLE_TYPE_SHM_FD, not %s (pool slices are registered by AllocateFromPool)", req.HandleType)
		}
		f, err := tab.tokens.Take(sess.Caller.Key, req.FdToken, false)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		view, m, err := MapShared(f, req.Offset, req.Length, syscall.PROT_READ|syscall.PROT_WRITE)
		if err != nil {
			f.Close()
			if reason := RefusalReason(err); reason != "" {
				tab.refusals.Edge.Refused("grpc", reason)
			}
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		desc = engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: view}}
		mapping, files = m, []*os.File{f}
	case agentv1.MemoryKind_MEMORY_KIND_GPU:
		desc, files, err = tab.gpuDesc(sess, req)
		if err != nil {
			return nil, err
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "memory kind must be MEMORY_KIND_HOST or MEMORY_KIND_GPU, got %s", req.Kind)
	}
	desc.Size = req.Length
	r, err := tab.addRegion(ctx, sess, req.Kind, desc, req.SegmentName, req.SegmentGrants, mapping, files)
	if err != nil {
		if mapping != nil {
			syscall.Munmap(mapping)
		}
		fdsocket.CloseFiles(files)
		return nil, err
	}
	return &agentv1.RegisterMemoryResponse{Region: r.proto()}, nil
}

// FabricDomain is the GPU's fabric domain key as of now.
func (tab *Table) FabricDomain(g *GPU) string {
	if tab.fabricDomainOf != nil {
		if d, ok := tab.fabricDomainOf(g.Index); ok {
			return d
		}
	}
	return g.FabricDomain
}

// gpuDesc describes GPU memory a caller hands over by VMM fd, IPC handle or fabric handle.
func (tab *Table) gpuDesc(sess *Session, req *agentv1.RegisterMemoryRequest) (engines.MemoryDesc, []*os.File, error) {
	var gpu *GPU
	for i := range tab.gpus {
		g := &tab.gpus[i]
		if (req.GpuUuid != "" && g.UUID == req.GpuUuid) || (req.GpuUuid == "" && g.Index == int(req.GpuIndex)) {
			gpu = g
			break
		}
	}
	if gpu == nil {
		return engines.MemoryDesc{}, nil, status.Errorf(codes.InvalidArgument, "GPU (index %d, uuid %q) is not on node %s (%d GPUs detected)",
			req.GpuIndex, req.GpuUuid, tab.node, len(tab.gpus))
	}
	d := engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationGPU, Device: gpu.Index, Vendor: gpu.Vendor, BusID: gpu.BusID},
		FabricDomain: tab.FabricDomain(gpu)}
	inAlloc := func() error {
		if req.AllocationSize == 0 {
			return status.Errorf(codes.InvalidArgument, "%s needs allocation_size (the size of the exported allocation)", req.HandleType)
		}
		if req.Offset > req.AllocationSize || req.Length > req.AllocationSize-req.Offset {
			return status.Errorf(codes.InvalidArgument, "range [%d, +%d) is outside the allocation of %d bytes", req.Offset, req.Length, req.AllocationSize)
		}
		return nil
	}
	switch req.HandleType {
	case agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD:
		if len(req.FdTokens) > 0 {
			files, err := tab.vmmFiles(sess, req)
			if err != nil {
				return d, nil, err
			}
			d.Handles.VMM = &engines.VMMHandle{FDs: files, Offset: req.Offset, AllocSize: req.AllocationSize}
			return d, files, nil
		}
		if err := inAlloc(); err != nil {
			return d, nil, err
		}
		f, err := tab.tokens.Take(sess.Caller.Key, req.FdToken, false)
		if err != nil {
			return d, nil, status.Error(codes.InvalidArgument, err.Error())
		}
		d.Handles.VMM = &engines.VMMHandle{FDs: []*os.File{f}, Offset: req.Offset, AllocSize: req.AllocationSize}
		return d, []*os.File{f}, nil
	case agentv1.HandleType_HANDLE_TYPE_IPC:
		if len(req.IpcHandle) != engines.IPCHandleSize {
			return d, nil, status.Errorf(codes.InvalidArgument, "IPC handle is %d bytes, want %d", len(req.IpcHandle), engines.IPCHandleSize)
		}
		d.Handles.IPC, d.Handles.IPCOffset = append([]byte(nil), req.IpcHandle...), req.Offset
		return d, nil, nil
	case agentv1.HandleType_HANDLE_TYPE_FABRIC:
		if len(req.FabricHandle) != engines.FabricTokenSize {
			return d, nil, status.Errorf(codes.InvalidArgument, "fabric handle is %d bytes, want %d", len(req.FabricHandle), engines.FabricTokenSize)
		}
		if err := inAlloc(); err != nil {
			return d, nil, err
		}
		fh := &engines.FabricHandle{Offset: req.Offset, AllocSize: req.AllocationSize}
		copy(fh.Token[:], req.FabricHandle)
		d.Handles.Fabric = fh
		return d, nil, nil
	}
	return d, nil, status.Errorf(codes.InvalidArgument, "GPU memory is passed as a VMM fd, an IPC handle or a fabric handle, not %s", req.HandleType)
}

// vmmFiles takes the descriptors of a region spanning several VMM allocations (fd_tokens), after checking that
// the range fits: n allocations of allocation_size bytes, each holding part of [offset, offset+length), n at most
// engines.MaxVMMAllocations. The tokens must name exactly the allocations the range spans; a refused request
// takes none of them (the caller's keep waiting until they expire) and touches no one else's.
func (tab *Table) vmmFiles(sess *Session, req *agentv1.RegisterMemoryRequest) ([]*os.File, error) {
	a, off, length := req.AllocationSize, req.Offset, req.Length
	if a == 0 {
		return nil, status.Error(codes.InvalidArgument, "HANDLE_TYPE_VMM_POSIX_FD with fd_tokens needs allocation_size (the size of each VMM allocation)")
	}
	if off >= a {
		return nil, status.Errorf(codes.InvalidArgument, "offset %d is past the first VMM allocation of %d bytes (pass only the allocations the range spans, from the one holding its start)", off, a)
	}
	end := off + length
	if end < off {
		return nil, status.Errorf(codes.InvalidArgument, "range [%d, +%d) overflows", off, length)
	}
	want := end/a + min(end%a, 1) // allocations [offset, offset+length) touches, counted from the first
	if want > engines.MaxVMMAllocations {
		return nil, status.Errorf(codes.InvalidArgument, "range [%d, +%d) spans %d VMM allocations of %d bytes, at most %d are mapped as one region",
			off, length, want, a, engines.MaxVMMAllocations)
	}
	files, err := tab.tokens.TakeAll(sess.Caller.Key, req.FdTokens, int(want))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "taking the VMM allocations of range [%d, +%d) (allocations of %d bytes, it spans %d; pass exactly those, in address order): %v",
			off, length, a, want, err)
	}
	return files, nil
}

// CheckSegmentName validates a segment name: printable ASCII without spaces or '/', at most MaxSegmentName bytes.
func CheckSegmentName(name string) error {
	if len(name) > MaxSegmentName {
		return status.Errorf(codes.InvalidArgument, "segment name is %d bytes, at most %d", len(name), MaxSegmentName)
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' || name[i] == '/' {
			return status.Errorf(codes.InvalidArgument, "segment name %q: use printable ASCII without spaces or '/'", name)
		}
	}
	return nil
}

// MapShared maps [off, off+length) of a shared-memory fd, checking what it is first so a bad fd gets a clear
// error. It returns the region's view and the whole mapping (page-aligned) to unmap later.
//
// The fd must be a memfd sealed against shrinking: a caller that truncated memory the agent has mapped would
// make the agent's next copy fault (SIGBUS), which no Go code can recover from. The seal is checked before the
// size, so the size checked is a lower bound for as long as the mapping lives.
func MapShared(f *os.File, off, length uint64, prot int) (view, mapping []byte, err error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("the passed fd is not shared memory (not a memfd: F_GET_SEALS: %v): %s", err, sealHowTo)
	}
	if seals&unix.F_SEAL_SHRINK == 0 && seals&unix.F_SEAL_SEAL != 0 {
		// Sealing is closed on it: a memfd made without MFD_ALLOW_SEALING, or a tmpfs file (/dev/shm, shm_open),
		// whose error said "memfd" of what was no memfd.
		return nil, nil, fmt.Errorf("%w: the passed shared memory is not sealed against shrinking and cannot be (a memfd made without MFD_ALLOW_SEALING, or a file of /dev/shm or shm_open); a caller that truncated it would crash the agent: %s", errUnsealed, sealHowTo)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, nil, fmt.Errorf("%w: the passed memfd is not sealed against shrinking (a caller that truncated it would crash the agent): %s", errUnsealed, sealHowTo)
	}
	// Only shmem: a hugetlb memfd is a memfd too, but its pages can vanish under the agent (a hole punched, the
	// pool's pages taken: SIGBUS again) and it cannot be unmapped in the page-sized pieces the agent maps.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return nil, nil, fmt.Errorf("inspecting the passed memfd's file system: %w", err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		what := fmt.Sprintf("file system type %#x", fs.Type)
		if fs.Type == unix.HUGETLBFS_MAGIC {
			what = "hugetlb (MFD_HUGETLB)"
		}
		return nil, nil, fmt.Errorf("the passed memfd is %s memory; only ordinary memfds are taken: %s", what, sealHowTo)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, nil, fmt.Errorf("inspecting the passed fd: %w", err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return nil, nil, fmt.Errorf("the passed fd is not shared memory (file type %#o; want a memfd)", st.Mode&syscall.S_IFMT)
	}
	if off+length < off || off+length > uint64(st.Size) {
		return nil, nil, fmt.Errorf("range [%d, %d) is outside the passed memory of %d bytes", off, off+length, st.Size)
	}
	hole, err := shmem.FirstHole(f, off, length)
	if err != nil {
		return nil, nil, fmt.Errorf("inspecting the passed memfd: %w", err)
	}
	if hole < off+length {
		return nil, nil, fmt.Errorf("%w: byte %d of range [%d, %d) lies in a page of the passed memfd that nobody has touched; "+
			"the agent's copies would allocate it, charged to the agent's memory limit instead of yours: touch every page of the "+
			"range first (mmap it with MAP_POPULATE, or load or store a byte of each page through a mapping; read() and pages "+
			"set aside by fallocate leave them untouched). The Go and Python clients do this when they register memory or "+
			"create it", errSparse, hole, off, off+length)
	}
	page := uint64(os.Getpagesize())
	base := off / page * page
	delta := off - base
	m, err := syscall.Mmap(int(f.Fd()), int64(base), int(length+delta), prot, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping the passed memory (is the fd opened O_RDWR?): %w", err)
	}
	return m[delta : delta+length : delta+length], m, nil
}

// errUnsealed marks host memory refused for lack of F_SEAL_SHRINK.
var errUnsealed = errors.New("unsealed shared memory")

// errSparse marks host memory refused for pages nobody has touched (see package shmem).
var errSparse = errors.New("shared memory with untouched pages")

// RefusalReason is the edge refusal counter's reason for a MapShared error that has one ("" for the others).
func RefusalReason(err error) string {
	switch {
	case errors.Is(err, errUnsealed):
		return "unsealed"
	case errors.Is(err, errSparse):
		return "untouched_pages"
	}
	return ""
}

// sealHowTo is how a caller makes host memory the agent accepts.
const sealHowTo = "create host memory with memfd_create(name, MFD_CLOEXEC|MFD_ALLOW_SEALING), size it with ftruncate, " +
	"then seal it with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) before registering (the Go and Python clients do this " +
	"for the memory they create; shm_open files cannot be sealed)"

// AddRegion checks limits, registers view with the engines and records the region. Nothing is left behind on
// error.
func (tab *Table) AddRegion(ctx context.Context, sess *Session, kind agentv1.MemoryKind, desc engines.MemoryDesc, segment string, grants []string) (*Region, error) {
	return tab.addRegion(ctx, sess, kind, desc, segment, grants, nil, nil)
}

// addRegion is AddRegion for memory the agent holds by a mapping and descriptors: the region takes them in the
// step that records it (RemoveRegion releases them); on error they are still the caller's to release.
func (tab *Table) addRegion(ctx context.Context, sess *Session, kind agentv1.MemoryKind, desc engines.MemoryDesc, segment string, grants []string,
	mapping []byte, files []*os.File) (*Region, error) {
	pub := publication{namespace: sess.Caller.Namespace, grants: slices.Clone(grants)}
	key := scopedName(pub.namespace, segment)
	length := desc.Size
	rkey := make([]byte, 16)
	idBytes := make([]byte, 8)
	if _, err := rand.Read(rkey); err != nil {
		return nil, status.Errorf(codes.Internal, "making a region key: %v", err)
	}
	if _, err := rand.Read(idBytes); err != nil {
		return nil, status.Errorf(codes.Internal, "making a memory id: %v", err)
	}
	tab.Lock()
	if sess.Ended {
		tab.Unlock()
		return nil, status.Error(codes.Unavailable, "the session ended (its connection closed): nothing was registered")
	}
	u := tab.UsageLocked(sess.Caller.Key)
	lim := tab.limits
	if held := u.Regions; held+1 > lim.MaxRegions {
		tab.ReleaseUsageLocked(sess.Caller.Key)
		tab.Unlock()
		tab.refusals.LimitHit(refusals.LimitRegions)
		return nil, status.Errorf(codes.ResourceExhausted, "caller holds %d regions, the limit is %d", held, lim.MaxRegions)
	}
	if held := u.Bytes; held+length > lim.MaxRegisteredBytes || held+length < held {
		tab.ReleaseUsageLocked(sess.Caller.Key)
		tab.Unlock()
		tab.refusals.LimitHit(refusals.LimitRegisteredBytes)
		return nil, status.Errorf(codes.ResourceExhausted, "registering %d bytes would bring the caller to %d bytes, the limit is %d", length, held+length, lim.MaxRegisteredBytes)
	}
	if segment != "" {
		if held, taken := tab.segments[key]; taken {
			why := ""
			if held.holder != nil && held.holder.Ended {
				// A restarted process meets this: the name is freed once the transfers in flight on it settle.
				why = ": the connection that registered it has ended, and the name is free once its transfers in flight settle"
			}
			tab.ReleaseUsageLocked(sess.Caller.Key)
			tab.Unlock()
			return nil, status.Errorf(codes.AlreadyExists, "segment %q is already registered in namespace %q on node %s%s", segment, pub.namespace, tab.node, why)
		}
	}
	tab.nextRegion++
	r := &Region{id: tab.epoch | tab.nextRegion, owner: sess.Caller.Key, holder: sess, kind: kind, length: length,
		segment: segment, pub: pub, key: rkey, mem: engines.MemoryID(tab.node + "/" + hex.EncodeToString(idBytes))}
	// Reserve the quota and the name before the (slow) engine registration; undone on failure.
	u.Regions++
	u.Bytes += length
	if segment != "" {
		tab.segments[key] = r
	}
	tab.Unlock()

	undo := func() {
		tab.Lock()
		u.Regions--
		u.Bytes -= length
		tab.ReleaseUsageLocked(sess.Caller.Key)
		if segment != "" && tab.segments[key] == r {
			delete(tab.segments, key)
		}
		tab.Unlock()
	}
	desc.ID, desc.Node = r.mem, tab.node
	merged, err := tab.engine.Register(ctx, desc)
	if err != nil {
		undo()
		return nil, status.Errorf(StatusCode(err), "registering %d bytes with the engines: %v", length, err)
	}
	// Memory that no engine can even copy within itself is unusable: say so now, not at the first transfer.
	if ok, why := tab.engine.CanHandle(&merged, &merged); !ok {
		_ = tab.engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Errorf(codes.FailedPrecondition, "no engine on node %s can reach this %s memory: %s", tab.node, desc.Location.Kind, why)
	}
	names := engineNamesFor(merged)
	var sd []byte
	wire, err := engines.MarshalDesc(merged)
	if err == nil {
		sd, err = proto.Marshal(&agentv1.SegmentDescriptor{Node: tab.node, PoolNamespace: tab.poolNamespace,
			PoolName: tab.poolName, AgentEndpoint: tab.peerEndpoint, RegionId: r.id, Key: rkey, Kind: kind,
			Length: length, Segment: segment, Memory: wire})
	}
	if err != nil {
		_ = tab.engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Errorf(codes.Internal, "describing region: %v", err)
	}
	tab.Lock()
	if sess.Ended { // the connection went away while we registered: its teardown has passed, nothing may stay
		tab.Unlock()
		_ = tab.engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Error(codes.Unavailable, "the session ended while registering (its connection closed): nothing was kept")
	}
	// Filled in the step that checks the session and records the region: the session's teardown either saw Ended
	// refuse it above or finds it whole among the session's regions, and the reserved segment (found by name
	// under the lock) is never read half-filled.
	r.engines, r.desc, r.mapping, r.files = names, sd, mapping, files
	tab.regions[r.id] = r
	tab.byMemory[r.mem] = r
	sess.Regions[r.id] = r
	added := tab.added
	tab.Unlock()
	if added != nil {
		added()
	}
	return r, nil
}

// SetAddedHook has f run each time a region was recorded, before the call that added it goes on; nil removes
// it. For tests: they end the region's session there, to land a registration right after its teardown.
func (tab *Table) SetAddedHook(f func()) {
	tab.Lock()
	tab.added = f
	tab.Unlock()
}

// engineNamesFor lists the engines that filled a handle: the ones that can reach the memory from elsewhere.
func engineNamesFor(d engines.MemoryDesc) []string {
	names := []string{engines.EngineXGMI} // same-node copies reach any registered memory
	if d.Handles.Fabric != nil {
		names = append(names, engines.EngineFabric)
	}
	if len(d.Handles.RDMA) > 0 {
		names = append(names, engines.EngineRDMA)
	}
	if d.Handles.TCP != "" {
		names = append(names, engines.EngineTCP)
	}
	return names
}

// UsageLocked is what the caller of key holds, made empty when it held nothing yet.
func (tab *Table) UsageLocked(key string) *Usage {
	u := tab.callers[key]
	if u == nil {
		u = &Usage{}
		tab.callers[key] = u
	}
	return u
}

// OwnRegionLocked returns a region the session's caller registered.
func (tab *Table) OwnRegionLocked(sess *Session, id uint64) (*Region, error) {
	r, ok := tab.regions[id]
	if !ok || r.owner != sess.Caller.Key {
		// Another caller's region must look exactly like a missing one.
		return nil, status.Errorf(codes.NotFound, "region %d is not registered by this caller", id)
	}
	return r, nil
}

// DeregisterMemory serves the Agent API call of that name for the caller of sess.
func (tab *Table) DeregisterMemory(ctx context.Context, sess *Session, req *agentv1.DeregisterMemoryRequest) (*agentv1.DeregisterMemoryResponse, error) {
	tab.Lock()
	r, err := tab.OwnRegionLocked(sess, req.RegionId)
	if err == nil && r.alloc != "" {
		err = status.Errorf(codes.FailedPrecondition, "region %d is pool memory: Release allocation %s instead", r.id, r.alloc)
	}
	tab.Unlock()
	if err != nil {
		return nil, err
	}
	if err := tab.RemoveRegion(ctx, r); err != nil {
		return nil, status.Errorf(StatusCode(err), "deregistering region %d: %v", r.id, err)
	}
	return &agentv1.DeregisterMemoryResponse{}, nil
}

// RemoveRegion deregisters r from the engines (waiting for its in-flight transfers until ctx ends) and then
// releases its memory. If a copy might still touch the memory, the region stays and the error says so. One
// removal runs at a time: a second (a session's teardown beside a DeregisterMemory of another connection of the
// same pod) waits for the first, so the memory is released only after the engines let go of it, whoever asked.
func (tab *Table) RemoveRegion(ctx context.Context, r *Region) error {
	tab.Lock()
	if tab.regions[r.id] != r {
		tab.Unlock()
		return nil // removed already: whoever took it out released its memory and its charge
	}
	if busy := r.removing; busy != nil {
		tab.Unlock()
		select {
		case <-busy:
			return tab.RemoveRegion(ctx, r) // gone now, or the first removal failed and this one tries
		case <-ctx.Done():
			return fmt.Errorf("waiting for region %d's removal under way: %w", r.id, ctx.Err())
		}
	}
	done := make(chan struct{})
	r.removing = done
	tab.Unlock()
	defer close(done)
	if err := tab.engine.Deregister(ctx, r.mem); err != nil && !errors.Is(err, engines.ErrUnknownMemory) {
		tab.Lock()
		r.removing = nil
		tab.Unlock()
		return err
	}
	tab.Lock()
	delete(tab.regions, r.id)
	delete(tab.byMemory, r.mem)
	if k := scopedName(r.pub.namespace, r.segment); r.segment != "" && tab.segments[k] == r {
		delete(tab.segments, k)
	}
	delete(r.holder.Regions, r.id)
	if u := tab.callers[r.owner]; u != nil {
		u.Regions--
		u.Bytes -= r.length
		tab.ReleaseUsageLocked(r.owner)
	}
	mapping, files := r.mapping, r.files
	r.mapping, r.files = nil, nil
	tab.Unlock()
	if mapping != nil {
		_ = syscall.Munmap(mapping)
	}
	fdsocket.CloseFiles(files)
	return nil
}

// StatusCode maps engine errors to gRPC codes.
func StatusCode(err error) codes.Code {
	switch {
	case errors.Is(err, engines.ErrOutOfBounds):
		return codes.OutOfRange
	case errors.Is(err, engines.ErrInvalid), errors.Is(err, engines.ErrOverlap):
		return codes.InvalidArgument
	case errors.Is(err, engines.ErrUnknownMemory):
		return codes.NotFound
	case errors.Is(err, engines.ErrUnplannable):
		return codes.FailedPrecondition
	case errors.Is(err, engines.ErrBusy):
		return codes.Aborted
	case errors.Is(err, engines.ErrPeerLost), errors.Is(err, engines.ErrClosed):
		return codes.Unavailable
	case errors.Is(err, engines.ErrDeadline), errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, engines.ErrCancelled), errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// ParseDescriptor decodes a SegmentDescriptor from a caller or a peer and checks it belongs to this pool.
func (tab *Table) ParseDescriptor(b []byte) (*agentv1.SegmentDescriptor, engines.MemoryDesc, error) {
	var sd agentv1.SegmentDescriptor
	if err := proto.Unmarshal(b, &sd); err != nil {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor is malformed: %v", err)
	}
	if sd.PoolNamespace != tab.poolNamespace || sd.PoolName != tab.poolName {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor is of pool %s/%s, this agent serves %s/%s",
			sd.PoolNamespace, sd.PoolName, tab.poolNamespace, tab.poolName)
	}
	md, err := engines.UnmarshalDesc(sd.Memory)
	if err != nil {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor's memory is malformed: %v", err)
	}
	if md.Node != sd.Node {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor names node %q but its memory is on %q", sd.Node, md.Node)
	}
	return &sd, md, nil
}

// LocalByDescriptorLocked finds the local region a descriptor names, checking its key.
func (tab *Table) LocalByDescriptorLocked(sd *agentv1.SegmentDescriptor) (*Region, error) {
	return tab.keyedLocked(sd.RegionId, sd.Key)
}

// keyedLocked finds region id when key is its key (compared in constant time: the key is the capability).
func (tab *Table) keyedLocked(id uint64, key []byte) (*Region, error) {
	r, ok := tab.regions[id]
	if !ok || r.desc == nil || subtle.ConstantTimeCompare(r.key, key) != 1 {
		return nil, status.Errorf(codes.NotFound, "descriptor names region %d on this node, which is not registered (or the key does not match)", id)
	}
	return r, nil
}

// IssuedDescriptor returns the descriptor this agent issued for region id, when key is its key: another agent
// confirms a descriptor a caller handed it before importing it (the peer channel's ConfirmDescriptor).
func (tab *Table) IssuedDescriptor(id uint64, key []byte) ([]byte, error) {
	tab.Lock()
	defer tab.Unlock()
	r, err := tab.keyedLocked(id, key)
	if err != nil {
		return nil, err
	}
	return r.desc, nil
}

// LookupSegment returns the descriptor of a segment registered on this node, for a caller of namespace asker
// (the peer channel answers other agents with it, naming the pod that asks).
func (tab *Table) LookupSegment(segment, asker string) ([]byte, error) {
	if err := checkLookup(segment, asker); err != nil {
		return nil, err
	}
	tab.Lock()
	defer tab.Unlock()
	r, err := tab.SegmentLocked(segment, asker)
	if err != nil {
		return nil, err
	}
	return r.desc, nil
}

// SegmentLocked finds the published region a caller of namespace asker names; one it may not use is missing.
func (tab *Table) SegmentLocked(segment, asker string) (*Region, error) {
	r, ok := tab.segments[resolveName(asker, segment)]
	if !ok || r.desc == nil || !r.pub.admits(asker) {
		return nil, status.Errorf(codes.NotFound, "no segment %q on node %s%s", segment, tab.node, tab.notFoundHintLocked(segment, asker, false))
	}
	return r, nil
}
