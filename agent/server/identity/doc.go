// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package identity says who is behind a connection to the agent's sockets and whether the pool admits it:
// SO_PEERCRED gives the process, /proc/<pid>/cgroup its pod UID (only in the kubelet's own cgroup layouts; the
// peer's pidfd then says the process that connected still runs, so the pid was not another's: IdentifyConn),
// the API server the pod's namespace and name (APIPodResolver), and the TransferPool's allowedNamespaces
// whether that namespace may use the pool (APIPoolPolicy, StaticPolicy, NamespaceAllowed).
//
// A Caller's Key is what the agent server keys regions, grants and limits by: every connection of one pod
// shares it.
package identity
