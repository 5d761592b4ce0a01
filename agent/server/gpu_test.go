// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/agent/server"
	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

// TestGPURegistrationIsCheckedAndRefusedWithoutAGPUEngine: on a node whose engines cannot reach GPU memory
// (no GPU backend loaded), a GPU registration is refused with the engines' reasons, and malformed GPU handles
// are refused before any engine sees them. Nothing is left registered.
func TestGPURegistrationIsCheckedAndRefusedWithoutAGPUEngine(t *testing.T) {
	opts := baseOptions(t, newProcFixture(t))
	opts.GPUs = []server.GPUInfo{{Index: 0, UUID: "GPU-0000", Vendor: engines.VendorNVIDIA, BusID: "0000:c1:00.0"}}
	a := startAgent(t, opts)
	c := dial(t, a)
	ctx := ctxT(t)
	handle := make([]byte, 64)
	gpu := func(r *agentv1.RegisterMemoryRequest) error {
		r.Kind = agentv1.MemoryKind_MEMORY_KIND_GPU
		if r.Length == 0 {
			r.Length = 1 << 20
		}
		_, err := c.API().RegisterMemory(ctx, r)
		return err
	}
	cases := []struct {
		name string
		req  *agentv1.RegisterMemoryRequest
		code codes.Code
		says string
	}{
		{"unknown GPU", &agentv1.RegisterMemoryRequest{GpuIndex: 3, HandleType: agentv1.HandleType_HANDLE_TYPE_IPC, IpcHandle: handle}, codes.InvalidArgument, "not on node"},
		{"short IPC handle", &agentv1.RegisterMemoryRequest{HandleType: agentv1.HandleType_HANDLE_TYPE_IPC, IpcHandle: handle[:10]}, codes.InvalidArgument, "64"},
		{"fabric without allocation size", &agentv1.RegisterMemoryRequest{HandleType: agentv1.HandleType_HANDLE_TYPE_FABRIC, FabricHandle: handle}, codes.InvalidArgument, "allocation_size"},
		{"range outside the allocation", &agentv1.RegisterMemoryRequest{HandleType: agentv1.HandleType_HANDLE_TYPE_FABRIC, FabricHandle: handle,
			Offset: 1 << 20, AllocationSize: 1 << 20}, codes.InvalidArgument, "outside the allocation"},
		{"shared-memory fd as GPU memory", &agentv1.RegisterMemoryRequest{HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD}, codes.InvalidArgument, "VMM fd"},
		{"no GPU engine", &agentv1.RegisterMemoryRequest{GpuUuid: "GPU-0000", HandleType: agentv1.HandleType_HANDLE_TYPE_IPC, IpcHandle: handle}, codes.FailedPrecondition, "no engine on node node-a can reach this gpu memory"},
	}
	for _, tc := range cases {
		err := gpu(tc.req)
		if client.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want %s saying %q", tc.name, err, tc.code, tc.says)
		}
	}
	// A VMM fd is taken from the fd socket like a shared-memory fd; it is closed on refusal.
	m := shm(t, 4096)
	token, err := fdpass.Put(ctx, a.srv.FDSocketPath(), m.File)
	if err != nil {
		t.Fatal(err)
	}
	err = gpu(&agentv1.RegisterMemoryRequest{HandleType: agentv1.HandleType_HANDLE_TYPE_VMM_POSIX_FD, FdToken: token, Length: 4096, AllocationSize: 4096})
	if client.Code(err) != codes.FailedPrecondition {
		t.Errorf("VMM fd without a GPU engine: %v, want FailedPrecondition", err)
	}
	info, err := c.API().GetInfo(ctx, &agentv1.GetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Usage.Regions != 0 || info.Usage.RegisteredBytes != 0 {
		t.Fatalf("refused registrations left usage %v", info.Usage)
	}
}
