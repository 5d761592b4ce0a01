// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
)

func memfd(t *testing.T, size int64, flags int) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("hostile", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "hostile")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

// registerRaw registers f without the client's help (no sealing), as a hostile caller would.
func registerRaw(t *testing.T, a *agent, c *client.Client, f *os.File, off, length uint64) error {
	t.Helper()
	token, err := fdpass.Put(ctxT(t), a.srv.FDSocketPath(), f)
	if err != nil {
		return err
	}
	_, err = c.API().RegisterMemory(ctxT(t), &agentv1.RegisterMemoryRequest{Kind: agentv1.MemoryKind_MEMORY_KIND_HOST,
		HandleType: agentv1.HandleType_HANDLE_TYPE_SHM_FD, FdToken: token, Offset: off, Length: length})
	return err
}

// Host memory that could shrink under the agent's mapping is refused with how to seal it; memory the client
// makes is sealed, so truncating it fails and the agent keeps serving.
func TestUnsealedHostMemoryIsRefused(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	c := dial(t, a)
	ctx := ctxT(t)

	// A memfd that cannot be sealed, registered through the client: refused, saying how.
	plain := memfd(t, 1<<20, 0)
	if _, err := c.RegisterHost(ctx, plain, 0, 1<<20); client.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "F_SEAL_SHRINK") || !strings.Contains(err.Error(), "MFD_ALLOW_SEALING") {
		t.Fatalf("unsealable memfd: %v, want InvalidArgument saying how to seal", err)
	}
	// A sealable memfd the caller did not seal, registered raw: refused.
	sealable := memfd(t, 1<<20, unix.MFD_ALLOW_SEALING)
	if err := registerRaw(t, a, c, sealable, 0, 1<<20); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not sealed against shrinking") {
		t.Fatalf("unsealed memfd: %v", err)
	}
	// A file of /dev/shm (tmpfs, which cannot be sealed) is named as such, not as an unsealed memfd.
	if shmFile, err := os.CreateTemp("/dev/shm", "fabricxfer-seal-test-"); err != nil {
		t.Logf("no /dev/shm file to try (%v)", err)
	} else {
		defer os.Remove(shmFile.Name())
		defer shmFile.Close()
		_ = shmFile.Truncate(1 << 20)
		if err := registerRaw(t, a, c, shmFile, 0, 1<<20); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "cannot be (a memfd made without MFD_ALLOW_SEALING, or a file of /dev/shm") {
			t.Fatalf("a /dev/shm file: %v, want InvalidArgument naming what it is", err)
		}
	}
	// A regular file is not shared memory.
	reg, _ := os.CreateTemp(t.TempDir(), "file")
	defer reg.Close()
	_ = reg.Truncate(1 << 20)
	if err := registerRaw(t, a, c, reg, 0, 1<<20); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not shared memory") {
		t.Fatalf("regular file: %v", err)
	}
	// Sealed, but smaller than offset+length.
	if err := client.SealShrink(sealable); err != nil {
		t.Fatal(err)
	}
	if err := registerRaw(t, a, c, sealable, 4096, 1<<20); client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("range beyond a sealed memfd: %v", err)
	}
	// Client memory is sealed: truncating it fails, and transfers go on.
	src, dst := shm(t, 1<<20), shm(t, 1<<20)
	fill(t, src.Bytes)
	rs, err := c.RegisterHost(ctx, src.File, 0, src.Size())
	if err != nil {
		t.Fatal(err)
	}
	rd, err := c.RegisterHost(ctx, dst.File, 0, dst.Size())
	if err != nil {
		t.Fatal(err)
	}
	if err := src.File.Truncate(0); err == nil {
		t.Fatal("truncating registered client memory succeeded")
	}
	if _, err := c.Write(ctx, rs, 0, client.ToRegion(rd), 0, src.Size()); err != nil || !bytes.Equal(src.Bytes, dst.Bytes) {
		t.Fatalf("transfer after a refused truncate: %v", err)
	}
}
