// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

package fastwire

import "syscall"

// MaxIDArena bounds a fast connection's id arena: 65,536 int64 ids a side (the most one transfer names) is
// 1 MiB, and the agent maps at most 8 connections' arenas per caller.
const MaxIDArena = 4 << 20

// IDArena is a fast connection's mapping of its caller's id arena.
type IDArena struct {
	mapping []byte // the whole mapping, to unmap
	ids     []byte // the arena's bytes
}

// IDs are the arena's bytes (nil until the caller set an arena).
func (a *IDArena) IDs() []byte { return a.ids }

// Replace makes mapping (whose bytes ids are) the arena, unmapping the one it had.
func (a *IDArena) Replace(mapping, ids []byte) {
	a.Unmap()
	a.mapping, a.ids = mapping, ids
}

// Unmap unmaps the arena (the connection ended, or the caller set another).
func (a *IDArena) Unmap() {
	if a.mapping != nil {
		_ = syscall.Munmap(a.mapping)
		a.mapping, a.ids = nil, nil
	}
}
