// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Package poolmem is the memory a transfer pool lends to callers. The agent creates it at start, registers
// each slice with every engine as it is handed out, and callers map their slice through a file descriptor
// (AllocateFromPool on the sidecar socket). A KV cache placed in pool memory reaches every engine the pool's
// memory can reach without the pod changing its allocator.
//
// The descriptor a caller receives reaches only memory lent to that caller. On CPU-only nodes the pool is host
// shared memory ([NewHost]): every slice is its own memfd of exactly the slice's size, sealed against
// resizing and mapped by the agent; the pool's size is a budget of lent bytes. On NVIDIA nodes it is device
// memory ([NewGPU]): each GPU's share is split into slabs, each its own VMM allocation created with the POSIX
// fd handle type and, where the driver allows, the fabric handle type (without an IMEX channel the driver
// refuses it; the pool then lends fd-only memory and keeps the reason), mapped in the agent and carved into
// 64 KiB-aligned slices. A slab is lent to one owner (caller identity) at a time, so a borrower that imports
// its slab's fd and maps the whole slab sees only its own slices. Freed GPU slices are zeroed before they are
// lent again; a freed host slice's pages are released and its memfd closed.
package poolmem
