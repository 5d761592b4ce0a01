// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package controllers holds the operator's reconcilers: TransferPool (agent DaemonSet, its ServiceAccount and
// RBAC, and pool status from what agents report) and VPodTopology (scale-up domains aggregated from
// TransferNode reports). Desired objects are built by pure functions in builders.go and status by pure
// functions in status.go and vpod.go, so both are unit-tested without a cluster.
package controllers
