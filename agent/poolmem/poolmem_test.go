// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package poolmem

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func fstat(t *testing.T, fd int) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// mappedMemfds counts this process's mappings of memfds named name.
func mappedMemfds(t *testing.T, name string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), " /memfd:"+name+" (deleted)\n")
}

func TestHostPoolLendsEachSliceItsOwnMemfd(t *testing.T) {
	p, err := NewHost("lend-test", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := p.Allocate("pod/a", 5000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Allocate("pod/b", 4096)
	if err != nil {
		t.Fatal(err)
	}
	// Each fd is exactly its slice: nothing of another slice is reachable through it.
	sa, sb := fstat(t, int(a.File.Fd())), fstat(t, int(b.File.Fd()))
	if sa.Size != 5000 || sb.Size != 4096 || sa.Ino == sb.Ino {
		t.Fatalf("fd sizes %d and %d (inodes %d, %d): want 5000 and 4096, distinct files", sa.Size, sb.Size, sa.Ino, sb.Ino)
	}
	if a.Offset != 0 || b.Offset != 0 || len(a.View) != 5000 || len(b.View) != 4096 {
		t.Fatalf("slices [%d,+%d) view %d and [%d,+%d) view %d", a.Offset, a.Length, len(a.View), b.Offset, b.Length, len(b.View))
	}
	// A borrower cannot resize its memfd under the agent's mapping.
	for _, size := range []int64{0, 1 << 30} {
		if err := unix.Ftruncate(int(b.File.Fd()), size); !errors.Is(err, unix.EPERM) {
			t.Errorf("resizing a lent memfd to %d: %v, want EPERM (sealed)", size, err)
		}
	}
	// The borrower's mapping (through its own descriptor) is the agent's memory, not a copy.
	dup, err := unix.Dup(int(b.File.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	m, err := unix.Mmap(dup, 0, int(b.Length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	m[100] = 0xab
	if b.View[100] != 0xab || a.View[100] != 0 {
		t.Fatal("a write through the borrower's mapping did not land in its own slice only")
	}
	if st := fstat(t, dup); st.Blocks == 0 {
		t.Fatal("a written page is not committed")
	}
	if mappedMemfds(t, "lend-test-"+b.ID) != 2 {
		t.Fatalf("want the agent's and the borrower's mapping of %s", b.ID)
	}
	if err := p.Free(b.ID); err != nil {
		t.Fatal(err)
	}
	// Freed: the pages are released even though the borrower still maps them, it reads zeros, and the agent
	// holds neither a mapping nor a descriptor of the slice.
	if st := fstat(t, dup); st.Blocks != 0 {
		t.Errorf("freed slice still holds %d blocks", st.Blocks)
	}
	if m[100] != 0 {
		t.Error("the borrower still sees its bytes after Free")
	}
	if n := mappedMemfds(t, "lend-test-"+b.ID); n != 1 {
		t.Errorf("%d mappings of the freed slice, want only the borrower's", n)
	}
	if n := openMemfds("lend-test-" + b.ID); n != 1 {
		t.Errorf("%d descriptors of the freed slice open, want only the borrower's", n)
	}
	if err := p.Free(b.ID); err == nil {
		t.Fatal("double free accepted")
	}
	if a.View[0] = 1; a.View[0] != 1 {
		t.Fatal("the other slice is unusable")
	}
}

func TestHostPoolBudget(t *testing.T) {
	page := uint64(os.Getpagesize())
	p, err := NewHost("budget-test", 4*page-1)
	if err != nil {
		t.Fatal(err)
	}
	if total, free := p.Usage(); total != 4*page || free != 4*page {
		t.Fatalf("usage %d/%d, want the budget rounded up to 4 pages", free, total)
	}
	if _, err := p.Allocate("pod/a", 4*page+1); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "pool holds") {
		t.Fatalf("a request larger than the pool: %v", err)
	}
	var ids []string
	for i := range 4 {
		// One byte is charged a whole page: that is what it costs.
		s, err := p.Allocate("pod/a", page-uint64(i))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if _, err := p.Allocate("pod/b", 1); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "0 of") {
		t.Fatalf("allocation from a full pool: %v, want ErrExhausted", err)
	}
	if err := p.Free(ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(ids[3]); err != nil {
		t.Fatal(err)
	}
	if total, free := p.Usage(); total != 4*page || free != 2*page {
		t.Fatalf("usage %d/%d, want %d/%d", free, total, 2*page, 4*page)
	}
	// No fragmentation: slices are separate files.
	if _, err := p.Allocate("pod/b", 2*page); err != nil {
		t.Fatalf("two-page allocation after freeing two separate pages: %v", err)
	}
	if n := mappedMemfds(t, "budget-test-host-5"); n != 1 {
		t.Fatalf("%d agent mappings of the new slice", n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{ids[0], ids[2], "host-5"} {
		if mappedMemfds(t, "budget-test-"+id) != 0 || openMemfds("budget-test-"+id) != 0 {
			t.Errorf("slice %s still mapped or open after Close", id)
		}
	}
	if _, err := p.Allocate("pod/a", 1); err == nil {
		t.Fatal("allocation from a closed pool accepted")
	}
}

// Sizes near 2^64 must be refused, not wrapped to a tiny pool by rounding.
func TestPoolSizesNear2To64AreRefused(t *testing.T) {
	if _, err := NewHost("huge", math.MaxUint64-10); err == nil {
		t.Error("a host pool of 2^64-11 bytes was accepted")
	}
	drv := newFake("0000:1b:00.0")
	if _, err := NewGPU(drv, []GPUTarget{{Index: 0}}, math.MaxUint64-10); err == nil {
		t.Error("a GPU pool of 2^64-11 bytes per GPU was accepted")
	}
	if len(drv.handles) != 0 {
		t.Errorf("%d allocations left after a refused pool", len(drv.handles))
	}
}
