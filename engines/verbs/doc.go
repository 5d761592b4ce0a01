// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package verbs is the RDMA side of the rdma engine: the data types the
// engine and its providers share (connection info, work requests,
// completions and their statuses, queue-pair states) and a binding of
// libibverbs loaded at run time with dlopen (no cgo), so one agent binary
// runs on nodes with and without RDMA NICs. The in-process provider for tests,
// package rdma/fakeverbs, lives beside the rdma engine whose Provider it fakes.
package verbs
