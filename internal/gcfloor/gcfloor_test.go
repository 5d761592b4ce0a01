// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gcfloor

import (
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
)

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// residentBytes reads the process's resident set from /proc (Linux).
func residentBytes(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm to read the resident set from: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		t.Fatalf("statm %q: %v", b, err)
	}
	return pages * uint64(os.Getpagesize())
}

// A floor of 256 MiB raises the heap goal past 512 MiB and the resident set by far less than its size; once
// released, the goal falls back after a collection.
func TestFloorRaisesTheGoalNotTheResidentSet(t *testing.T) {
	const n = 256 << 20
	runtime.GC()
	before, rssBefore := heapGoal(), residentBytes(t)
	if before >= 2*n {
		t.Fatalf("the heap goal is already %d bytes: the test needs a smaller heap", before)
	}
	f := Hold(n)
	runtime.GC()
	goal, rss := heapGoal(), residentBytes(t)
	t.Logf("heap goal %d -> %d bytes, resident set %d -> %d bytes", before, goal, rssBefore, rss)
	if goal < 2*n {
		t.Fatalf("heap goal %d bytes with a floor of %d, want at least %d", goal, n, 2*n)
	}
	if rss > rssBefore+n/8 {
		t.Fatalf("the resident set grew by %d bytes for a floor of %d: its pages were touched", rss-rssBefore, n)
	}
	if f.Bytes() != n {
		t.Fatalf("Bytes() = %d, want %d", f.Bytes(), n)
	}
	f.Release()
	runtime.GC()
	if after := heapGoal(); after >= 2*n {
		t.Fatalf("heap goal %d bytes after the floor was released, want below %d", after, 2*n)
	}
}

func TestZeroHoldsNothing(t *testing.T) {
	f := Hold(0)
	if f != nil || f.Bytes() != 0 {
		t.Fatalf("Hold(0) = %v", f)
	}
	f.Release() // a nil floor releases nothing, without panicking
}
