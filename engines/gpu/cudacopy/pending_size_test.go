// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package cudacopy

import (
	"testing"
	"unsafe"
)

// TestPendingStaysInItsSizeClass: every submission allocates one Pending, on the 12 µs copy path; fields
// added (or padding, from how shared parts are laid out) must not push it into a larger allocation class.
func TestPendingStaysInItsSizeClass(t *testing.T) {
	if n := unsafe.Sizeof(Pending{}); n > 192 {
		t.Errorf("a Pending is %d bytes, over the 192-byte size class it had", n)
	}
}
