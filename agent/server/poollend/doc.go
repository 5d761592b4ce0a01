// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package poollend lends the pool's memory (agent/poolmem) to callers: AllocateFromPool takes a slice of the
// pool for the caller (host memory, or GPU memory on the GPU it names), registers it as a region of its session
// and hands the descriptor over through the fd socket; Release, or the end of the session, deregisters it once
// its transfers settled and gives it back to the pool.
package poollend
