# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""What PyTorch's CUDA caching allocator says about a tensor's memory, read from
``tensor.untyped_storage()._share_cuda_()``, and how that becomes a RegisterMemoryRequest.

The share tuple (torch/csrc/StorageSharing.cpp, ``THPStorage_shareCuda``) has 8 items:

    (device, handle, storage_size_bytes, storage_offset_bytes, ref_counter_handle, ref_counter_offset,
     event_handle, event_sync_required)

``handle`` is the allocator's shareable handle (c10/cuda/CUDACachingAllocator.cpp, ``shareIpcHandle``):

    [version byte][type byte][payload]

- type ``c`` (a cudaMalloc segment): the payload is the 64-byte ``cudaIpcMemHandle_t`` of the whole segment;
  ``storage_offset_bytes`` is the storage's offset from the segment's base.
- type ``e`` (an expandable segment, ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``): the payload is
  ``ExpandableSegment::share``'s: a header ``{int32 pid; 4 bytes of padding; uint64 segment_size; uint64
  num_handles}`` (native byte order, 24 bytes), then one shareable handle per VMM allocation (each
  ``segment_size`` bytes, mapped back to back) that covers the storage: an ``int32`` POSIX file descriptor
  *in the sharing process* (pid), or a 64-byte ``CUmemFabricHandle`` where the allocator chose fabric handles
  (PyTorch 2.9+ tries fabric first). Nothing in the payload says which: the length does. ``storage_offset_bytes``
  is the storage's offset from the start of the first handle. A tensor spanning several handles is registered
  with all of them (their fds, in order), which the agent maps back to back as PyTorch did.

A handle of exactly 64 bytes is an unversioned ``cudaIpcMemHandle_t`` (PyTorch before 2.5).

Version 1 (PyTorch 2.5-2.8) and 2 (2.9-2.12) are read; version 3 (2.13) is read for ``c`` handles (same
payload) and refused for ``e`` handles, whose format changed.

Nothing here imports torch: parse_cuda_share works on any tuple of that shape, so it is tested without a GPU.
"""

import os
import struct
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

IPC_HANDLE_SIZE = 64
FABRIC_HANDLE_SIZE = 64
SHARE_HEADER = struct.Struct("=i4xQQ")  # pid, padding, segment_size, num_handles
TYPE_CUDA_MALLOC = ord("c")
TYPE_EXPANDABLE = ord("e")
# The versions whose payloads this module knows, per type.
KNOWN_VERSIONS = {TYPE_CUDA_MALLOC: (1, 2, 3), TYPE_EXPANDABLE: (1, 2)}

# The most VMM allocations the agent maps as one region (engines.MaxVMMAllocations).
MAX_ALLOCATIONS = 8192

KIND_IPC = "ipc"
KIND_VMM_FD = "vmm_fd"
KIND_FABRIC = "fabric"


@dataclass
class CudaShare:
    """One storage's memory as the caching allocator shares it.

    kind is KIND_IPC (one cudaIpcMemHandle_t of a cudaMalloc segment, in ipc_handle) or, for an expandable
    segment, KIND_VMM_FD (handles are POSIX fds of pid) or KIND_FABRIC (handles are 64-byte fabric handles),
    each handle one VMM allocation of segment_size bytes. offset is where the storage starts: from the
    segment's base (ipc) or from the start of handles[0] (expandable)."""

    device: int
    version: int
    kind: str
    offset: int
    storage_bytes: int
    ipc_handle: bytes = b""
    pid: int = 0
    segment_size: int = 0
    handles: List = field(default_factory=list)

    def span(self, start: int, length: int) -> Tuple[int, int, int]:
        """For an expandable segment: the handles that hold [start, start+length) of the shared range (start
        counts from handles[0]) as (first, count, offset): handles[first:first+count], and the range's offset
        from the start of handles[first]. Raises ValueError when the range lies past the shared handles or spans
        more than MAX_ALLOCATIONS of them (the agent's bound)."""
        if self.kind == KIND_IPC:
            raise ValueError("span is for expandable segments; a cudaMalloc segment is one IPC handle")
        if length <= 0:
            raise ValueError("length must be positive")
        first, last = start // self.segment_size, (start + length - 1) // self.segment_size
        if last >= len(self.handles):
            raise ValueError("bytes [%d, +%d) lie past the %d shared handles of %d bytes" % (
                start, length, len(self.handles), self.segment_size))
        count = last - first + 1
        if count > MAX_ALLOCATIONS:
            raise ValueError(
                "the tensor (%d bytes) spans %d VMM allocations of %d bytes in a PyTorch expandable segment; the "
                "agent maps at most %d as one region: register it in parts, or allocate it with "
                "expandable_segments:False" % (length, count, self.segment_size, MAX_ALLOCATIONS))
        return first, count, start - first * self.segment_size

    def locate(self, start: int, length: int) -> Tuple[int, int]:
        """For an expandable segment: the one handle that holds [start, start+length) and the range's offset
        inside it. Raises ValueError when the range spans more than one handle (fabric handles travel one per
        region: the agent maps several allocations only from POSIX fds)."""
        first, count, offset = self.span(start, length)
        if count != 1:
            raise ValueError(
                "the tensor (%d bytes) spans %d VMM allocations of %d bytes in a PyTorch expandable segment "
                "shared as fabric handles; the agent registers several allocations as one region only from POSIX "
                "fds. Allocate it with expandable_segments:False, or register a tensor of at most one allocation "
                "(see client/python/README.md, 'Expandable segments')" % (length, count, self.segment_size))
        return first, offset


