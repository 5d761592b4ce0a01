// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server

import (
	"bytes"
	"context"
	"crypto/rand"
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

	"github.com/fabricxfer/fabricxfer/agent/poolmem"
	"github.com/fabricxfer/fabricxfer/agent/server/fdsocket"
	"github.com/fabricxfer/fabricxfer/agent/server/refusals"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/engines"
)

// MaxSegmentName bounds segment names.
const MaxSegmentName = 128

// region is registered memory of one caller.
type region struct {
	id      uint64
	mem     engines.MemoryID
	owner   string // caller key
	session uint64
	kind    agentv1.MemoryKind
	length  uint64
	segment string
	pub     publication // who published segment, and who else may use it
	key     []byte
	engines []string
	desc    []byte // serialized SegmentDescriptor
	// mapping and files are released after the engines let go of the region.
	mapping []byte
	files   []*os.File
	alloc   string // pool slice id when the region is pool memory
}

func (r *region) proto() *agentv1.Region {
	return &agentv1.Region{Id: r.id, Kind: r.kind, Length: r.length, SegmentName: r.segment,
		Desc: r.desc, Engines: r.engines}
}

// GetInfo implements agentv1.AgentServer.
func (s *Server) GetInfo(ctx context.Context, req *agentv1.GetInfoRequest) (*agentv1.GetInfoResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	if len(req.ApiVersions) > 0 && !slices.Contains(req.ApiVersions, APIVersion) {
		return nil, status.Errorf(codes.FailedPrecondition, "this agent speaks API %s; the client offers %v", APIVersion, req.ApiVersions)
	}
	c := sess.caller
	resp := &agentv1.GetInfoResponse{
		ApiVersion: APIVersion, SupportedApiVersions: []string{APIVersion}, AgentVersion: s.opts.AgentVersion,
		NodeName: s.opts.NodeName, PoolNamespace: s.opts.PoolNamespace, PoolName: s.opts.PoolName,
		Caller: &agentv1.CallerInfo{Namespace: c.Namespace, PodName: c.PodName, PodUid: c.PodUID,
			Pid: c.Cred.PID, Uid: c.Cred.UID, Identity: c.Key},
		Limits: &agentv1.Limits{MaxRegions: uint32(s.opts.Limits.MaxRegions), MaxRegisteredBytes: s.opts.Limits.MaxRegisteredBytes,
			MaxInFlight: uint32(s.opts.Limits.MaxInFlight), MaxItemsPerTransfer: uint32(s.opts.Limits.MaxItemsPerTransfer)},
		FdSocket: s.FDSocketPath(),
	}
	for _, e := range s.opts.Engines {
		resp.Engines = append(resp.Engines, &agentv1.EngineInfo{Name: e.Name, Available: e.Available, Reason: e.Reason})
	}
	s.mu.Lock()
	if u := s.callers[c.Key]; u != nil {
		resp.Usage = &agentv1.Usage{Regions: uint32(u.regions), RegisteredBytes: u.bytes, InFlight: uint32(u.inFlight)}
	} else {
		resp.Usage = &agentv1.Usage{}
	}
	s.mu.Unlock()
	if s.opts.Pool != nil {
		total, free := s.opts.Pool.Usage()
		kind := agentv1.MemoryKind_MEMORY_KIND_HOST
		if s.opts.Pool.Kind() == poolmem.GPU {
			kind = agentv1.MemoryKind_MEMORY_KIND_GPU
		}
		resp.PoolMemory = &agentv1.PoolMemoryInfo{Kind: kind, TotalBytes: total, FreeBytes: free}
		if gp, ok := s.opts.Pool.(interface{ Devices() []poolmem.DeviceUsage }); ok {
			for _, d := range gp.Devices() {
				resp.PoolMemory.Gpus = append(resp.PoolMemory.Gpus, &agentv1.PoolGPU{Index: int32(d.Index), BusId: d.BusID,
					TotalBytes: d.Total, FreeBytes: d.Free, FabricExportable: d.FabricExportable, FabricReason: d.FabricReason})
			}
		}
	}
	return resp, nil
}

