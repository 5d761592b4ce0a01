// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package procstat

import (
	"os"
	"testing"
)

func TestStatusOfThisProcess(t *testing.T) {
	st, err := Status(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st["VmRSS"] <= 0 || st["Threads"] <= 0 || st["VmHWM"] < st["VmRSS"] {
		t.Errorf("implausible status: VmRSS %d KiB, VmHWM %d KiB, Threads %d", st["VmRSS"], st["VmHWM"], st["Threads"])
	}
	if _, err := Status(-1); err == nil {
		t.Error("a process that does not exist must be an error")
	}
}
