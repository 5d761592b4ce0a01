// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package main

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// A run reports each process's CPU over the measured seconds, and what the machine's cores had in all; a process
// that could not be read shows as such instead of being counted.
func TestProcessesReportCPUAgainstTheCores(t *testing.T) {
	ps := processesOf(options{apiserverPID: 11, operatorPID: 12})
	if len(ps) != 3 || ps[0].name != "kube-apiserver" || ps[1].name != "operator" || ps[2].name != "harness" || ps[2].pid != os.Getpid() {
		t.Fatalf("processes without etcd's PID: %+v", ps)
	}
	got := ps.report([]float64{1, 2, 0.5}, []float64{16, math.NaN(), 2.5}, 10*time.Second)
	for _, want := range []string{"kube-apiserver 15.00 s (150 % of a core)", "operator NaN s", "harness 2.00 s (20 % of a core)",
		"together 17.00 s of the"} {
		if !strings.Contains(got, want) {
			t.Errorf("report %q lacks %q", got, want)
		}
	}
	if cpu := processesOf(options{}).cpu(); len(cpu) != 1 || math.IsNaN(cpu[0]) || cpu[0] < 0 {
		t.Fatalf("this process's CPU time: %v", cpu)
	}
}
