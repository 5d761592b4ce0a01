// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package heartbeat is the rule that decides whether a node's agent is alive, shared by the operator (pool
// and vPOD status) and xferctl (the heartbeat column of `status`), so both read a node the same way without
// the CLI linking the operator's reconcilers.
//
// Agents heartbeat with a coordination.k8s.io Lease per (pool, node) in the pool's namespace, labelled with
// the pool and held by the node; the TransferNode is rewritten only when the report changes. A node's
// heartbeat is the later of its Lease's renewTime and its TransferNode's status.lastHeartbeat, so agents that
// predate Leases (status every period, no Lease) keep counting. A heartbeat is fresh for three periods of
// the pool's spec.agent.heartbeatSeconds, so one lost or late renewal does not flap the pool.
package heartbeat
