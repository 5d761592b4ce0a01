// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package fakeverbs is an in-process RDMA network for tests: devices,
// memory registrations with keys and bounds, reliable-connected queue pairs
// with the verbs state machine (RESET → INIT → RTR → RTS, ERR on failure),
// one-sided writes and reads executed as memory copies, and the failures a
// real fabric produces (remote access errors, a lost peer's retry-exceeded,
// flushes), so the rdma engine's planning, connection handling and error
// mapping run in CI where there is no NIC.
package fakeverbs
