// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package gcfloor

import "runtime"

// Default is the agent's floor (its --gc-heap-floor): 64 MiB between collections, about 16,000 waited 4 KiB
// calls on the fast socket. Up to this much more memory is in use between two collections than without it,
// which whoever watches the agent's memory for leaks must allow.
const Default = 64 << 20

// Floor holds the allocation; nil holds none.
type Floor struct {
	ballast []byte
}

// Hold allocates n bytes that raise the collector's heap goal to at least about 2n (with GOGC=100): between
// two collections the process may then allocate about n bytes more than before. The pages are never written,
// so they add no resident memory. n of 0 holds nothing.
func Hold(n uint64) *Floor {
	if n == 0 {
		return nil
	}
	return &Floor{ballast: make([]byte, n)}
}

// Release lets the collector reclaim the allocation at its next collection.
func (f *Floor) Release() {
	if f == nil {
		return
	}
	runtime.KeepAlive(f.ballast)
	f.ballast = nil
}

// Bytes is the size held (0 for nil).
func (f *Floor) Bytes() uint64 {
	if f == nil {
		return 0
	}
	return uint64(len(f.ballast))
}
