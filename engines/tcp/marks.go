// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package tcp

import "github.com/fabricxfer/fabricxfer/internal/tracemark"

// mark logs one step of a staged transfer (a chunk's index or request id, its bytes) while an execution trace is
// written; hack/trace-tcp.py reads them.
func mark(step string, a, b uint64) { tracemark.Mark("tcp", step, a, b) }

// traced reports whether marks are being logged.
func traced() bool { return tracemark.On() }
