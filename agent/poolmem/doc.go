// Package poolmem is the memory a transfer pool lends to callers. The agent creates it once at start, registers
// each slice with every engine as it is handed out, and callers map their slice through a file descriptor
// (AllocateFromPool on the sidecar socket). A KV cache placed in pool memory reaches every engine the pool's
// memory can reach without the pod changing its allocator.
//
// On CPU-only nodes the pool is host shared memory: one memfd, mapped once by the agent, carved into
// page-aligned slices ([NewHost]). On NVIDIA nodes it is device memory ([NewGPU]): one VMM allocation per GPU,
// created with the POSIX fd handle type and, where the driver allows, the fabric handle type (without an IMEX
// channel the driver refuses it; the pool then lends fd-only memory and keeps the reason), mapped in the agent
// and carved into 64 KiB-aligned slices. A borrower imports the allocation's fd, maps the whole allocation and
// uses its slice's range. Freed slices are zeroed before they are lent again.
package poolmem
