// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fdtest leaves a test process without descriptors, as a hostile peer that holds connections open
// does, so that its accept loops meet EMFILE.
package fdtest

import (
	"os"
	"syscall"
	"testing"
)

// Exhaust lowers the process's descriptor limit to its lowest free descriptor (the kernel hands out the lowest
// free number, so the first open after it fails with EMFILE) and returns restore, which the caller calls once
// the exhaustion was seen; the test's cleanup restores it too. The test must not run in parallel with others
// of its package.
func Exhaust(t *testing.T) (restore func()) {
	t.Helper()
	var limit syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	saved := limit
	restore = func() {
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &saved); err != nil {
			t.Errorf("restoring the descriptor limit: %v", err)
		}
	}
	t.Cleanup(restore)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	lowest := f.Fd()
	f.Close()
	limit.Cur = uint64(lowest)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &limit); err != nil {
		t.Fatal(err)
	}
	return restore
}
