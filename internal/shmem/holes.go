// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package shmem

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// FirstHole returns the offset of the first byte of [off, off+length) of memfd f that lies in a page nobody has
// touched (a hole), or off+length when there is none. It seeks a descriptor of its own, so f's file offset,
// which the process that passed f shares, does not move. Pages set aside by fallocate without being touched
// count as holes (the kernel reports them so), as do pages of a range punched out.
func FirstHole(f *os.File, off, length uint64) (uint64, error) {
	end := off + length
	if length == 0 {
		return end, nil
	}
	own, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening the memory again to look for holes: %w", err)
	}
	defer unix.Close(own)
	hole, err := unix.Seek(own, int64(off), unix.SEEK_HOLE)
	if err != nil {
		return 0, fmt.Errorf("looking for holes from byte %d: %w", off, err)
	}
	return min(uint64(hole), end), nil
}

// Populate touches every hole of [off, off+length) of memfd f by reading it, so that its pages are allocated now
// and charged to the calling process. Bytes already there do not change; a range past f's end is left to the
// agent's refusal. It returns the first hole left, off+length when none is (a memory limit the caller reached
// leaves some).
func Populate(f *os.File, off, length uint64) (uint64, error) {
	end := off + length
	hole, err := FirstHole(f, off, length)
	if err != nil || hole >= end {
		return hole, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("sizing the memory to populate: %w", err)
	}
	end = min(end, uint64(st.Size))
	page := uint64(os.Getpagesize())
	start := hole / page * page
	if start >= end {
		return hole, nil
	}
	m, err := unix.Mmap(int(f.Fd()), int64(start), int(end-start), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return 0, fmt.Errorf("mapping the memory to populate it: %w", err)
	}
	if err := unix.Munmap(m); err != nil {
		return 0, fmt.Errorf("unmapping the populated memory: %w", err)
	}
	return FirstHole(f, off, length)
}
