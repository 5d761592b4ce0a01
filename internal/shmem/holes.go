// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package shmem

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrNotShmem marks a file that is not ordinary shared memory (a regular file of tmpfs, as memfds are): holes
// are neither looked for nor filled in it, since reopening it could block (a FIFO) and filling it could read a
// whole sparse disk file in.
var ErrNotShmem = errors.New("not shared memory")

// checkShmem says whether f is a regular file of tmpfs, and returns its size.
func checkShmem(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("inspecting the memory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("%w: file type %#o", ErrNotShmem, st.Mode&unix.S_IFMT)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return 0, fmt.Errorf("inspecting the memory's file system: %w", err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		return 0, fmt.Errorf("%w: file system type %#x", ErrNotShmem, fs.Type)
	}
	return uint64(st.Size), nil
}

// FirstHole returns the offset of the first byte of [off, off+length) of memfd f that lies in a page nobody has
// touched (a hole), or off+length when there is none. It seeks a descriptor of its own, so f's file offset,
// which the process that passed f shares, does not move. Pages set aside by fallocate without being touched
// count as holes (the kernel reports them so), as do pages of a range punched out. The kernel's search runs
// from off to the first hole or the end of the file, however short the range.
func FirstHole(f *os.File, off, length uint64) (uint64, error) {
	if length == 0 {
		return off, nil
	}
	if _, err := checkShmem(f); err != nil {
		return 0, err
	}
	return firstHole(f, off, length)
}

// firstHole is FirstHole of a file checkShmem passed.
func firstHole(f *os.File, off, length uint64) (uint64, error) {
	end := off + length
	own, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return 0, fmt.Errorf("opening the memory again to look for holes (leave its mode as memfd_create made it): %w", err)
	}
	defer unix.Close(own)
	hole, err := unix.Seek(own, int64(off), unix.SEEK_HOLE)
	if err != nil {
		return 0, fmt.Errorf("looking for holes from byte %d: %w", off, err)
	}
	return min(uint64(hole), end), nil
}

// populateChunk is how much Populate maps at a time, so that a caller's deadline is looked at every few tens
// of milliseconds however large the range.
const populateChunk = 64 << 20

// Populate touches every hole of [off, off+length) of memfd f by loading from it through a mapping, so that its
// pages are allocated now and charged to the calling process. Bytes already there do not change; a range past
// f's end is left to the agent's refusal, and so is a file that is not shared memory (ErrNotShmem). It stops at
// ctx's end between chunks of the range (ctx's error, wrapped). It returns the first hole left, off+length when
// none is (a memory limit the caller reached leaves some).
func Populate(ctx context.Context, f *os.File, off, length uint64) (uint64, error) {
	end := off + length
	if length == 0 {
		return end, nil
	}
	size, err := checkShmem(f)
	if err != nil {
		return 0, err
	}
	hole, err := firstHole(f, off, length)
	if err != nil {
		hole = off // cannot look (a memfd whose mode shuts this process out): touch the whole range
	}
	if hole >= end {
		return hole, nil
	}
	page := uint64(os.Getpagesize())
	stop := min(end, size)
	for at := hole / page * page; at < stop; at += populateChunk {
		if err := ctx.Err(); err != nil {
			return 0, fmt.Errorf("touching the memory's untouched pages (%d of %d bytes from byte %d left): %w", stop-at, stop-hole, hole, err)
		}
		n := min(stop-at, populateChunk)
		m, err := unix.Mmap(int(f.Fd()), int64(at), int(n), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return 0, fmt.Errorf("mapping the memory to populate it: %w", err)
		}
		if err := unix.Munmap(m); err != nil {
			return 0, fmt.Errorf("unmapping the populated memory: %w", err)
		}
	}
	return firstHole(f, off, length)
}
