package poolmem

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

func TestHostPoolLendsSharedPageAlignedSlices(t *testing.T) {
	p, err := NewHost("test-pool", 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a, err := p.Allocate(5000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Allocate(4096)
	if err != nil {
		t.Fatal(err)
	}
	page := uint64(os.Getpagesize())
	if a.Offset%page != 0 || b.Offset%page != 0 || a.Offset == b.Offset {
		t.Fatalf("offsets %d and %d: want distinct page-aligned offsets", a.Offset, b.Offset)
	}
	if len(a.View) != 5000 {
		t.Fatalf("view is %d bytes, want 5000", len(a.View))
	}
	// A caller mapping the fd sees the agent's bytes: the memory is shared, not copied.
	m, err := syscall.Mmap(int(b.File.Fd()), int64(b.Offset), int(b.Length), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	m[100] = 0xab
	if b.View[100] != 0xab {
		t.Fatal("a write through the caller's mapping is not visible in the agent's view")
	}
	if err := p.Free(b.ID); err != nil {
		t.Fatal(err)
	}
	if m[100] != 0 {
		t.Fatal("freed slice was not zeroed")
	}
	if err := p.Free(b.ID); err == nil {
		t.Fatal("double free accepted")
	}
}

func TestHostPoolExhaustionAndReuse(t *testing.T) {
	page := uint64(os.Getpagesize())
	p, err := NewHost("test-pool", 4*page)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var ids []string
	for range 4 {
		s, err := p.Allocate(page)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	if _, err := p.Allocate(1); !errors.Is(err, ErrExhausted) {
		t.Fatalf("allocation from a full pool: %v, want ErrExhausted", err)
	}
	// Free two neighbours: they coalesce into one range big enough for two pages.
	if err := p.Free(ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(ids[2]); err != nil {
		t.Fatal(err)
	}
	if total, free := p.Usage(); total != 4*page || free != 2*page {
		t.Fatalf("usage %d/%d, want %d/%d", free, total, 2*page, 4*page)
	}
	if _, err := p.Allocate(2 * page); err != nil {
		t.Fatalf("two-page allocation after coalescing: %v", err)
	}
}