def parse_cuda_share(share, own_pid: Optional[int] = None) -> CudaShare:
    """Reads the tuple ``UntypedStorage._share_cuda_()`` returns. Raises ValueError for a handle this client
    does not know (version, type or length) and TypeError for something that is not such a tuple."""
    if not isinstance(share, tuple) or len(share) < 4:
        raise TypeError("expected the tuple UntypedStorage._share_cuda_() returns (8 items), got %r" % (type(share),))
    device, handle, size_bytes, offset_bytes = share[0], share[1], share[2], share[3]
    if handle is None:
        raise ValueError("the storage has no memory (an empty tensor cannot be registered)")
    if not isinstance(handle, (bytes, bytearray)):
        raise TypeError("share tuple item 1 (the handle) is %s, want bytes" % type(handle).__name__)
    for name, v in (("device", device), ("storage size", size_bytes), ("storage offset", offset_bytes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise TypeError("share tuple %s is %r, want a non-negative int" % (name, v))
    handle = bytes(handle)
    if len(handle) == IPC_HANDLE_SIZE:  # before PyTorch versioned its handles
        return CudaShare(device=device, version=0, kind=KIND_IPC, offset=offset_bytes, storage_bytes=size_bytes,
                         ipc_handle=handle)
    if len(handle) < 2:
        raise ValueError("CUDA share handle of %d bytes is too short" % len(handle))
    version, kind, payload = handle[0], handle[1], handle[2:]
    if kind not in KNOWN_VERSIONS:
        raise ValueError("unknown CUDA share handle type %r (version %d): this client knows 'c' (cudaMalloc) and "
                         "'e' (expandable segments); upgrade fabricxfer or allocate the tensor with PyTorch's "
                         "default allocator" % (chr(kind), version))
    if version not in KNOWN_VERSIONS[kind]:
        raise ValueError("CUDA share handle version %d of type %r is not one this client reads (known: %s): "
                         "this PyTorch is newer than fabricxfer knows; upgrade fabricxfer%s" % (
                             version, chr(kind), ", ".join(map(str, KNOWN_VERSIONS[kind])),
                             " or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
                             if kind == TYPE_EXPANDABLE else ""))
    if kind == TYPE_CUDA_MALLOC:
        if len(payload) != IPC_HANDLE_SIZE:
            raise ValueError("cudaMalloc share handle carries %d bytes, want %d" % (len(payload), IPC_HANDLE_SIZE))
        return CudaShare(device=device, version=version, kind=KIND_IPC, offset=offset_bytes,
                         storage_bytes=size_bytes, ipc_handle=payload)

    if len(payload) < SHARE_HEADER.size:
        raise ValueError("expandable segment share of %d bytes is shorter than its %d-byte header" % (
            len(payload), SHARE_HEADER.size))
    pid, segment_size, n = SHARE_HEADER.unpack_from(payload)
    body = payload[SHARE_HEADER.size:]
    if segment_size == 0 or n == 0:
        raise ValueError("expandable segment share names %d handles of %d bytes" % (n, segment_size))
    if len(body) == 4 * n:
        handles = list(struct.unpack("=%di" % n, body))
        share_kind = KIND_VMM_FD
    elif len(body) == FABRIC_HANDLE_SIZE * n and version >= 2:
        handles = [body[i * FABRIC_HANDLE_SIZE:(i + 1) * FABRIC_HANDLE_SIZE] for i in range(n)]
        share_kind = KIND_FABRIC
    else:
        raise ValueError("expandable segment share (version %d) names %d handles but carries %d bytes of them: "
                         "neither POSIX fds (4 bytes each) nor fabric handles (64 bytes each)" % (
                             version, n, len(body)))
    if share_kind == KIND_VMM_FD and own_pid is not None and pid != own_pid:
        raise ValueError("the expandable segment was shared by pid %d, not this process (%d): register tensors "
                         "in the process that allocated them" % (pid, own_pid))
    if offset_bytes + size_bytes > segment_size * n:
        raise ValueError("storage [%d, +%d) lies outside its %d handles of %d bytes" % (
            offset_bytes, size_bytes, n, segment_size))
    return CudaShare(device=device, version=version, kind=share_kind, offset=offset_bytes, storage_bytes=size_bytes,
                     pid=pid, segment_size=segment_size, handles=handles)


def tensor_range(tensor) -> Tuple[int, int, int]:
    """Checks that tensor can be registered and returns (device index, byte offset inside its storage, length).
    Raises TypeError/ValueError saying what to do."""
    if not all(hasattr(tensor, a) for a in ("is_cuda", "untyped_storage", "storage_offset", "element_size")):
        raise TypeError("register_tensor takes a torch.Tensor, got %s" % type(tensor).__name__)
    if not tensor.is_cuda:
        raise ValueError("the tensor is on %s, not a CUDA device: register host memory with register_host "
                         "(e.g. fabricxfer.client.shared_memory), or move the tensor with .cuda()" % (tensor.device,))
    if not tensor.is_contiguous():
        raise ValueError("the tensor is a non-contiguous view (shape %s, stride %s): register its contiguous base "
                         "tensor, or a .contiguous() copy you keep" % (tuple(tensor.shape), tuple(tensor.stride())))
    esize = tensor.element_size()
    length = tensor.numel() * esize
    if length == 0:
        raise ValueError("the tensor is empty: nothing to register")
    return tensor.device.index, tensor.storage_offset() * esize, length


def dup_own_fd(pid: int, fd: int) -> int:
    """A duplicate of descriptor fd of process pid: os.dup when pid is this process (PyTorch shares its own fds),
    pidfd_getfd otherwise (Linux 5.6+, needs ptrace rights on pid)."""
    if pid == os.getpid():
        return os.dup(fd)
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        got = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd on x86-64 and arm64
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, "pidfd_getfd(pid %d, fd %d): %s" % (pid, fd, os.strerror(err)))
        return got
    finally:
        os.close(pidfd)
