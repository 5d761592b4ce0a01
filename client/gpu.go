// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package client

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// IPCHandleSize and FabricHandleSize are the sizes of a cudaIpcMemHandle_t and a CUmemFabricHandle.
const (
	IPCHandleSize    = 64
	FabricHandleSize = 64
)

// GPUMemory names GPU memory of this process the way the agent can open it from its own: exactly one of
// IPCHandle, VMMFiles and FabricHandle. The region is [Offset, Offset+Length) of it.
type GPUMemory struct {
	// GPUIndex is the GPU's index on this node; GPUUUID ("GPU-…") wins when both are set.
	GPUIndex int
	GPUUUID  string
	// IPCHandle is the cudaIpcMemHandle_t of a cudaMalloc allocation (cudaIpcGetMemHandle); Offset counts from
	// the allocation's base.
	IPCHandle []byte
	// VMMFiles are POSIX fds of VMM allocations (cuMemExportToShareableHandle), mapped back to back in address
	// order, each AllocationSize bytes; Offset counts from the first. The client keeps duplicates of them
	// until Deregister or Close, to register them again after an agent restart.
	VMMFiles []*os.File
	// FabricHandle is the CUmemFabricHandle of one VMM allocation of AllocationSize bytes.
	FabricHandle   []byte
	AllocationSize uint64
	Offset, Length uint64
}

// request is the registration request of m, and the files to pass with it (nil for none).
func (m *GPUMemory) request() (*agentv1.RegisterMemoryRequest, error) {
	req := &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_GPU, GpuIndex: int32(m.GPUIndex),
		GpuUuid: m.GPUUUID, Offset: m.Offset, Length: m.Length, AllocationSize: m.AllocationSize}
	kinds := 0
	for _, set := range []bool{m.IPCHandle != nil, m.VMMFiles != nil, m.FabricHandle != nil} {
		if set {
			kinds++
		}
	}
	switch {
	case kinds != 1:
		return nil, status.Error(codes.InvalidArgument, "name the GPU memory by exactly one of an IPC handle, VMM fds or a fabric handle")
	case m.Length == 0:
		return nil, status.Error(codes.InvalidArgument, "a GPU region of no bytes")
	case m.GPUIndex < 0 && m.GPUUUID == "":
		return nil, fmt.Errorf("GPU index %d: name the GPU by index or UUID", m.GPUIndex)
	case m.Offset+m.Length < m.Offset:
		return nil, status.Errorf(codes.InvalidArgument, "range [%d, +%d) overflows", m.Offset, m.Length)
	}
	switch {
	case m.IPCHandle != nil:
		if len(m.IPCHandle) != IPCHandleSize {
			return nil, status.Errorf(codes.InvalidArgument, "an IPC handle is %d bytes, not %d", IPCHandleSize, len(m.IPCHandle))
		}
		req.HandleType, req.IpcHandle, req.AllocationSize = agentv1.HandleType_HANDLE_TYPE_IPC, m.IPCHandle, 0
	case m.FabricHandle != nil:
		if len(m.FabricHandle) != FabricHandleSize {
			return nil, status.Errorf(codes.InvalidArgument, "a fabric handle is %d bytes, not %d", FabricHandleSize, len(m.FabricHandle))
		}
		if m.Offset+m.Length > m.AllocationSize {
			return nil, status.Errorf(codes.InvalidArgument, "range [%d, +%d) lies outside the allocation of %d bytes", m.Offset, m.Length, m.AllocationSize)
		}
		req.HandleType, req.FabricHandle = agentv1.HandleType_HANDLE_TYPE_FABRIC, m.FabricHandle
	default:
		n := uint64(len(m.VMMFiles))
		if n == 0 || m.AllocationSize == 0 {
			return nil, status.Error(codes.InvalidArgument, "VMM memory needs its allocations' fds and their size")
		}
		if m.AllocationSize > ^uint64(0)/n || m.Offset+m.Length > n*m.AllocationSize {
			return nil, status.Errorf(codes.InvalidArgument, "range [%d, +%d) lies outside %d allocations of %d bytes", m.Offset, m.Length, n, m.AllocationSize)
		}
		req.HandleType = agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD
	}
	return req, nil
}

// RegisterGPU registers GPU memory of this process with the agent. It is checked here first (one handle kind,
// handle sizes, the range inside the allocations), then by the agent, which imports it on the GPU.
func (c *Client) RegisterGPU(ctx context.Context, m GPUMemory, opts ...RegionOption) (*Region, error) {
	if _, err := m.request(); err != nil {
		return nil, fmt.Errorf("registering GPU memory: %w", err)
	}
	kept := m
	kept.VMMFiles = nil
	for _, f := range m.VMMFiles {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeFiles(kept.VMMFiles)
			return nil, fmt.Errorf("registering GPU memory: duplicating a VMM fd: %w", err)
		}
		kept.VMMFiles = append(kept.VMMFiles, os.NewFile(uintptr(fd), f.Name()))
	}
	r := &Region{c: c, gpu: &kept, offset: m.Offset, length: m.Length}
	for _, o := range opts {
		o(r)
	}
	if err := c.register(ctx, r); err != nil {
		closeFiles(kept.VMMFiles)
		return nil, err
	}
	c.mu.Lock()
	c.regions[r] = struct{}{}
	c.mu.Unlock()
	return r, nil
}

// registerGPU sends r's GPU registration, passing its VMM fds through the fd socket (up to fdpass.MaxPutFDs a
// token).
func (c *Client) registerGPU(ctx context.Context, r *Region, gen uint64) (*agentv1.RegisterMemoryResponse, error) {
	req, err := r.gpu.request()
	if err != nil {
		return nil, err
	}
	req.SegmentName, req.SegmentGrants = r.segment, r.grants
	for files := r.gpu.VMMFiles; len(files) > 0; {
		k := min(len(files), fdpass.MaxPutFDs)
		token, err := c.putFDs(ctx, files[:k])
		if err != nil {
			return nil, c.wrap(ctx, "registering GPU memory: passing its VMM fds", gen, err)
		}
		req.FdTokens = append(req.FdTokens, token)
		files = files[k:]
	}
	resp, err := c.api.RegisterMemory(ctx, req)
	if err != nil {
		return nil, c.wrap(ctx, "registering GPU memory", gen, err)
	}
	return resp, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
