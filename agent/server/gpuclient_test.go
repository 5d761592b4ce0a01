// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/engines"
)

// TestGoClientRegistersGPUMemoryByKind: client.RegisterGPU refuses malformed GPU memory before any call, passes
// every VMM fd in order (several PUTs past fdpass.MaxPutFDs), keeps duplicates that Recover registers again and
// Deregister closes, and reports the agent's refusal of an IPC handle no engine can open.
func TestGoClientRegistersGPUMemoryByKind(t *testing.T) {
	a, be := stubGPUAgent(t)
	c := dial(t, a)
	ctx := ctxT(t)
	const alloc = 2 << 20
	files := make([]*os.File, 300) // more than one PUT carries
	for i := range files {
		files[i] = shm(t, 4096).File // stands in for a VMM fd: the stub only looks at which file it is
	}
	handle := make([]byte, client.IPCHandleSize)
	base := openFDs(t)

	for name, m := range map[string]client.GPUMemory{
		"no handle":              {Length: 1},
		"two handle kinds":       {IPCHandle: handle, VMMFiles: files[:1], AllocationSize: alloc, Length: 1},
		"short IPC handle":       {IPCHandle: handle[:10], Length: 1},
		"no bytes":               {IPCHandle: handle},
		"VMM without a size":     {VMMFiles: files[:1], Length: 1},
		"range past the fds":     {VMMFiles: files[:2], AllocationSize: alloc, Offset: alloc, Length: 2 * alloc},
		"fabric past its memory": {FabricHandle: make([]byte, client.FabricHandleSize), AllocationSize: alloc, Length: alloc + 1},
		"no GPU":                 {GPUIndex: -1, IPCHandle: handle, Length: 1},
	} {
		if _, err := c.RegisterGPU(ctx, m); err == nil || !strings.Contains(err.Error(), "registering GPU memory") {
			t.Errorf("%s: %v, want a refusal before any call", name, err)
		}
	}
	if n := openFDs(t); n != base {
		t.Fatalf("refusals left %d descriptors open (was %d)", n, base)
	}

	// 300 allocations, the region from the middle of the first to the middle of the last.
	m := client.GPUMemory{GPUUUID: "GPU-0000", VMMFiles: files, AllocationSize: alloc, Offset: alloc / 2, Length: 299 * alloc}
	r, err := c.RegisterGPU(ctx, m, client.Segment("kv-gpu"))
	if err != nil {
		t.Fatalf("registering 300 VMM allocations: %v", err)
	}
	check := func(when string) {
		t.Helper()
		be.mu.Lock()
		defer be.mu.Unlock()
		if len(be.seen) != 1 {
			t.Fatalf("%s: the backend holds %d GPU regions, want 1", when, len(be.seen))
		}
		var s vmmSeen
		for _, v := range be.seen {
			s = v
		}
		if len(s.inodes) != len(files) || s.offset != alloc/2 || s.allocSize != alloc {
			t.Fatalf("%s: backend saw %d fds, offset %d, allocation %d", when, len(s.inodes), s.offset, s.allocSize)
		}
		for i, ino := range s.inodes {
			if ino != fileInode(t, files[i]) {
				t.Fatalf("%s: allocation %d arrived out of order", when, i)
			}
		}
	}
	check("registered")
	if r.Len() != 299*alloc || r.Segment() != "kv-gpu" {
		t.Fatalf("region of %d bytes named %q", r.Len(), r.Segment())
	}

	// After an agent restart Recover registers the same allocations again from the client's duplicates.
	a.stop(t)
	startAgent(t, a.opts) // on the same socket, where the client finds it
	be.mu.Lock()
	be.seen = map[engines.MemoryID]vmmSeen{}
	be.mu.Unlock()
	if err := c.Recover(ctx); err != nil {
		t.Fatalf("recovering: %v", err)
	}
	check("recovered")
	if err := c.Deregister(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n := fdsWithin(t, base); n > base {
		t.Fatalf("%d descriptors open after deregistering, %d before: the client kept duplicates", n, base)
	}

	// An IPC handle reaches the agent, whose backend refuses to open it: the caller hears why.
	be.mu.Lock()
	be.fail = errors.New("cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE")
	be.mu.Unlock()
	_, err = c.RegisterGPU(ctx, client.GPUMemory{GPUIndex: 0, IPCHandle: handle, Length: 4096})
	if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_INVALID_VALUE") || client.Code(err) == codes.OK {
		t.Fatalf("an IPC handle the backend refuses: %v", err)
	}
}
