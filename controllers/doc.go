// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package controllers holds the operator's reconcilers, one concern each: TransferPool (agent DaemonSet, its
// ServiceAccount and RBAC, and pool status from what agents report), PoolCert (each pool's CA and trust
// bundle), NodeCert (each agent's certificate request) and VPodTopology (scale-up domains aggregated from
// TransferNode reports). When an agent counts as alive is package heartbeat's rule, shared with xferctl. Desired objects are built by pure functions in builders.go and status by pure
// functions in status.go and vpod.go, so both are unit-tested without a cluster.
package controllers
