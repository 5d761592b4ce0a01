// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tracemark

import (
	"bytes"
	"regexp"
	"runtime/trace"
	"strconv"
	"testing"
	"time"
)

// TestMarkInTrace: while a trace is written a mark carries the wall clock, the step and its two numbers; without
// one, a mark allocates nothing.
func TestMarkInTrace(t *testing.T) {
	if On() {
		t.Fatal("marks on before any trace started")
	}
	if allocs := testing.AllocsPerRun(100, func() { Mark("tcp", "staged.start", 8, 15360) }); allocs != 0 {
		t.Fatalf("a mark without a trace allocates %v times", allocs)
	}
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	before := time.Now().UnixNano()
	if !On() {
		trace.Stop()
		t.Fatal("marks off while a trace is written")
	}
	Mark("tcp", "staged.start", 8, 15360)
	after := time.Now().UnixNano()
	trace.Stop()
	m := regexp.MustCompile(`(\d{19}) staged\.start 8 15360`).FindSubmatch(buf.Bytes())
	if m == nil {
		t.Fatal("the mark is not in the trace")
	}
	at, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil || at < before || at > after {
		t.Fatalf("the mark's clock %s is not the wall clock between %d and %d", m[1], before, after)
	}
}
