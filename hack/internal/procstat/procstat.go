// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package procstat reads a process's numbers from /proc for the harnesses that watch the operator and agents
// (hack/scale, hack/soak).
package procstat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Status returns the numeric fields of /proc/PID/status by name: VmRSS and VmHWM in KiB, Threads, and so on
// (the first number of each line).
func Status(pid int) (map[string]int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, fmt.Errorf("reading the status of process %d: %w", pid, err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			out[k] = n
		}
	}
	return out, nil
}
