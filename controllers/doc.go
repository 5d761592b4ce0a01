// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package controllers holds the operator's reconcilers, one concern each: TransferPool (pool status from what
// agents report), PoolAgents (each pool's agent DaemonSet, its ServiceAccount and RBAC, and their cleanup),
// PoolCert (each pool's CA and trust bundle), NodeCert (each agent's certificate request) and VPodTopology
// (scale-up domains aggregated from TransferNode reports). The three pool controllers write one condition
// each beside the others' (poolwrite.go). When an agent counts as alive is package heartbeat's rule, shared
// with xferctl. Desired objects are built by pure functions in builders.go and status by pure functions in
// status.go and vpod.go, so both are unit-tested without a cluster.
package controllers
