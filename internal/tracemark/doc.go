// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package tracemark logs the steps of a transfer in Go's execution trace (agent standalone --trace), stamped
// with the wall clock so that two agents' traces on one machine line up (hack/trace-tcp.py). A mark costs one
// check while no trace is written.
package tracemark
