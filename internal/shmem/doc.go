// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package shmem finds and fills the holes of shared memory (memfd) ranges: pages nobody has touched yet. The
// kernel charges a shmem page to the memory cgroup of the process that first faults it in, so a hole the agent
// copies into or out of would be charged to the agent's memory limit instead of the caller's; the agent refuses
// ranges with holes and the clients fill them before registering.
package shmem