// RegisterMemory implements agentv1.AgentServer.
func (s *Server) RegisterMemory(ctx context.Context, req *agentv1.RegisterMemoryRequest) (*agentv1.RegisterMemoryResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkSegmentName(req.SegmentName); err != nil {
		return nil, err
	}
	if err := checkGrants(req.SegmentGrants); err != nil {
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
		f, err := s.tokens.Take(sess.caller.Key, req.FdToken, false)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		view, m, err := mapShared(f, req.Offset, req.Length, syscall.PROT_READ|syscall.PROT_WRITE)
		if err != nil {
			f.Close()
			if errors.Is(err, errUnsealed) {
				s.metrics.Edge.Refused("grpc", "unsealed")
			}
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		desc = engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationHost}, Handles: engines.Handles{Host: view}}
		mapping, files = m, []*os.File{f}
	case agentv1.MemoryKind_MEMORY_KIND_GPU:
		desc, files, err = s.gpuDesc(sess, req)
		if err != nil {
			return nil, err
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "memory kind must be MEMORY_KIND_HOST or MEMORY_KIND_GPU, got %s", req.Kind)
	}
	desc.Size = req.Length
	r, err := s.addRegion(ctx, sess, req.Kind, desc, req.SegmentName, req.SegmentGrants)
	if err != nil {
		if mapping != nil {
			syscall.Munmap(mapping)
		}
		fdsocket.CloseFiles(files)
		return nil, err
	}
	s.mu.Lock()
	r.mapping, r.files = mapping, files
	s.mu.Unlock()
	return &agentv1.RegisterMemoryResponse{Region: r.proto()}, nil
}

// GPUInfo is one GPU of this node, as detection found it.
type GPUInfo struct {
	Index  int
	UUID   string
	Vendor engines.Vendor
	BusID  string
	// FabricDomain is the GPU's scale-up domain key (empty outside any domain).
	FabricDomain string
}

// fabricDomain is the GPU's fabric domain key as of now.
func (s *Server) fabricDomain(g *GPUInfo) string {
	if s.opts.FabricDomainOf != nil {
		if d, ok := s.opts.FabricDomainOf(g.Index); ok {
			return d
		}
	}
	return g.FabricDomain
}

// gpuDesc describes GPU memory a caller hands over by VMM fd, IPC handle or fabric handle.
func (s *Server) gpuDesc(sess *session, req *agentv1.RegisterMemoryRequest) (engines.MemoryDesc, []*os.File, error) {
	var gpu *GPUInfo
	for i := range s.opts.GPUs {
		g := &s.opts.GPUs[i]
		if (req.GpuUuid != "" && g.UUID == req.GpuUuid) || (req.GpuUuid == "" && g.Index == int(req.GpuIndex)) {
			gpu = g
			break
		}
	}
	if gpu == nil {
		return engines.MemoryDesc{}, nil, status.Errorf(codes.InvalidArgument, "GPU (index %d, uuid %q) is not on node %s (%d GPUs detected)",
			req.GpuIndex, req.GpuUuid, s.opts.NodeName, len(s.opts.GPUs))
	}
	d := engines.MemoryDesc{Location: engines.Location{Kind: engines.LocationGPU, Device: gpu.Index, Vendor: gpu.Vendor, BusID: gpu.BusID},
		FabricDomain: s.fabricDomain(gpu)}
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
			files, err := s.vmmFiles(sess, req)
			if err != nil {
				return d, nil, err
			}
			d.Handles.VMM = &engines.VMMHandle{FDs: files, Offset: req.Offset, AllocSize: req.AllocationSize}
			return d, files, nil
		}
		if err := inAlloc(); err != nil {
			return d, nil, err
		}
		f, err := s.tokens.Take(sess.caller.Key, req.FdToken, false)
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
func (s *Server) vmmFiles(sess *session, req *agentv1.RegisterMemoryRequest) ([]*os.File, error) {
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
	files, err := s.tokens.TakeAll(sess.caller.Key, req.FdTokens, int(want))
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "taking the VMM allocations of range [%d, +%d) (allocations of %d bytes, it spans %d; pass exactly those, in address order): %v",
			off, length, a, want, err)
	}
	return files, nil
}

