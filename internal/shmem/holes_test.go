// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package shmem_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fabricxfer/fabricxfer/internal/shmem"
)

func memfd(t *testing.T, size int64) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("holes", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "holes")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f
}

func firstHole(t *testing.T, f *os.File, off, length uint64) uint64 {
	t.Helper()
	h, err := shmem.FirstHole(f, off, length)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// Holes are found inside the range asked about only, the passed descriptor's offset stays where its owner left
// it, and populating fills them without changing a byte that was there.
func TestHolesAreFoundAndFilledWithoutChangingBytes(t *testing.T) {
	page := uint64(os.Getpagesize())
	f := memfd(t, int64(16*page))
	if h := firstHole(t, f, 0, 16*page); h != 0 {
		t.Fatalf("fresh memfd: first hole at %d, want 0", h)
	}
	// Pages 2..5 written, page 7 set aside by fallocate only (untouched: a hole to the kernel).
	data := bytes.Repeat([]byte{0xA5}, int(4*page))
	if _, err := f.WriteAt(data, int64(2*page)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, int64(7*page), int64(page)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(123, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ off, length, want uint64 }{
		{2 * page, 4 * page, 6 * page},       // all written: no hole (off+length)
		{2*page + 7, 3*page + 1, 5*page + 8}, // unaligned, inside written pages
		{3 * page, 4 * page, 6 * page},       // runs into page 6
		{5 * page, 3 * page, 6 * page},
		{7 * page, page, 7 * page}, // fallocated, untouched
		{page, 0, page},            // empty range
	} {
		if h := firstHole(t, f, c.off, c.length); h != c.want {
			t.Errorf("first hole of [%d, +%d) at %d, want %d", c.off, c.length, h, c.want)
		}
	}
	if pos, _ := f.Seek(0, 1); pos != 123 {
		t.Fatalf("looking for holes moved the descriptor's offset to %d", pos)
	}
	left, err := shmem.Populate(t.Context(), f, page+5, 10*page)
	if err != nil || left != 11*page+5 {
		t.Fatalf("Populate: first hole left %d, %v; want none (%d)", left, err, 11*page+5)
	}
	if h := firstHole(t, f, page, 11*page); h != 12*page {
		t.Fatalf("populated range has a hole at %d", h)
	}
	if h := firstHole(t, f, 0, 16*page); h != 0 {
		t.Fatalf("page 0, outside the populated range, was filled (first hole %d)", h)
	}
	got := make([]byte, 16*page)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 16*page)
	copy(want[2*page:], data)
	if !bytes.Equal(got, want) {
		t.Fatal("populating changed the memory's bytes")
	}
	// A range past the end populates what there is and reports the rest; nothing fails.
	if left, err := shmem.Populate(t.Context(), f, 14*page, 4*page); err != nil || left != 16*page {
		t.Fatalf("range past the end: left %d, %v; want %d (the end)", left, err, 16*page)
	}
}

// What is not shared memory is neither reopened nor filled: a FIFO without a writer would block the reopen for
// good, and filling a sparse disk file would read all of it in. Both are refused at once.
func TestFilesThatAreNotSharedMemoryAreLeftAlone(t *testing.T) {
	dir := t.TempDir()
	fifo := dir + "/fifo"
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	pipe := os.NewFile(uintptr(fd), fifo)
	defer pipe.Close()
	disk, err := os.Create(dir + "/sparse")
	if err != nil {
		t.Fatal(err)
	}
	defer disk.Close()
	if err := disk.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	files := []*os.File{pipe, disk}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(disk.Fd()), &fs); err != nil || fs.Type == unix.TMPFS_MAGIC {
		t.Logf("the test's directory is on tmpfs (%v): no disk file to try", err)
		files = files[:1]
	}
	for _, f := range files {
		done := make(chan error, 2)
		go func() {
			_, err := shmem.FirstHole(f, 0, 4096)
			done <- err
			_, err = shmem.Populate(t.Context(), f, 0, 1<<30)
			done <- err
		}()
		for range 2 {
			select {
			case err := <-done:
				if !errors.Is(err, shmem.ErrNotShmem) {
					t.Fatalf("%s: %v, want ErrNotShmem", f.Name(), err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: still looking after 5 s", f.Name())
			}
		}
	}
	if data, err := unix.Seek(int(disk.Fd()), 0, unix.SEEK_DATA); len(files) > 1 && err == nil {
		t.Fatalf("the sparse disk file was filled (data at %d)", data)
	}
}

// A caller's deadline bounds the touching of a large range: Populate stops between chunks with the context's
// error, leaving the rest untouched.
func TestPopulateEndsWithItsContext(t *testing.T) {
	const size = 512 << 20
	f := memfd(t, size)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := shmem.Populate(ctx, f, 0, size); !errors.Is(err, context.Canceled) {
		t.Fatalf("Populate with a cancelled context: %v, want context.Canceled", err)
	}
	if h := firstHole(t, f, 0, size); h != 0 {
		t.Fatalf("a cancelled Populate touched pages (first hole %d)", h)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := shmem.Populate(ctx, f, 0, size)
	if took := time.Since(start); err != nil && !errors.Is(err, context.DeadlineExceeded) || took > 2*time.Second {
		t.Fatalf("Populate under a 5 ms deadline: %v after %v", err, took)
	}
}
