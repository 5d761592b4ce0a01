// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package gcfloor keeps the Go collector from running every few megabytes of allocation in a process whose
// live heap is small.
//
// The collector's heap goal is twice the live heap (GOGC=100), with a floor of 4 MiB. The agent's live heap is
// a few megabytes, and a waited call on its fast socket allocates a few kilobytes, so a busy caller set off a
// collection about every thousand calls; each one's mark phase (about a millisecond) and stop-the-world pauses
// (tens of microseconds on a GPU host of 16 cores) landed on the calls in flight and made the slowest of them.
// A Floor is a pointer-free allocation the collector counts as live but never scans, and the process never
// touches, so the goal stays above twice its size while the memory it takes stays virtual.
package gcfloor
