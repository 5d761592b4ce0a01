// Package poolmem is the memory a transfer pool lends to callers. The agent creates it once at start, registers
// it with every engine as slices are handed out, and callers map their slice through a file descriptor
// (AllocateFromPool on the sidecar socket). A KV cache placed in pool memory reaches every engine the pool's
// memory can reach without the pod changing its allocator.
//
// On CPU-only nodes the pool is host shared memory: one memfd, mapped once by the agent, carved into
// page-aligned slices ([NewHost]). GPU pools (VMM allocations created fabric-exportable and
// RDMA-registrable) plug in through the same [Allocator] interface.
package poolmem
