// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package server_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentv1 "github.com/fabricxfer/fabricxfer/api/proto/fabricxfer/agent/v1"
	"github.com/fabricxfer/fabricxfer/client"
	"github.com/fabricxfer/fabricxfer/internal/fdpass"
	"github.com/fabricxfer/fabricxfer/internal/promtest"
	"github.com/fabricxfer/fabricxfer/internal/shmem"
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

// Host memory with pages nobody has touched is refused: the agent's copies would allocate those pages, and the
// kernel charges a shmem page to whoever faults it in, so a caller could fill the agent's memory limit with a
// sparse memfd of any size at no cost of its own. The refusal names the first such byte and how to populate,
// touches none of the pages, and leaves another client's regions and transfers alone. A range that avoids the
// untouched pages registers; the client populates what it registers, so the same memfd registers through it
// with its bytes unchanged.
func TestHostMemoryNobodyTouchedIsRefused(t *testing.T) {
	a := startAgent(t, baseOptions(t, newProcFixture(t)))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.srv.Collector())
	c, other := dial(t, a), dial(t, a)
	ctx := ctxT(t)
	os1, od1 := shm(t, 1<<20), shm(t, 1<<20)
	fill(t, os1.Bytes)
	ors, err := other.RegisterHost(ctx, os1.File, 0, os1.Size())
	if err != nil {
		t.Fatal(err)
	}
	ord, err := other.RegisterHost(ctx, od1.File, 0, od1.Size())
	if err != nil {
		t.Fatal(err)
	}

	page := uint64(os.Getpagesize())
	const size = 256 << 20
	sparse := memfd(t, size, unix.MFD_ALLOW_SEALING)
	if err := client.SealShrink(sparse); err != nil {
		t.Fatal(err)
	}
	written := bytes.Repeat([]byte{0x5A}, int(4*page))
	if _, err := sparse.WriteAt(written, int64(8*page)); err != nil { // pages 8..11 written, the rest untouched
		t.Fatal(err)
	}
	refusedCount := func() float64 {
		return promtest.Gather(t, reg)["fabricxfer_agent_edge_refusals_total{reason=untouched_pages,socket=grpc}"]
	}
	for _, r := range []struct{ off, length, first uint64 }{
		{0, size, 0},
		{8 * page, 4*page + 1, 12 * page}, // one byte into page 12
		{10*page + 9, size - 11*page, 12 * page},
	} {
		err := registerRaw(t, a, c, sparse, r.off, r.length)
		if client.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("byte %d of range", r.first)) ||
			!strings.Contains(err.Error(), "MAP_POPULATE") {
			t.Fatalf("range [%d, +%d) with untouched pages: %v, want InvalidArgument naming byte %d and how to populate", r.off, r.length, err, r.first)
		}
	}
	if n := refusedCount(); n != 3 {
		t.Fatalf("untouched_pages refusals counted %v, want 3", n)
	}
	if h, err := shmem.FirstHole(sparse, 0, size); err != nil || h != 0 {
		t.Fatalf("the refusals touched the memory's pages (first untouched byte %d, %v)", h, err)
	}
	// The written pages alone register, raw.
	if err := registerRaw(t, a, c, sparse, 8*page+3, 4*page-3); err != nil {
		t.Fatalf("a range of written pages: %v", err)
	}
	// Through the client the whole memfd registers: it touched every page, changing no byte.
	r, err := c.RegisterHost(ctx, sparse, 0, size)
	if err != nil {
		t.Fatalf("the client registering memory with untouched pages: %v", err)
	}
	if h, err := shmem.FirstHole(sparse, 0, size); err != nil || h != size {
		t.Fatalf("after the client registered it, the memory's first untouched byte is %d (%v), want none", h, err)
	}
	got := make([]byte, size)
	if _, err := sparse.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	copy(want[8*page:], written)
	if !bytes.Equal(got, want) {
		t.Fatal("the client's populating changed the memory's bytes")
	}
	if _, err := c.Write(ctx, r, 8*page, client.ToRegion(r), 100*page, 4*page); err != nil {
		t.Fatal(err)
	}
	if _, err := sparse.ReadAt(got[:4*page], int64(100*page)); err != nil || !bytes.Equal(got[:4*page], written) {
		t.Fatalf("a copy within the registered memory: %v", err)
	}
	// The other client's regions were untouched and still move bytes.
	if _, err := other.Write(ctx, ors, 0, client.ToRegion(ord), 0, os1.Size()); err != nil || !bytes.Equal(os1.Bytes, od1.Bytes) {
		t.Fatalf("another client's transfer after the refusals: %v", err)
	}
}
