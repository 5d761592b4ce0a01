// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package nvml

import "testing"

// TestOpenFailsCleanlyOrWorks runs on any machine: without a driver (or without cgo) Open must fail with a
// reason; with one, the answers must be consistent.
func TestOpenFailsCleanlyOrWorks(t *testing.T) {
	lib, release, err := Open()
	if err != nil {
		if err.Error() == "" {
			t.Fatal("Open failed without a reason")
		}
		t.Skipf("no NVML here: %v", err)
	}
	defer release()
	n, err := lib.DeviceCount()
	if err != nil {
		t.Fatalf("device count: %v", err)
	}
	for i := 0; i < n; i++ {
		if id, err := lib.PCIBusID(i); err != nil || id == "" {
			t.Errorf("device %d PCI bus id %q: %v", i, id, err)
		}
	}
}