func checkSegmentName(name string) error {
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

// mapShared maps [off, off+length) of a shared-memory fd, checking what it is first so a bad fd gets a clear
// error. It returns the region's view and the whole mapping (page-aligned) to unmap later.
//
// The fd must be a memfd sealed against shrinking: a caller that truncated memory the agent has mapped would
// make the agent's next copy fault (SIGBUS), which no Go code can recover from. The seal is checked before the
// size, so the size checked is a lower bound for as long as the mapping lives.
func mapShared(f *os.File, off, length uint64, prot int) (view, mapping []byte, err error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("the passed fd is not shared memory (not a memfd: F_GET_SEALS: %v): %s", err, sealHowTo)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, nil, fmt.Errorf("%w: the passed memfd is not sealed against shrinking (a caller that truncated it would crash the agent): %s", errUnsealed, sealHowTo)
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

// sealHowTo is how a caller makes host memory the agent accepts.
const sealHowTo = "create host memory with memfd_create(name, MFD_CLOEXEC|MFD_ALLOW_SEALING), size it with ftruncate, " +
	"then seal it with fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) before registering (the Go and Python clients do this " +
	"for the memory they create; shm_open files cannot be sealed)"

// addRegion checks limits, registers view with the engines and records the region. Nothing is left behind on
// error.
func (s *Server) addRegion(ctx context.Context, sess *session, kind agentv1.MemoryKind, desc engines.MemoryDesc, segment string, grants []string) (*region, error) {
	pub := publication{namespace: sess.caller.Namespace, grants: slices.Clone(grants)}
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
	s.mu.Lock()
	if sess.ended {
		s.mu.Unlock()
		return nil, status.Error(codes.Unavailable, "the connection is closing")
	}
	u := s.usageLocked(sess.caller.Key)
	lim := s.opts.Limits
	if u.regions+1 > lim.MaxRegions {
		s.mu.Unlock()
		s.metrics.LimitHit(refusals.LimitRegions)
		return nil, status.Errorf(codes.ResourceExhausted, "caller holds %d regions, the limit is %d", u.regions, lim.MaxRegions)
	}
	if u.bytes+length > lim.MaxRegisteredBytes || u.bytes+length < u.bytes {
		s.mu.Unlock()
		s.metrics.LimitHit(refusals.LimitRegisteredBytes)
		return nil, status.Errorf(codes.ResourceExhausted, "registering %d bytes would bring the caller to %d bytes, the limit is %d", length, u.bytes+length, lim.MaxRegisteredBytes)
	}
	if segment != "" {
		if _, taken := s.segments[key]; taken {
			s.mu.Unlock()
			return nil, status.Errorf(codes.AlreadyExists, "segment %q is already registered in namespace %q on node %s", segment, pub.namespace, s.opts.NodeName)
		}
	}
	s.nextRegion++
	r := &region{id: s.regionEpoch | s.nextRegion, owner: sess.caller.Key, session: sess.id, kind: kind, length: length,
		segment: segment, pub: pub, key: rkey, mem: engines.MemoryID(s.opts.NodeName + "/" + hex.EncodeToString(idBytes))}
	// Reserve the quota and the name before the (slow) engine registration; undone on failure.
	u.regions++
	u.bytes += length
	if segment != "" {
		s.segments[key] = r
	}
	s.mu.Unlock()

	undo := func() {
		s.mu.Lock()
		u.regions--
		u.bytes -= length
		if segment != "" && s.segments[key] == r {
			delete(s.segments, key)
		}
		s.mu.Unlock()
	}
	desc.ID, desc.Node = r.mem, s.opts.NodeName
	merged, err := s.opts.Engine.Register(ctx, desc)
	if err != nil {
		undo()
		return nil, status.Errorf(statusCode(err), "registering %d bytes with the engines: %v", length, err)
	}
	// Memory that no engine can even copy within itself is unusable: say so now, not at the first transfer.
	if ok, why := s.opts.Engine.CanHandle(&merged, &merged); !ok {
		_ = s.opts.Engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Errorf(codes.FailedPrecondition, "no engine on node %s can reach this %s memory: %s", s.opts.NodeName, desc.Location.Kind, why)
	}
	r.engines = engineNamesFor(merged)
	wire, err := engines.MarshalDesc(merged)
	if err == nil {
		r.desc, err = proto.Marshal(&agentv1.SegmentDescriptor{Node: s.opts.NodeName, PoolNamespace: s.opts.PoolNamespace,
			PoolName: s.opts.PoolName, AgentEndpoint: s.opts.PeerEndpoint, RegionId: r.id, Key: rkey, Kind: kind,
			Length: length, Segment: segment, Memory: wire})
	}
	if err != nil {
		_ = s.opts.Engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Errorf(codes.Internal, "describing region: %v", err)
	}
	s.mu.Lock()
	if sess.ended { // the connection went away while we registered
		s.mu.Unlock()
		_ = s.opts.Engine.Deregister(ctx, r.mem)
		undo()
		return nil, status.Error(codes.Unavailable, "the connection closed during registration")
	}
	s.regions[r.id] = r
	s.byMemory[r.mem] = r
	sess.regions[r.id] = r
	s.mu.Unlock()
	return r, nil
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

func (s *Server) usageLocked(key string) *usage {
	u := s.callers[key]
	if u == nil {
		u = &usage{}
		s.callers[key] = u
	}
	return u
}

// ownRegion returns a region the session's caller registered.
func (s *Server) ownRegionLocked(sess *session, id uint64) (*region, error) {
	r, ok := s.regions[id]
	if !ok || r.owner != sess.caller.Key {
		// Another caller's region must look exactly like a missing one.
		return nil, status.Errorf(codes.NotFound, "region %d is not registered by this caller", id)
	}
	return r, nil
}

// DeregisterMemory implements agentv1.AgentServer.
func (s *Server) DeregisterMemory(ctx context.Context, req *agentv1.DeregisterMemoryRequest) (*agentv1.DeregisterMemoryResponse, error) {
	sess, err := s.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	r, err := s.ownRegionLocked(sess, req.RegionId)
	if err == nil && r.alloc != "" {
		err = status.Errorf(codes.FailedPrecondition, "region %d is pool memory: Release allocation %s instead", r.id, r.alloc)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := s.removeRegion(ctx, r); err != nil {
		return nil, status.Errorf(statusCode(err), "deregistering region %d: %v", r.id, err)
	}
	return &agentv1.DeregisterMemoryResponse{}, nil
}

// removeRegion deregisters r from the engines (waiting for its in-flight transfers until ctx ends) and then
// releases its memory. If a copy might still touch the memory, the region stays and the error says so.
func (s *Server) removeRegion(ctx context.Context, r *region) error {
	if err := s.opts.Engine.Deregister(ctx, r.mem); err != nil && !errors.Is(err, engines.ErrUnknownMemory) {
		return err
	}
	s.mu.Lock()
	delete(s.regions, r.id)
	delete(s.byMemory, r.mem)
	if k := scopedName(r.pub.namespace, r.segment); r.segment != "" && s.segments[k] == r {
		delete(s.segments, k)
	}
	for _, sess := range s.sessions {
		delete(sess.regions, r.id)
	}
	if u := s.callers[r.owner]; u != nil {
		u.regions--
		u.bytes -= r.length
	}
	s.mu.Unlock()
	if r.mapping != nil {
		_ = syscall.Munmap(r.mapping)
	}
	fdsocket.CloseFiles(r.files)
	return nil
}

// endSession releases everything a gone connection held.
func (s *Server) endSession(sess *session) {
	s.mu.Lock()
	sess.ended = true
	for _, c := range sess.fastConns {
		c.Close()
	}
	for _, l := range s.layouts { // a layout names the session's regions, which go below
		if l.session == sess.id {
			s.dropLayoutLocked(l)
		}
	}
	regs := make([]*region, 0, len(sess.regions))
	for _, r := range sess.regions {
		regs = append(regs, r)
	}
	allocs := make([]*allocation, 0, len(sess.allocs))
	for _, a := range sess.allocs {
		allocs = append(allocs, a)
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.SessionGrace)
	defer cancel()
	for _, r := range regs {
		if r.alloc != "" {
			continue // released with its allocation below
		}
		if err := s.removeRegion(ctx, r); err != nil {
			s.log.Error("region of a gone caller stays registered", "region", r.id, "caller", sess.caller.Key, "error", err)
		}
	}
	for _, a := range allocs {
		if err := s.releaseAllocation(ctx, sess, a); err != nil {
			s.log.Error("pool slice of a gone caller not released", "allocation", a.id, "error", err)
		}
	}
	s.mu.Lock()
	delete(s.sessions, sess.id)
	s.mu.Unlock()
	if sess.identErr == nil {
		s.log.Debug("caller left", "caller", sess.caller.String(), "regions", len(regs), "allocations", len(allocs))
	}
}

// statusCode maps engine errors to gRPC codes.
func statusCode(err error) codes.Code {
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

// parseDescriptor decodes a SegmentDescriptor from a caller or a peer and checks it belongs to this pool.
func (s *Server) parseDescriptor(b []byte) (*agentv1.SegmentDescriptor, engines.MemoryDesc, error) {
	var sd agentv1.SegmentDescriptor
	if err := proto.Unmarshal(b, &sd); err != nil {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor is malformed: %v", err)
	}
	if sd.PoolNamespace != s.opts.PoolNamespace || sd.PoolName != s.opts.PoolName {
		return nil, engines.MemoryDesc{}, status.Errorf(codes.InvalidArgument, "descriptor is of pool %s/%s, this agent serves %s/%s",
			sd.PoolNamespace, sd.PoolName, s.opts.PoolNamespace, s.opts.PoolName)
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

// localByDescriptorLocked finds the local region a descriptor names, checking its key.
func (s *Server) localByDescriptorLocked(sd *agentv1.SegmentDescriptor) (*region, error) {
	r, ok := s.regions[sd.RegionId]
	if !ok || !bytes.Equal(r.key, sd.Key) {
		return nil, status.Errorf(codes.NotFound, "descriptor names region %d on this node, which is not registered (or the key does not match)", sd.RegionId)
	}
	return r, nil
}
