# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Block ids and the TransferBlocks frame, without an agent: packing, the frame's bytes against protobuf's, the
refusals made before any call, and how long building the request for 15,360 ids takes."""

import array
import socket
import statistics
import struct
import threading
import time
import unittest

from fabricxfer import blocks, fastconn
from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.client import Client, Layout, to_layout, to_layout_segment

try:
    import numpy as np
except ImportError:  # the numpy cases skip; CI installs python3-numpy
    np = None
try:
    import torch
except ImportError:
    torch = None


def ints(mv, width):
    return list(array.array("i" if width == 4 else "q", bytes(mv)))


class PackTest(unittest.TestCase):
    def test_buffers(self):
        for code, width in (("i", 4), ("q", 8), ("l", array.array("l").itemsize)):
            a = array.array(code, [5, 0, -1, 7])
            mv, w, n = blocks.pack_ids(a)
            self.assertEqual((w, n, ints(mv, w)), (width, 4, [5, 0, -1, 7]))
        mv, w, n = blocks.pack_ids(memoryview(array.array("q", [1, 2])))
        self.assertEqual((w, n), (8, 2))
        raw = array.array("i", [3, 4, 5]).tobytes()
        mv, w, n = blocks.pack_ids(raw, id_bytes=4)
        self.assertEqual((w, n, ints(mv, 4)), (4, 3, [3, 4, 5]))
        mv, w, n = blocks.pack_ids(bytearray(array.array("q", [9]).tobytes()), id_bytes=8)
        self.assertEqual((w, n, ints(mv, 8)), (8, 1, [9]))
        # A strided view is copied once, in C.
        mv, w, n = blocks.pack_ids(memoryview(array.array("q", [1, 2, 3, 4]))[::2])
        self.assertEqual(ints(mv, 8), [1, 3])

    def test_refusals(self):
        with self.assertRaises(ValueError):
            blocks.pack_ids(b"\0" * 8)  # raw bytes without id_bytes
        with self.assertRaises(ValueError):
            blocks.pack_ids(b"\0" * 6, id_bytes=4)
        with self.assertRaises(ValueError):
            blocks.pack_ids(array.array("d", [1.0]))
        with self.assertRaises(ValueError):
            blocks.pack_ids(array.array("I", [1]))
        with self.assertRaises(ValueError):
            blocks.pack_ids(array.array("h", [1]))
        with self.assertRaises(ValueError):
            blocks.pack_ids(array.array("i", [1]), id_bytes=8)
        with self.assertRaises(TypeError):
            blocks.pack_ids([1, 2, 3])
        with self.assertRaises(TypeError):
            blocks.pack_ids(object())

    @unittest.skipIf(np is None, "numpy not installed (apt-get install python3-numpy)")
    def test_numpy(self):
        a = np.arange(10, dtype=np.int64)
        mv, w, n = blocks.pack_ids(a)
        self.assertEqual((w, n), (8, 10))
        self.assertTrue(np.shares_memory(np.frombuffer(mv, dtype=np.int64), a), "contiguous int64 must not be copied")
        mv, w, n = blocks.pack_ids(a.astype(np.int32))
        self.assertEqual((w, n, ints(mv, 4)), (4, 10, list(range(10))))
        mv, w, n = blocks.pack_ids(a.astype(">i8"))
        self.assertEqual(ints(mv, 8), list(range(10)))
        mv, w, n = blocks.pack_ids(a[::3])
        self.assertEqual(ints(mv, 8), [0, 3, 6, 9])
        mv, w, n = blocks.pack_ids(np.int64(7))  # a 0-d array (ids[i]) is one id
        self.assertEqual((w, n, ints(mv, 8)), (8, 1, [7]))
        for bad in (a.astype(np.float64), a.astype(np.uint32), a.astype(np.int16), a.astype(np.uint64)):
            with self.assertRaises(ValueError):
                blocks.pack_ids(bad)

    @unittest.skipIf(torch is None, "torch not installed")
    def test_torch(self):
        t = torch.arange(6, dtype=torch.int32)
        mv, w, n = blocks.pack_ids(t)
        self.assertEqual((w, n, ints(mv, 4)), (4, 6, list(range(6))))
        mv, w, n = blocks.pack_ids(torch.arange(6, dtype=torch.int64)[::2])
        self.assertEqual(ints(mv, 8), [0, 2, 4])
        with self.assertRaises(ValueError):
            blocks.pack_ids(t.float())

    @unittest.skipIf(np is None, "numpy not installed")
    def test_short_lists_pack_as_the_general_path_does(self):
        for ids in (np.array([7]), np.array([7, 2 ** 40], dtype=np.int64), np.arange(5, dtype=np.int32),
                    np.arange(6)[::2], np.arange(40, dtype=np.int32)[::-3], np.arange(1023),
                    np.arange(blocks.ARENA_MIN_IDS), array.array("q", [3, 4]), array.array("i", [5]),
                    np.array([], dtype=np.int64)):
            with self.subTest(ids=ids):
                mv, w, n = blocks.short_ids(ids)
                pm, pw, pn = blocks.pack_ids(ids)
                self.assertEqual((w, n, bytes(mv)), (pw, pn, bytes(pm)))
        # What the general path takes (and widens, copies or refuses): not a short list.
        for ids in (np.array([[1, 2]]), np.arange(2 * blocks.ARENA_MIN_IDS)[::2], np.array([1.0]), np.array([1], dtype=np.int16),
                    np.array([1], dtype=">i8"), np.array([1], dtype=np.uint32), b"\0" * 8, [1, 2], np.int64(3)):
            with self.subTest(ids=ids):
                self.assertIsNone(blocks.short_ids(ids))

    @unittest.skipIf(torch is None, "torch not installed")
    def test_short_torch_lists_pack_as_the_general_path_does(self):
        cases = [torch.tensor([7]), torch.tensor([7], dtype=torch.int32), torch.arange(16), torch.tensor(3),
                 torch.arange(40, dtype=torch.int32)[::3], torch.arange(17), torch.arange(40)[::2],
                 torch.tensor([2 ** 40, -1]), torch.tensor([], dtype=torch.int64), torch.arange(10)[7:8]]
        for t in cases:
            with self.subTest(t=t):
                mv, w, n = blocks.short_ids(t)
                pm, pw, pn = blocks.pack_ids(t)
                self.assertEqual((w, n, bytes(mv)), (pw, pn, bytes(pm)))
                # The ids' own values, little-endian, whichever way torch was read.
                width = 4 if t.dtype == torch.int32 else 8
                want = struct.pack("<%d%s" % (t.numel(), "i" if width == 4 else "q"), *t.reshape(-1).tolist())
                self.assertEqual((w, n, bytes(mv)), (width, t.numel(), want))
        others = [torch.tensor([1.0]), torch.tensor([1], dtype=torch.int16), torch.tensor([True])]
        if torch.cuda.is_available():
            others.append(torch.tensor([1], device="cuda"))
        for t in others:
            with self.subTest(t=t):
                with self.assertRaises(ValueError):
                    blocks.pack_ids(t)
                with self.assertRaises(ValueError):
                    blocks.short_ids(t)

    def test_ids_of_more_than_one_dimension_are_refused(self):
        # One list of ids per side: a 2-D array (a batch of lists, ids.reshape(1, 3)) is refused naming its shape,
        # not flattened into one list. numpy, torch and buffers alike, on the short path and the general one.
        cases = [memoryview(array.array("q", range(6))).cast("B").cast("q", (2, 3))]
        if np is not None:
            cases += [np.arange(3).reshape(1, 3), np.arange(2 * blocks.ARENA_MIN_IDS).reshape(2, -1),
                      np.zeros((0, 3), dtype=np.int64), np.arange(6, dtype=np.int32).reshape(3, 2)[:, :1]]
        if torch is not None:
            cases += [torch.arange(3).reshape(1, 3), torch.arange(4).reshape(2, 2),
                      torch.tensor([[5]], dtype=torch.int32), torch.zeros(2, 0, dtype=torch.int64),
                      torch.zeros(0, 3, dtype=torch.int64), torch.arange(64).reshape(8, 8)]
        for ids in cases:
            with self.subTest(ids=type(ids).__module__, shape=tuple(ids.shape)):
                with self.assertRaisesRegex(ValueError, r"1-D.*shape \(%s" % ids.shape[0]):
                    blocks.pack_ids(ids)
                with self.assertRaisesRegex(ValueError, "1-D"):
                    blocks.short_ids(ids) or blocks.pack_ids(ids)

    @unittest.skipIf(np is None, "numpy not installed")
    def test_arena_fill(self):
        arena = blocks.IdArena(bytearray(64), np)
        u32 = lambda n: list(np.frombuffer(bytes(arena.buf[:8 * n]), dtype="<u4"))  # noqa: E731
        fill = lambda a, b: arena.fill(*blocks.pack_ids(a)[:2], *blocks.pack_ids(b)[:2])  # noqa: E731
        self.assertEqual(fill(np.array([4, 5, 6]), np.array([1, 2, 3], dtype=np.int32)), 3)
        self.assertEqual(u32(3), [4, 5, 6, 1, 2, 3])
        self.assertEqual(fill(np.arange(8, dtype=">i8")[::-2], np.arange(4)), 4)  # strided, big-endian
        self.assertEqual(u32(4), [7, 5, 3, 1, 0, 1, 2, 3])
        self.assertEqual(fill(array.array("q", [9, 8]), array.array("i", [-1, 2])), 2)  # buffers; int32 bits kept
        self.assertEqual(u32(2), [9, 8, 2 ** 32 - 1, 2])
        for bad in ((np.array([2 ** 32]), np.array([0])), (np.array([-1]), np.array([0])),
                    (np.array([1, 2]), np.array([1])), (np.arange(9), np.arange(9))):  # unequal, too many
            before = bytes(arena.buf)
            self.assertIsNone(fill(*bad), bad)  # the frame carries these (and the agent refuses the bad ids)
            self.assertEqual(bytes(arena.buf), before, bad)
        if torch is not None:
            t = torch.arange(10, dtype=torch.int64)
            self.assertEqual(fill(t[::3], torch.tensor([1, 2, 3, 4], dtype=torch.int32)), 4)
            self.assertEqual(u32(4), [0, 3, 6, 9, 1, 2, 3, 4])
            self.assertIsNone(fill(torch.tensor([2 ** 32]), torch.tensor([1])))

    @unittest.skipIf(np is None, "numpy not installed")
    def test_narrow_ids(self):
        u32 = lambda mv: list(array.array("I", bytes(mv)))  # noqa: E731  (32-bit ids are unsigned to the agent)
        a = np.array([0, 5, 2 ** 31, 2 ** 32 - 1, 7], dtype=np.int64)
        self.assertEqual(u32(blocks.narrow_ids(a, 5)), [0, 5, 2 ** 31, 2 ** 32 - 1, 7])
        self.assertEqual(u32(blocks.narrow_ids(a.astype(">i8")[::-1], 5)), [7, 2 ** 32 - 1, 2 ** 31, 5, 0])
        for bad in (-1, -(2 ** 40), 2 ** 32, 2 ** 62):
            b = a.copy()
            b[2] = bad
            self.assertIsNone(blocks.narrow_ids(b, 5), bad)
        self.assertIsNone(blocks.narrow_ids(a.astype(np.int32), 5))  # not int64: nothing to narrow
        self.assertIsNone(blocks.narrow_ids(memoryview(a), 5))  # neither numpy nor torch: sent as it is
        if torch is not None:
            t = torch.tensor([3, 1, 2 ** 31], dtype=torch.int64)
            self.assertEqual(u32(blocks.narrow_ids(t, 3)), [3, 1, 2 ** 31])
            self.assertIsNone(blocks.narrow_ids(torch.tensor([2 ** 32], dtype=torch.int64), 1))
            self.assertIsNone(blocks.narrow_ids(torch.tensor([-2], dtype=torch.int64), 1))

    def test_widen(self):
        mv, _, _ = blocks.pack_ids(array.array("i", [1, -2, 2 ** 31 - 1]))
        self.assertEqual(ints(blocks.widen(mv), 8), [1, -2, 2 ** 31 - 1])


class FrameTest(unittest.TestCase):
    def parse(self, parts):
        frame = b"".join(bytes(p) for p in parts)
        (n,) = __import__("struct").unpack(">I", frame[:4])
        self.assertEqual(n, len(frame) - 4)
        return pb.FastRequest.FromString(frame[4:])

    def test_wait_frame_is_the_fast_request_protobuf_would_write(self):
        for ids, timeout in (([5], 30.0), ([123456789], 0.25), (list(range(1000, 1024)), 10.0), ([2 ** 64 - 1], 1.5),
                             ([1, 2], 30.0), ([3], 1e-9)):
            with self.subTest(ids=ids, timeout=timeout):
                parts = blocks.wait_frame(ids, timeout)
                req = pb.FastWait(transfer_ids=ids)
                req.timeout.FromNanoseconds(int(timeout * 1e9))
                want = pb.FastRequest(wait=req)
                self.assertEqual(self.parse(parts), want)
                self.assertEqual(b"".join(parts)[4:], want.SerializeToString())
        for bad in ([-1], [2 ** 64], ["7"]):
            with self.subTest(bad=bad):
                with self.assertRaises((ValueError, TypeError)):
                    blocks.wait_frame(bad, 1.0)

    def test_frame_is_the_fast_request_protobuf_would_write(self):
        local, _, _ = blocks.pack_ids(array.array("q", range(300)))
        remote, _, _ = blocks.pack_ids(array.array("q", range(1000, 1300)))
        for kw in ({}, {"timeout": 1.5, "notify": b"done"}, {"wait": False}):
            with self.subTest(kw):
                ref = pb.LayoutRef(node="node-b", segment="kv-0")
                got = self.parse(blocks.blocks_frame(pb.OP_WRITE, 7, ref, local, remote, 8, **kw))
                want = pb.FastRequest(blocks=blocks.blocks_request(pb.OP_WRITE, 7, ref, local, remote, 8, **kw))
                self.assertEqual(got, want)
                self.assertEqual(got.blocks.local_ids, local.tobytes())
        empty = memoryview(b"")
        got = self.parse(blocks.blocks_frame(pb.OP_READ, 1, pb.LayoutRef(layout_id=2), empty, empty, 4))
        self.assertEqual((got.blocks.op, got.blocks.remote.layout_id, got.blocks.local_ids), (pb.OP_READ, 2, b""))

    def test_frames_carry_the_calls_timeout_as_protobuf_would_write_it(self):
        # FastRequest.call_timeout, appended after the request: each builder's frame reads as the message with it,
        # framings kept per call timeout too (one kept for another would tell the agent the wrong bound).
        local, _, _ = blocks.pack_ids(array.array("q", range(3)))
        ref = pb.LayoutRef(layout_id=3)
        for call in (10.5, 0.75, 10.5, 1e-10):
            with self.subTest(call=call):
                want_ct = pb.FastRequest()
                want_ct.call_timeout.FromNanoseconds(max(int(call * 1e9), 1))
                frames = {
                    "blocks": (blocks.blocks_frame(pb.OP_WRITE, 7, ref, local, local, 8, 2.0, call_timeout=call),
                               pb.FastRequest(blocks=blocks.blocks_request(pb.OP_WRITE, 7, ref, local, local, 8, 2.0))),
                    "arena": (blocks.arena_frame(pb.OP_READ, 7, ref, 3, 2.0, call_timeout=call),
                              pb.FastRequest(blocks=pb.TransferBlocksRequest(op=pb.OP_READ, layout_id=7, remote=ref,
                                                                             id_bytes=4, arena_ids=3, wait=True))),
                    "wait": (blocks.wait_frame([5, 6], 2.0, call_timeout=call), None),
                }
                for kind, (parts, want) in frames.items():
                    got = self.parse(parts)
                    self.assertEqual(got.call_timeout, want_ct.call_timeout, kind)
                    if want is not None:
                        if kind == "arena":
                            want.blocks.timeout.FromNanoseconds(2_000_000_000)
                        want.call_timeout.CopyFrom(want_ct.call_timeout)
                        self.assertEqual(got, want, kind)
                    else:
                        self.assertEqual(list(got.wait.transfer_ids), [5, 6])
        self.assertFalse(self.parse(blocks.wait_frame([5], 2.0)).HasField("call_timeout"))

    def test_kept_framing_follows_the_ids_lengths(self):
        # The framing of a frame is kept per head and id lengths: frames of one head with other lengths, built
        # again or taken from what was kept, are each what protobuf writes.
        ref = pb.LayoutRef(layout_id=3)
        for n in (1, 2, 1, 300, 2, 300):
            with self.subTest(n=n):
                local, _, _ = blocks.pack_ids(array.array("q", range(n)))
                remote, _, _ = blocks.pack_ids(array.array("q", range(100, 100 + n)))
                got = self.parse(blocks.blocks_frame(pb.OP_WRITE, 7, ref, local, remote, 8, 2.0))
                want = pb.FastRequest(blocks=blocks.blocks_request(pb.OP_WRITE, 7, ref, local, remote, 8, 2.0))
                self.assertEqual(got, want)

    def test_frame_of_a_remote_layout_follows_it(self):
        # The frame's head is kept per remote; a RemoteLayout keys it without building its LayoutRef, and the
        # frame still names what its ref names: another remote, a layout given a new id by recover(), a segment.
        ids, _, _ = blocks.pack_ids(array.array("q", [4]))
        lay = Layout(pb.Layout(id=2, block_bytes=720, blocks=16, region_ids=[2]), [])
        for remote in (to_layout(lay), to_layout(Layout(pb.Layout(id=9), [])), to_layout_segment("node-b", "kv-0"),
                       to_layout_segment("", "kv-0")):
            with self.subTest(remote=repr(remote)):
                for _ in range(2):  # built, then from the kept head
                    got = self.parse(blocks.blocks_frame(pb.OP_WRITE, 7, remote, ids, ids, 8))
                    self.assertEqual(got.blocks.remote, remote.ref)
        remote = to_layout(lay)
        lay.pb.id = 5  # as recover() renumbers it
        self.assertEqual(self.parse(blocks.blocks_frame(pb.OP_WRITE, 7, remote, ids, ids, 8)).blocks.remote.layout_id, 5)

    def test_fast_conn_sends_frames_larger_than_the_socket_buffer(self):
        # Partial writes resume where they stopped, whether the sender polls for room (spin) or sleeps (no spin),
        # and a reply that follows is read whole.
        for spin in (0.01, 0.0):
            with self.subTest(spin=spin):
                a, b = socket.socketpair()
                self.addCleanup(a.close)
                self.addCleanup(b.close)
                a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
                big = bytes(range(256)) * 8192  # 2 MiB, far more than the socket buffer
                parts = [b"head", memoryview(big), b"", b"tail"]
                got = bytearray()

                def serve():
                    b.settimeout(10)
                    while len(got) < len(big) + 8:
                        chunk = b.recv(65536)
                        if not chunk:
                            break
                        got.extend(chunk)
                    b.sendall(b"\0\0\0\3abc")

                server = threading.Thread(target=serve)
                server.start()
                conn = fastconn.FastConn(a, spin)
                reply = conn.call(parts, time.perf_counter() + 10)
                server.join(10)
                self.assertEqual(bytes(got), b"head" + big + b"tail")
                self.assertEqual(reply, b"abc")

    def test_fast_conn_refuses_oversized_and_late_replies(self):
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        conn = fastconn.FastConn(a, 0.0, max_reply=16)
        b.sendall(b"\0\0\1\0")
        with self.assertRaises(fastconn.FastConnError):
            conn.recv_frame(time.perf_counter() + 5)
        c, d = socket.socketpair()
        self.addCleanup(c.close)
        self.addCleanup(d.close)
        start = time.perf_counter()
        with self.assertRaises(fastconn.FastConnError):
            fastconn.FastConn(c, 0.001).recv_frame(time.perf_counter() + 0.05)
        self.assertLess(time.perf_counter() - start, 5.0)

    def test_request_for_15360_ids_builds_fast(self):
        """The hot path: 15,360 ids per side into a fast-socket frame. Target 0.2 ms; the assert is loose so a
        slow CI machine does not fail."""
        n = 15360
        if np is not None:
            rng = np.random.default_rng(1)
            ids = rng.permutation(262144)[:n].astype(np.int64)
            rids = rng.permutation(262144)[:n].astype(np.int64)
            kind = "numpy int64"
        else:
            ids, rids, kind = array.array("q", range(n)), array.array("q", range(n, 2 * n)), "array.array('q')"
        lay = Layout(pb.Layout(id=3, block_bytes=720, blocks=262144, region_ids=[1]), [])
        remote = to_layout_segment("node-b", "kv-0")
        times = []
        for _ in range(300):
            t0 = time.perf_counter()
            lm, w, c = blocks.pack_ids(ids)
            rm, _, _ = blocks.pack_ids(rids)
            parts = blocks.blocks_frame(pb.OP_WRITE, lay.id, remote.ref, lm, rm, w)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print("\nbuilding a TransferBlocks frame of %d %s ids per side: median %.1f us, p99 %.1f us" % (
            n, kind, med * 1e6, sorted(times)[int(len(times) * 0.99)] * 1e6), flush=True)
        self.assertEqual(self.parse(parts).blocks.local_ids, lm.tobytes())
        self.assertLess(med, 5e-3, "building the request took %.3f ms (target 0.2 ms)" % (med * 1e3))


class LandedReplyTest(unittest.TestCase):
    def test_only_a_succeeded_status_at_the_reply_start_is_told_without_decoding(self):
        from fabricxfer.client import _landed

        def landed(raw):
            return _landed(memoryview(raw))

        def reply(state=None, **status):
            # As the agent writes it: the status's state first (protobuf's own order puts the transfer id first).
            st = (pb.TransferStatus(state=state).SerializeToString() if state is not None else b"") + \
                pb.TransferStatus(**status).SerializeToString()
            resp = b"\x2a" + blocks._varint(len(st)) + st
            raw = b"\x1a" + blocks._varint(len(resp)) + resp
            self.assertEqual(pb.FastReply.FromString(raw).response.status, pb.TransferStatus(state=state, **status))
            return raw

        ok = pb.TRANSFER_STATE_SUCCEEDED
        for tid in (1, 16, 127, 128, 0x2A, 0x1002, 1 << 35, (1 << 64) - 1):
            with self.subTest(transfer_id=tid):
                self.assertTrue(landed(reply(transfer_id=tid, state=ok, bytes=4096)))
                for other in (pb.TRANSFER_STATE_PENDING, pb.TRANSFER_STATE_FAILED, pb.TRANSFER_STATE_CANCELLED,
                              pb.TRANSFER_STATE_DEADLINE_EXCEEDED):
                    self.assertFalse(landed(reply(transfer_id=tid, state=other)), other)
                failed = reply(transfer_id=tid, state=pb.TRANSFER_STATE_FAILED, error="x" * 300,
                               failures=[pb.TagFailure(tag="t", code="NOT_FOUND", message="\x10\x02" * 40)])
                self.assertFalse(landed(failed))
        # Protobuf's own order (the transfer id first, as an agent of before 2026-12-06 wrote it), an error reply, a
        # reply without a status, replies too short to hold a state: decoded whole instead.
        self.assertTrue(landed(reply(state=ok)))
        self.assertFalse(landed(pb.FastReply(response=pb.TransferResponse(status=pb.TransferStatus(
            transfer_id=7, state=ok))).SerializeToString()))
        for short in (b"\x08\x03", b"\x1a\x02\x2a\x00", b"\x1a\x04\x2a\x02\x10"):
            self.assertFalse(landed(short), short)
        self.assertFalse(landed(pb.FastReply(code=3, message="\x10\x02").SerializeToString()))
        self.assertFalse(landed(pb.FastReply(response=pb.TransferResponse(transfer_id=5)).SerializeToString()))
        self.assertFalse(landed(b""))


class LandedStatusTest(unittest.TestCase):
    """What a waited transfer_blocks returns for a reply that says its transfer succeeded: the status, decoded
    only when read, acting as the TransferStatus message it stands for."""

    def test_it_acts_as_its_decoded_message(self):
        import copy
        import pickle

        from fabricxfer.client import _landed, _LandedStatus, transfer_status

        msg = pb.TransferStatus(transfer_id=(1 << 40) + 7, state=pb.TRANSFER_STATE_SUCCEEDED, bytes=64 << 20)
        msg.elapsed.FromNanoseconds(45_123)
        # The agent's reply: the response's status first, its state first (transfer_blocks tells such a reply by
        # its bytes).
        status = pb.TransferStatus(state=msg.state).SerializeToString() + pb.TransferStatus(
            transfer_id=msg.transfer_id, bytes=msg.bytes, elapsed=msg.elapsed).SerializeToString()
        body = (b"\x2a" + bytes([len(status)]) + status
                + pb.TransferResponse(transfer_id=msg.transfer_id, bytes=msg.bytes).SerializeToString())
        raw = b"\x1a" + bytes([len(body)]) + body
        self.assertTrue(_landed(raw))

        def decoded(st):
            try:
                _LandedStatus._msg.__get__(st)  # the slot itself: reading st._msg would decode it
            except AttributeError:
                return False
            return True

        st = _LandedStatus(raw)
        self.assertFalse(decoded(st), "decoded before anything was read")
        self.assertIsInstance(st, pb.TransferStatus)
        self.assertEqual((st.transfer_id, st.state, st.bytes, st.elapsed.ToNanoseconds()),
                         (msg.transfer_id, msg.state, msg.bytes, 45_123))
        self.assertTrue(decoded(st))
        self.assertTrue(st.HasField("elapsed"))
        self.assertEqual(st.SerializeToString(), msg.SerializeToString())
        self.assertEqual(repr(st), repr(msg))
        self.assertEqual(str(st), str(msg))
        self.assertIn("bytes", dir(st))
        self.assertTrue(st == msg and not st != msg and st == _LandedStatus(raw))
        self.assertFalse(st == pb.TransferStatus(transfer_id=msg.transfer_id))
        # protobuf's own calls take the message itself
        self.assertIs(type(transfer_status(st)), pb.TransferStatus)
        self.assertEqual(transfer_status(st), msg)
        self.assertIs(transfer_status(msg), msg)
        for made in (copy.copy(st), copy.deepcopy(st), pickle.loads(pickle.dumps(st))):
            self.assertIs(type(made), pb.TransferStatus)
            self.assertEqual(made, msg)
        with self.assertRaises(TypeError):
            hash(st)
        st.error = "read later"  # fields are set on the message
        self.assertEqual(transfer_status(st).error, "read later")
        with self.assertRaises(AttributeError):
            st.no_such_field


class ClientChecksTest(unittest.TestCase):
    """Refusals transfer_blocks makes before any call (the client here has no connection at all)."""

    def test_refused_before_any_call(self):
        c = Client.__new__(Client)
        c._frames = {}
        lay = Layout(pb.Layout(id=1, block_bytes=720, blocks=16, region_ids=[1]), [])
        other = to_layout(Layout(pb.Layout(id=2, block_bytes=720, blocks=16, region_ids=[2]), []))
        cases = [
            (ValueError, ("write", lay, array.array("q", [1, 2]), other, array.array("q", [1]))),
            (ValueError, ("write", lay, array.array("d", [1.0]), other, array.array("d", [1.0]))),
            (ValueError, ("copy", lay, array.array("q", [1]), other, array.array("q", [1]))),
            (TypeError, ("read", lay, [1], other, [1])),
        ]
        if np is not None:  # a batch of lists is not one list
            cases.append((ValueError, ("write", lay, np.arange(3).reshape(1, 3), other, np.arange(3).reshape(1, 3))))
        # Without a fast connection, and with one that fails whatever is asked of it (the short-list path must
        # refuse these before it touches the connection).
        for fast in (None, object()):
            c._fast = fast
            for exc, args in cases:
                with self.subTest(args=args[0], fast=fast):
                    with self.assertRaises(exc):
                        c.transfer_blocks(*args)
        self.assertEqual(other.ref.layout_id, 2)


if __name__ == "__main__":
    unittest.main()
