# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""register_tensor without a GPU or torch: synthetic _share_cuda_() tuples and stand-in tensors."""

import os
import struct
import unittest

from fabricxfer import cuda
from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.client import Client, Region

IPC = bytes(range(64))
MIB = 1 << 20


def share_tuple(handle, offset=0, size=4096, device=0):
    return (device, handle, size, offset, b"/torch_123_456", 7, bytes(64), True)


def open_vmm_fds():
    """How many of this process's descriptors are memfds named vmm*: the stand-ins for VMM handles. Counting every
    descriptor counted other tests' too (a closed client's channel closes its sockets in a thread a moment later)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("/memfd:vmm"):
                n += 1
        except OSError:
            pass  # closed meanwhile (the listing's own descriptor among them)
    return n


def expandable(version, pid, segment_size, handles, fabric=False):
    body = b"".join(handles) if fabric else struct.pack("=%di" % len(handles), *handles)
    return bytes([version]) + b"e" + struct.pack("=i4xQQ", pid, segment_size, len(handles)) + body


class ParseTest(unittest.TestCase):
    def test_cuda_malloc_segment(self):
        for version in (1, 2, 3):
            s = cuda.parse_cuda_share(share_tuple(bytes([version]) + b"c" + IPC, offset=3 * MIB, size=MIB))
            self.assertEqual((s.kind, s.version, s.offset, s.storage_bytes, s.ipc_handle),
                             (cuda.KIND_IPC, version, 3 * MIB, MIB, IPC))

    def test_unversioned_handle_of_old_pytorch(self):
        s = cuda.parse_cuda_share(share_tuple(IPC, offset=512))
        self.assertEqual((s.kind, s.version, s.offset, s.ipc_handle), (cuda.KIND_IPC, 0, 512, IPC))

    def test_expandable_segment_of_posix_fds(self):
        for version in (1, 2):
            h = expandable(version, 4242, 20 * MIB, [17, 18, 19])
            s = cuda.parse_cuda_share(share_tuple(h, offset=5 * MIB, size=40 * MIB), own_pid=4242)
            self.assertEqual((s.kind, s.pid, s.segment_size, s.handles, s.offset),
                             (cuda.KIND_VMM_FD, 4242, 20 * MIB, [17, 18, 19], 5 * MIB))
            # Inside the second allocation; then across the first two; then all three.
            self.assertEqual(s.locate(21 * MIB, MIB), (1, MIB))
            self.assertEqual(s.locate(0, 20 * MIB), (0, 0))
            self.assertEqual(s.span(21 * MIB, MIB), (1, 1, MIB))
            self.assertEqual(s.span(19 * MIB, 2 * MIB), (0, 2, 19 * MIB))
            self.assertEqual(s.span(20 * MIB, 20 * MIB), (1, 1, 0))
            self.assertEqual(s.span(20 * MIB, 20 * MIB + 1), (1, 2, 0))
            self.assertEqual(s.span(1, 60 * MIB - 1), (0, 3, 1))
            with self.assertRaises(ValueError) as e:
                s.locate(19 * MIB, 2 * MIB)  # one handle only: what fabric handles need
            self.assertIn("spans 2 VMM allocations", str(e.exception))
            self.assertIn("expandable_segments:False", str(e.exception))
            for start, length in ((59 * MIB, 2 * MIB), (0, 60 * MIB + 1), (0, 0)):
                with self.assertRaises(ValueError):
                    s.span(start, length)

    def test_span_is_bounded_by_what_the_agent_maps(self):
        s = cuda.CudaShare(device=0, version=2, kind=cuda.KIND_VMM_FD, offset=0, storage_bytes=0,
                           segment_size=2, handles=list(range(cuda.MAX_ALLOCATIONS + 1)))
        self.assertEqual(s.span(1, 2 * cuda.MAX_ALLOCATIONS - 1), (0, cuda.MAX_ALLOCATIONS, 1))
        with self.assertRaises(ValueError) as e:
            s.span(1, 2 * cuda.MAX_ALLOCATIONS)
        self.assertIn("at most 8192", str(e.exception))

    def test_expandable_segment_of_fabric_handles(self):
        handles = [bytes([i]) * 64 for i in (1, 2)]
        s = cuda.parse_cuda_share(share_tuple(expandable(2, 99, 2 * MIB, handles, fabric=True), size=MIB),
                                  own_pid=os.getpid())
        self.assertEqual((s.kind, s.handles), (cuda.KIND_FABRIC, handles))

    def test_unknown_handles_are_refused_with_what_to_do(self):
        cases = {
            "version 9": (bytes([9]) + b"c" + IPC, "upgrade fabricxfer"),
            "type x": (bytes([2]) + b"x" + IPC, "unknown CUDA share handle type 'x'"),
            "expandable v3": (expandable(3, 1, MIB, [3]), "expandable_segments:False"),
            "short c": (bytes([2]) + b"c" + IPC[:10], "carries 10 bytes"),
            "short header": (bytes([2]) + b"e" + b"\0" * 8, "shorter than its 24-byte header"),
            "odd body": (expandable(2, 1, MIB, [3])[:-1], "neither POSIX fds"),
            "fabric in v1": (expandable(1, 1, MIB, [b"\1" * 64], fabric=True), "neither POSIX fds"),
            "another pid": (expandable(2, os.getpid() + 1, MIB, [3]), "not this process"),
        }
        for name, (handle, want) in cases.items():
            with self.subTest(name):
                with self.assertRaises(ValueError) as e:
                    cuda.parse_cuda_share(share_tuple(handle, size=MIB), own_pid=os.getpid())
                self.assertIn(want, str(e.exception))
        with self.assertRaises(ValueError):
            cuda.parse_cuda_share(share_tuple(expandable(2, 1, MIB, [3]), offset=MIB - 10, size=20))
        with self.assertRaises(ValueError):
            cuda.parse_cuda_share(share_tuple(None))
        with self.assertRaises(TypeError):
            cuda.parse_cuda_share([0, IPC, 1, 0])
        with self.assertRaises(TypeError):
            cuda.parse_cuda_share((0, "text", 1, 0))


class _Device:
    def __init__(self, index, kind="cuda"):
        self.index, self.type = index, kind

    def __str__(self):
        return "%s:%d" % (self.type, self.index)


class _Storage:
    def __init__(self, share):
        self.share = share

    def _share_cuda_(self):
        return self.share


class FakeTensor:
    """What register_tensor reads of a torch tensor."""

    def __init__(self, share, numel, esize=2, storage_offset=0, device=0, cuda=True, contiguous=True):
        self.is_cuda = cuda
        self.device = _Device(device, "cuda" if cuda else "cpu")
        self._numel, self._esize, self._off, self._contig = numel, esize, storage_offset, contiguous
        self._storage = _Storage(share)
        self.shape, self._stride = (numel,), (1 if contiguous else 2,)

    def is_contiguous(self):
        return self._contig

    def element_size(self):
        return self._esize

    def numel(self):
        return self._numel

    def storage_offset(self):
        return self._off

    def stride(self):
        return self._stride

    def untyped_storage(self):
        return self._storage


class RecordingClient(Client):
    """A Client that records RegisterMemory requests instead of calling an agent."""

    def __init__(self):
        import threading
        self._lock = threading.Lock()
        self._owned = {}
        self._layouts = []
        self.calls = []

    def _register(self, req, fd=-1):
        if isinstance(fd, list):
            st = [os.fstat(f) for f in fd]
        else:
            st = os.fstat(fd) if fd >= 0 else None
        self.calls.append((req, fd, st))
        return Region(id=len(self.calls), length=req.length, segment=req.segment_name)


class RegisterTensorTest(unittest.TestCase):
    def test_cuda_malloc_tensor_registers_its_own_bytes_of_the_segment(self):
        c = RecordingClient()
        t = FakeTensor(share_tuple(b"\2c" + IPC, offset=2 * MIB, size=MIB, device=1), numel=1000, esize=2,
                       storage_offset=24, device=1)
        r = c.register_tensor(t, segment="kv-0", gpu_index=1)
        req, fd, _ = c.calls[0]
        self.assertEqual((req.kind, req.handle_type, req.ipc_handle, req.offset, req.length, req.gpu_index,
                          req.segment_name), (pb.MEMORY_KIND_GPU, pb.HANDLE_TYPE_IPC, IPC, 2 * MIB + 48, 2000, 1,
                                              "kv-0"))
        self.assertEqual(fd, -1)
        self.assertIs(r.keep, t, "the region must keep the tensor alive while registered")
        c._forget(r)
        self.assertIsNone(r.keep)

    def test_expandable_tensor_inside_one_allocation_goes_as_its_fd(self):
        c = RecordingClient()
        mine = os.memfd_create("vmm-stand-in")
        self.addCleanup(os.close, mine)
        seg = 20 * MIB
        h = expandable(2, os.getpid(), seg, [mine, mine])
        t = FakeTensor(share_tuple(h, offset=seg - MIB, size=4 * MIB), numel=MIB, esize=1, storage_offset=MIB)
        c.register_tensor(t)
        req, fd, st = c.calls[0]
        self.assertEqual((req.handle_type, req.offset, req.length, req.allocation_size),
                         (pb.HANDLE_TYPE_VMM_POSIX_FD, 0, MIB, seg))
        self.assertNotEqual(fd, mine, "the client passes its own duplicate")
        self.assertEqual((st.st_ino, st.st_dev), (os.fstat(mine).st_ino, os.fstat(mine).st_dev))
        how = c._owned[next(iter(c._owned))]
        self.assertEqual(how.fd, fd, "the duplicate is kept for recover()")
        c._drop(how)

    def test_expandable_tensor_over_several_allocations_goes_as_every_fd_in_order(self):
        c = RecordingClient()
        seg = 2 * MIB
        mine = [os.memfd_create("vmm-%d" % i) for i in range(5)]
        for fd in mine:
            self.addCleanup(os.close, fd)
        # The storage starts 1 MiB into allocation 0; the tensor starts 2 MiB + 4 KiB into the storage (inside
        # allocation 1) and runs 4 MiB: allocations 1, 2 and 3.
        h = expandable(2, os.getpid(), seg, mine)
        t = FakeTensor(share_tuple(h, offset=MIB, size=8 * MIB), numel=MIB, esize=4, storage_offset=(2 * MIB + 4096) // 4)
        before = open_vmm_fds()
        r = c.register_tensor(t, segment="kv")
        req, fds, sts = c.calls[0]
        self.assertEqual((req.handle_type, req.offset, req.length, req.allocation_size, req.segment_name, req.fd_token),
                         (pb.HANDLE_TYPE_VMM_POSIX_FD, MIB + 4096, 4 * MIB, seg, "kv", ""))
        self.assertEqual(len(fds), 3)
        for i, st in enumerate(sts):
            want = os.fstat(mine[1 + i])
            self.assertEqual((st.st_ino, st.st_dev), (want.st_ino, want.st_dev), "allocation %d out of order" % i)
            self.assertNotIn(fds[i], mine, "the client passes its own duplicates")
        how = c._owned[r]
        self.assertEqual((how.fd, how.fds), (-1, fds), "the duplicates are kept for recover()")
        c._drop(how)
        self.assertEqual(open_vmm_fds(), before, "dropping the region closes every duplicate")

    def test_a_failed_duplicate_closes_the_ones_made(self):
        c = RecordingClient()
        mine = os.memfd_create("vmm")
        self.addCleanup(os.close, mine)
        # A handle number that names no descriptor (a closed one would be reused by the first duplicates).
        h = expandable(2, os.getpid(), MIB, [mine, mine, 999999])
        t = FakeTensor(share_tuple(h, size=3 * MIB), numel=3 * MIB, esize=1)
        before = open_vmm_fds()
        with self.assertRaises(OSError):
            c.register_tensor(t)
        self.assertEqual(open_vmm_fds(), before)
        self.assertEqual(c.calls, [])

    def test_expandable_fabric_tensor_goes_as_its_fabric_handle(self):
        c = RecordingClient()
        fh = [b"\7" * 64, b"\x08" * 64]
        t = FakeTensor(share_tuple(expandable(2, 1, 2 * MIB, fh, fabric=True), offset=0, size=4 * MIB),
                       numel=4096, esize=4, storage_offset=MIB // 4 + 2 * MIB // 4)
        c.register_tensor(t)
        req, fd, _ = c.calls[0]
        self.assertEqual((req.handle_type, req.fabric_handle, req.offset, req.length, req.allocation_size),
                         (pb.HANDLE_TYPE_FABRIC, fh[1], MIB, 16384, 2 * MIB))

    def test_tensors_it_cannot_register_are_refused_with_what_to_do(self):
        c = RecordingClient()
        ok = share_tuple(b"\2c" + IPC, size=MIB)
        cases = {
            "cpu": (FakeTensor(ok, 10, cuda=False), "register_host"),
            "view": (FakeTensor(ok, 10, contiguous=False), "non-contiguous"),
            "device": (FakeTensor(ok, 10, device=1), "not GPU 0 as given"),
            "empty": (FakeTensor(ok, 0), "empty"),
            "fabric spans": (FakeTensor(share_tuple(expandable(2, os.getpid(), MIB, [b"\1" * 64, b"\2" * 64],
                                                               fabric=True), size=2 * MIB), MIB, esize=2),
                             "spans 2 VMM allocations"),
            "past its handles": (FakeTensor(share_tuple(expandable(2, os.getpid(), MIB, [0]), size=MIB), MIB, esize=2),
                                 "outside its storage"),
            "version": (FakeTensor(share_tuple(b"\x07c" + IPC, size=MIB), 10), "upgrade fabricxfer"),
            "outside storage": (FakeTensor(ok, MIB, esize=2), "outside its storage"),
        }
        for name, (t, want) in cases.items():
            with self.subTest(name):
                with self.assertRaises(ValueError) as e:
                    c.register_tensor(t, gpu_index=0)
                self.assertIn(want, str(e.exception))
        with self.assertRaises(TypeError):
            c.register_tensor(b"not a tensor")
        self.assertEqual(c.calls, [], "nothing may reach the agent")

    def test_a_refused_tensor_gives_back_pytorchs_sharing_reference(self):
        import fabricxfer.client as fc
        released = []
        real = fc._release_ipc_counter
        fc._release_ipc_counter = released.append
        self.addCleanup(setattr, fc, "_release_ipc_counter", real)
        c = RecordingClient()
        fh = [b"\1" * 64, b"\2" * 64]
        t = FakeTensor(share_tuple(expandable(2, os.getpid(), MIB, fh, fabric=True), size=2 * MIB), MIB, esize=2)
        with self.assertRaises(ValueError):
            c.register_tensor(t)
        self.assertEqual(released, [(b"/torch_123_456", 7)])
        r = c.register_tensor(FakeTensor(share_tuple(b"\2c" + IPC, size=MIB), 10))
        self.assertEqual(len(released), 1, "a registered tensor keeps it until deregister")
        c._forget(r)
        self.assertEqual(len(released), 2)


class PutFdsTest(unittest.TestCase):
    def test_many_fds_go_as_put_n_of_at_most_253_in_order(self):
        import socket
        import tempfile
        import threading
        from fabricxfer import client as fc

        path = os.path.join(tempfile.mkdtemp(), "fd.sock")
        ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ln.bind(path)
        ln.listen(4)
        self.addCleanup(ln.close)
        seen = []

        def serve():
            for i in range(2):
                conn, _ = ln.accept()
                with conn:
                    msg, fds, _, _ = socket.recv_fds(conn, 256, 300)
                    seen.append((msg, [os.fstat(f).st_ino for f in fds]))
                    for f in fds:
                        os.close(f)
                    conn.sendall(b"OK tok%d\n" % i)

        th = threading.Thread(target=serve)
        th.start()
        files = [os.memfd_create("f%d" % i) for i in range(300)]
        for f in files:
            self.addCleanup(os.close, f)
        tokens = fc.put_fds(path, files, timeout=5)
        th.join(5)
        self.assertEqual(tokens, ["tok0", "tok1"])
        self.assertEqual([m for m, _ in seen], [b"PUT 253\n", b"PUT 47\n"])
        inodes = [os.fstat(f).st_ino for f in files]
        self.assertEqual(seen[0][1] + seen[1][1], inodes, "descriptors out of order")
        with self.assertRaises(ValueError):
            fc.put_fds(path, [])


if __name__ == "__main__":
    unittest.main()
