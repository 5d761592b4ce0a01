// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tracemark

import (
	"context"
	"runtime/trace"
	"strconv"
	"time"
)

// On reports whether marks are being logged (an execution trace is being written).
func On() bool { return trace.IsEnabled() }

// Mark logs one step in the execution trace under category while one is being written: the wall clock first,
// so the marks of two processes on one machine line up, then the step and two numbers (an index or id, a size).
// Nothing is built otherwise.
func Mark(category, step string, a, b uint64) {
	if !trace.IsEnabled() {
		return
	}
	buf := make([]byte, 0, 64)
	buf = strconv.AppendInt(buf, time.Now().UnixNano(), 10)
	buf = append(buf, ' ')
	buf = append(buf, step...)
	buf = append(buf, ' ')
	buf = strconv.AppendUint(buf, a, 10)
	buf = append(buf, ' ')
	buf = strconv.AppendUint(buf, b, 10)
	trace.Log(context.Background(), category, string(buf))
}
