// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package regiontable keeps the memory callers registered with the agent: regions (host memory by memfd, GPU
// memory by VMM fd, IPC or fabric handle, and pool slices), the numbered-block layouts over them, the names both
// are published under, and each caller's usage against its limits.
//
// Published names live in the namespace of the caller that published them; a caller of another namespace sees
// one only when its owner granted that namespace, and an ungranted name looks exactly like a missing one.
// Another caller's region or layout looks exactly like a missing one too.
//
// The table's lock is the agent server's one lock (see Table): the server's sessions and the transfers over the
// table live under it too, so transfers read regions and layouts and charge usage in one critical section.
package regiontable
