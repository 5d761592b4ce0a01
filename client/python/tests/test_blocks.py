# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Block layouts against a real agent (client/python_test.go): host layouts over memfd regions, every byte
checked with numpy, and the agent's refusals moving nothing.

Skips while the agent answers UNIMPLEMENTED for TransferBlocks (before the server's block layouts landed)."""

import collections
import os
import threading
import unittest

import grpc

from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.blocks import _varint, blocks_frame, pack_ids
from fabricxfer.client import (AgentError, Client, Item, TransferFailed, shared_memory, status_first, to_layout,
                               to_layout_segment, to_region, transfer_status)

try:
    import numpy as np
except ImportError:
    np = None

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")
BLOCK = 720
BLOCKS = 16


def _unimplemented():
    """Why the agent cannot serve block transfers, or "" when it can (any answer but UNIMPLEMENTED)."""
    with Client(SOCKET, fast=False) as c:
        try:
            c.stub.TransferBlocks(pb.TransferBlocksRequest(op=pb.OP_WRITE, id_bytes=8), timeout=5)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                return "the agent answers UNIMPLEMENTED for TransferBlocks (%s)" % e.details()
    return ""


@unittest.skipUnless(SOCKET, "FABRICXFER_SOCKET not set: run through go test ./client")
@unittest.skipIf(np is None, "numpy not installed (apt-get install python3-numpy)")
class BlocksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        why = _unimplemented()
        if why:
            raise unittest.SkipTest(why)

    def setUp(self):
        self.c = Client(SOCKET)
        self.addCleanup(self.c.close)
        self.slow = Client(SOCKET, fast=False)
        self.addCleanup(self.slow.close)

    def layout(self, c, regions=2, blocks=BLOCKS, block=BLOCK, fill=True, segment=""):
        """A layout of memfd regions; returns (layout, [numpy view of each region as blocks x block bytes])."""
        regs, views = [], []
        for _ in range(regions):
            fd, buf = shared_memory("py-blocks", blocks * block)
            self.addCleanup(buf.close)
            self.addCleanup(os.close, fd)
            v = np.frombuffer(buf, dtype=np.uint8).reshape(blocks, block)
            if fill:
                v[:] = np.frombuffer(os.urandom(v.size), dtype=np.uint8).reshape(v.shape)
            regs.append(c.register_host(fd, 0, blocks * block))
            views.append(v)
        lay = c.register_layout(regs, block, segment=segment)
        self.assertEqual((lay.block_bytes, lay.blocks, len(lay.regions)), (block, blocks, regions))
        return lay, views

    def check(self, dst, src, dst_ids, src_ids, before):
        """dst blocks dst_ids are src blocks src_ids, in every region; every other byte is as before."""
        for k, (d, s, b) in enumerate(zip(dst, src, before)):
            want = b.copy()
            want[np.asarray(dst_ids, dtype=np.int64)] = s[np.asarray(src_ids, dtype=np.int64)]
            self.assertTrue(np.array_equal(d, want), "region %d differs" % k)

    def test_a_call_behind_a_held_fast_connection_goes_through_grpc(self):
        """A call that finds the fast connection held by another thread's call (a long copy, a wait) goes through
        gRPC after FAST_QUEUE_WAIT and lands, instead of queueing behind it (a one-block call waited for all of a
        256 MiB one): short id lists, arena-sized ones, prepared runs, item transfers, waits. Once it is free,
        calls take it again."""
        c = self.c
        self.assertIsNotNone(c._fast)
        src, sv = self.layout(c, regions=1, blocks=4096, block=64)
        dst, dv = self.layout(c, regions=1, blocks=4096, block=64)
        grpc_calls = collections.Counter()
        for name in ("Transfer", "TransferBlocks", "Wait"):
            def counted(*args, _real=getattr(c.stub, name), _name=name, **kwargs):
                grpc_calls[_name] += 1
                return _real(*args, **kwargs)
            setattr(c.stub, name, counted)
        held, release = threading.Event(), threading.Event()

        def hold():
            with c._fast_lock:  # as another thread's call holds it until the agent answers
                held.set()
                release.wait(30)

        holder = threading.Thread(target=hold)
        holder.start()
        self.addCleanup(holder.join)
        self.addCleanup(release.set)
        self.assertTrue(held.wait(5))

        before = [v.copy() for v in dv]
        moved_src, moved_dst = [], []

        def moved(s_ids, d_ids):
            moved_src.extend(int(i) for i in s_ids)
            moved_dst.extend(int(i) for i in d_ids)

        c.transfer_blocks("write", src, np.array([1, 2], np.int32), to_layout(dst), np.array([3, 4], np.int32))
        moved([1, 2], [3, 4])
        perm = np.random.default_rng(7).permutation(1024).astype(np.int32)  # past ARENA_MIN_IDS: the arena's path
        c.transfer_blocks("write", src, perm + 1024, to_layout(dst), np.arange(1024, 2048, dtype=np.int32))
        moved(perm + 1024, range(1024, 2048))
        self.assertIsNone(c.prepare_blocks("write", src, np.array([5]), to_layout(dst), np.array([6])).run())
        moved([5], [6])
        st = c.transfer("write", [Item(src.regions[0], to_region(dst.regions[0]), 64, 7 * 64, 8 * 64)])
        self.assertEqual(st.state, pb.TRANSFER_STATE_SUCCEEDED)
        moved([7], [8])
        tid = c.transfer_blocks("write", src, np.array([9]), to_layout(dst), np.array([10]), wait=False)
        self.assertEqual(c.wait(tid, timeout=5).state, pb.TRANSFER_STATE_SUCCEEDED)
        tids = [c.transfer_blocks("write", src, np.array([11 + k]), to_layout(dst), np.array([2048 + k]), wait=False)
                for k in range(3)]
        self.assertEqual(c.wait_all(tids, timeout=5).state, pb.TRANSFER_STATE_SUCCEEDED)
        moved([9, 11, 12, 13], [10, 2048, 2049, 2050])
        self.assertTrue(holder.is_alive(), "the fast connection was released before the calls ended")
        self.assertEqual(grpc_calls, collections.Counter(Transfer=1, TransferBlocks=7, Wait=4))
        self.check(dv, sv, moved_dst, moved_src, before)

        release.set()
        holder.join(5)
        c.transfer_blocks("write", src, np.array([20]), to_layout(dst), np.array([21]))
        c.wait(c.transfer_blocks("write", src, np.array([22]), to_layout(dst), np.array([23]), wait=False))
        self.assertEqual(grpc_calls, collections.Counter(Transfer=1, TransferBlocks=7, Wait=4),
                         "calls went through gRPC once the fast connection was free")
        self.assertTrue(np.array_equal(dv[0][[21, 23]], sv[0][[20, 22]]))

    def test_write_and_read_blocks_with_int32_int64_and_bytes_ids(self):
        for c in (self.c, self.slow):
            with self.subTest(fast=c._fast is not None):
                seg = "py-blocks-dst-%d" % (c._fast is not None)
                src_l, src = self.layout(c)
                dst_l, dst = self.layout(c, fill=False, segment=seg)
                self.assertEqual(dst_l.segment, seg)
                # int32 ids, to another layout of the caller's.
                before = [d.copy() for d in dst]
                lids, rids = np.array([3, 0, 15, 7], dtype=np.int32), np.array([1, 2, 14, 9], dtype=np.int32)
                st = c.transfer_blocks("write", src_l, lids, to_layout(dst_l), rids)
                self.assertEqual(st.state, pb.TRANSFER_STATE_SUCCEEDED)
                self.check(dst, src, rids, lids, before)
                # int64 ids to the published layout; a repeated source block is fine.
                before = [d.copy() for d in dst]
                lids, rids = np.array([5, 5, 12], dtype=np.int64), np.array([0, 3, 15], dtype=np.int64)
                c.transfer_blocks("write", src_l, lids, to_layout_segment("", seg), rids, timeout=5.0)
                self.check(dst, src, rids, lids, before)
                # Raw little-endian bytes; without waiting.
                before = [d.copy() for d in dst]
                lids, rids = np.array([8, 9], dtype="<i8"), np.array([10, 11], dtype="<i8")
                tid = c.transfer_blocks("write", src_l, lids.tobytes(), to_layout(dst_l), rids.tobytes(),
                                        wait=False, id_bytes=8)
                self.assertEqual(c.wait(tid, timeout=5.0).state, pb.TRANSFER_STATE_SUCCEEDED)
                self.check(dst, src, rids, lids, before)
                # READ: the remote layout's blocks into the local one's.
                back_l, back = self.layout(c, fill=False)
                before = [b.copy() for b in back]
                lids, rids = np.arange(16, dtype=np.int64)[::-1].copy(), np.arange(16, dtype=np.int32)
                c.transfer_blocks("read", back_l, lids, to_layout(dst_l), rids)
                self.check(back, dst, lids, rids, before)
                # Every block of a full permutation, as int32.
                perm = np.random.default_rng(7).permutation(BLOCKS).astype(np.int32)
                before = [d.copy() for d in dst]
                c.transfer_blocks("write", src_l, np.arange(BLOCKS, dtype=np.int32), to_layout(dst_l), perm)
                self.check(dst, src, perm, np.arange(BLOCKS), before)
                c.deregister_layout(back_l)
                with self.assertRaises(grpc.RpcError):
                    c.transfer_blocks("read", back_l, lids, to_layout(dst_l), rids)

    def test_long_int64_lists_narrowed_or_not_land_or_are_refused_whole(self):
        # Lists of 1,024 ids or more go through the fast connection's id arena (or, by gRPC, travel as 32-bit ids)
        # when every id fits in 32 bits, else as int64 in the request; either way good ids land and a bad one
        # refuses the whole list.
        n, blocks = 2048, 4096
        rng = np.random.default_rng(11)
        self.assertIsNotNone(self.c._arena, "the fast client has no id arena")
        self.assertIsNone(self.slow._arena)
        for c in (self.c, self.slow):
            with self.subTest(fast=c._fast is not None):
                src_l, src = self.layout(c, blocks=blocks, block=64)
                dst_l, dst = self.layout(c, blocks=blocks, block=64, fill=False)
                lids = rng.permutation(blocks)[:n].astype(np.int64)
                rids = rng.permutation(blocks)[:n].astype(np.int64)
                before = [d.copy() for d in dst]
                c.transfer_blocks("write", src_l, lids, to_layout(dst_l), rids)
                self.check(dst, src, rids, lids, before)
                for name, bad in (("id past 2^31", 1 << 31), ("negative id", -1), ("id past the layout", blocks),
                                  ("id past 2^32", (1 << 32) + 3)):
                    with self.subTest(name):
                        before = [d.copy() for d in dst]
                        worse = rids.copy()
                        worse[n // 2] = bad
                        with self.assertRaises(grpc.RpcError) as e:
                            c.transfer_blocks("write", src_l, lids, to_layout(dst_l), worse)
                        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                        for k, (d, b) in enumerate(zip(dst, before)):
                            self.assertTrue(np.array_equal(d, b), "%s changed region %d" % (name, k))

    def test_unwaited_transfers_pipeline_and_are_waited_for(self):
        # Transfers submitted with wait=False (short lists in the frame, long ones through the id arena) run
        # while more are submitted; wait_all settles them, and every byte lands.
        n, blocks = 1024, 8192
        rng = np.random.default_rng(5)
        for c in (self.c, self.slow):
            with self.subTest(fast=c._fast is not None):
                src_l, src = self.layout(c, blocks=blocks, block=64)
                dst_l, dst = self.layout(c, blocks=blocks, block=64, fill=False)
                before = [d.copy() for d in dst]
                order = rng.permutation(blocks)
                lids = rng.permutation(blocks)[:4 * n].astype(np.int64)
                rids = order[:4 * n].astype(np.int64)  # disjoint destinations: the four may run in any order
                parts = [(lids[:3], rids[:3]), (lids[3:n], rids[3:n]), (lids[n:3 * n], rids[n:3 * n]),
                         (lids[3 * n:], rids[3 * n:])]
                tids = [c.transfer_blocks("write", src_l, a, to_layout(dst_l), b, wait=False) for a, b in parts]
                self.assertEqual(len(set(tids)), 4)
                st = c.wait_all(tids, timeout=30)
                self.assertEqual((st.transfer_id, st.state), (tids[-1], pb.TRANSFER_STATE_SUCCEEDED))
                self.check(dst, src, rids, lids, before)
                with self.assertRaises(ValueError):
                    c.wait_all([])
                # Waiting again for a settled transfer answers its status; an unknown id is NOT_FOUND, and the
                # connection goes on serving (other callers' ids: agent/server's fast socket tests).
                self.assertEqual(c.wait(tids[0]).state, pb.TRANSFER_STATE_SUCCEEDED)
                with self.assertRaises(grpc.RpcError) as e:
                    c.wait(max(tids) + 1000, timeout=1)
                self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())
                self.assertEqual(c.wait(tids[1]).state, pb.TRANSFER_STATE_SUCCEEDED)
                c.transfer_blocks("write", src_l, lids[:2], to_layout(dst_l), rids[:2])

    def test_short_lists_reach_the_layouts_they_name(self):
        # Short id lists take a path whose frames are kept per shape: the same shape to another layout, the other
        # direction, another width, a strided view, ids given as array.array and a layout registered after
        # another was deregistered each reach the memory they name, and ids of mixed widths still pair up.
        import array
        c = self.c
        src_l, src = self.layout(c)
        a_l, a = self.layout(c, fill=False)
        b_l, b = self.layout(c, fill=False)
        before_a, before_b = [x.copy() for x in a], [x.copy() for x in b]
        c.transfer_blocks("write", src_l, np.array([1, 2]), to_layout(a_l), np.array([3, 4]))
        c.transfer_blocks("write", src_l, np.array([5, 6]), to_layout(b_l), np.array([7, 8]))
        self.check(a, src, [3, 4], [1, 2], before_a)
        self.check(b, src, [7, 8], [5, 6], before_b)
        back_l, back = self.layout(c, fill=False)
        before = [x.copy() for x in back]
        c.transfer_blocks("read", back_l, np.array([0, 9], dtype=np.int32), to_layout(a_l),
                          np.array([3, 4], dtype=np.int32))
        self.check(back, a, [0, 9], [3, 4], before)
        before = [x.copy() for x in back]
        c.transfer_blocks("write", src_l, array.array("q", [10]), to_layout(back_l), array.array("q", [11]))
        c.transfer_blocks("write", src_l, np.array([12, 0, 13])[::2], to_layout(back_l), np.array([14, 15]))
        c.transfer_blocks("write", src_l, np.array([1], dtype=np.int32), to_layout(back_l), np.array([2]))
        self.check(back, src, [11, 14, 15, 2], [10, 12, 13, 1], before)
        self.assertEqual(c.wait(c.transfer_blocks("write", src_l, np.array([3]), to_layout(a_l), np.array([0]),
                                                  wait=False)).state, pb.TRANSFER_STATE_SUCCEEDED)
        c.deregister_layout(b_l)
        c_l, c_views = self.layout(c, fill=False)
        before = [x.copy() for x in c_views]
        c.transfer_blocks("write", src_l, np.array([5, 6]), to_layout(c_l), np.array([7, 8]))
        self.check(c_views, src, [7, 8], [5, 6], before)
        with self.assertRaises(AgentError) as e:
            c.transfer_blocks("write", src_l, np.array([5, 6]), to_layout(b_l), np.array([7, 8]))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())
        # A published layout named afresh on every call (to_layout_segment) is framed once for the shape.
        seg_l, seg = self.layout(c, fill=False, segment="py-short-seg")
        before, kept = [x.copy() for x in seg], len(c._frames)
        for k in range(3):
            c.transfer_blocks("write", src_l, np.array([k]), to_layout_segment("", "py-short-seg"), np.array([k + 4]))
        self.check(seg, src, [4, 5, 6], [0, 1, 2], before)
        self.assertEqual(len(c._frames), kept + 1, "a published layout's frame is kept once for its shape")

    def test_one_id_object_for_both_sides_moves_block_i_to_block_i(self):
        # The same object as ids and remote_ids is read once: short and long lists, int32 and int64 (the long
        # int64 one narrowed), by the fast socket, the id arena and gRPC; each block lands at its own index, and
        # a bad id in the shared list is refused for both sides with nothing moved.
        for c in (self.c, self.slow):
            for n, dtype in ((3, np.int64), (3, np.int32), (1500, np.int64), (1500, np.int32)):
                with self.subTest(fast=c._fast is not None, n=n, dtype=dtype.__name__):
                    src_l, src = self.layout(c, regions=1, blocks=2048, block=16)
                    dst_l, dst = self.layout(c, regions=1, blocks=2048, block=16, fill=False)
                    ids = np.random.default_rng(n).permutation(2048)[:n].astype(dtype)
                    before = [d.copy() for d in dst]
                    c.transfer_blocks("write", src_l, ids, to_layout(dst_l), ids)
                    self.check(dst, src, ids, ids, before)
                    bad = ids.copy()
                    bad[-1] = 2048
                    before = [d.copy() for d in dst]
                    with self.assertRaises((AgentError, grpc.RpcError)) as e:  # the fast socket's or gRPC's
                        c.transfer_blocks("write", src_l, bad, to_layout(dst_l), bad)
                    self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                    for d, b in zip(dst, before):
                        self.assertTrue(np.array_equal(d, b), "a refused transfer moved bytes")

    def test_a_waited_short_call_reads_the_status_the_reply_starts_with(self):
        # The agent's reply to a waited call starts with its status, its state first, which the client tells by
        # its bytes and decodes alone when read; replies that start otherwise (an error, the status last, its
        # transfer id first, one of 128 bytes or more) are decoded whole, to the same outcome.
        from fabricxfer.client import _landed, _LandedStatus

        c = self.c
        src_l, src = self.layout(c)
        dst_l, dst = self.layout(c, fill=False)
        before = [x.copy() for x in dst]
        conn = c._fast
        agent_call, replies = conn.call_frame, []  # the path of a waited short call
        conn.call_frame = lambda *a, **kw: replies.append(agent_call(*a, **kw)) or replies[-1]
        st = c.transfer_blocks("write", src_l, np.array([3]), to_layout(dst_l), np.array([5]))
        self.check(dst, src, [5], [3], before)
        first = status_first(replies[-1])
        self.assertIsNotNone(first, "the agent's reply %s does not start with its status" % bytes(replies[-1]).hex())
        self.assertTrue(_landed(replies[-1]), "the agent's reply %s does not start 1a LEN 2a LEN' 10 02"
                        % bytes(replies[-1]).hex())
        self.assertIs(type(st), _LandedStatus)
        self.assertEqual(transfer_status(st), first)
        self.assertEqual((st.state, st.bytes), (pb.TRANSFER_STATE_SUCCEEDED, 2 * BLOCK))
        self.assertTrue(st.transfer_id and st.HasField("elapsed"), st)
        st = transfer_status(st)  # the message itself, for protobuf's own calls below

        def reply(resp=None, code=0, message="", status_last=False, id_first=False):
            """A FastReply's bytes; a response's status written first and its state first, as the agent writes
            them, unless status_last (protobuf's own order throughout) or id_first (the status first, protobuf's
            order within it)."""
            if resp is None or status_last or not resp.HasField("status"):
                return pb.FastReply(code=code, message=message, response=resp).SerializeToString()
            rest = pb.TransferResponse()
            rest.CopyFrom(resp)
            rest.ClearField("status")
            status = resp.status.SerializeToString()
            if not id_first:
                others = pb.TransferStatus()
                others.CopyFrom(resp.status)
                others.ClearField("state")
                status = pb.TransferStatus(state=resp.status.state).SerializeToString() + others.SerializeToString()
            body = b"\x2a" + _varint(len(status)) + status + rest.SerializeToString()
            return b"\x1a" + _varint(len(body)) + body

        failed = pb.TransferStatus(transfer_id=st.transfer_id, state=pb.TRANSFER_STATE_DEADLINE_EXCEEDED, bytes=BLOCK,
                                   error="deadline")
        long_failure = pb.TransferStatus(transfer_id=st.transfer_id, state=pb.TRANSFER_STATE_FAILED, error="x" * 300)
        ok = pb.TransferResponse(transfer_id=st.transfer_id, items=1, bytes=BLOCK, engines=["xgmi"], status=st)
        cases = [
            ("status first", reply(ok), st, None),
            ("status last", reply(ok, status_last=True), st, None),
            ("its transfer id first", reply(ok, id_first=True), st, None),
            ("a failure first", reply(pb.TransferResponse(transfer_id=1, status=failed)), None, failed),
            ("a failure of 300 bytes", reply(pb.TransferResponse(transfer_id=1, status=long_failure)), None, long_failure),
        ]
        self.assertEqual([_landed(raw) for _, raw, _, _ in cases], [True, False, False, False, False])
        for name, raw, want, fails in cases:
            conn.call_frame = lambda *a, raw=raw, **kw: raw
            if fails is None:
                got = c.transfer_blocks("write", src_l, np.array([3]), to_layout(dst_l), np.array([5]))
                self.assertEqual(transfer_status(got), want, name)
                continue
            with self.assertRaises(TransferFailed, msg=name) as e:
                c.transfer_blocks("write", src_l, np.array([3]), to_layout(dst_l), np.array([5]))
            self.assertEqual(e.exception.status, fails, name)
        conn.call_frame = lambda *a, **kw: reply(code=grpc.StatusCode.NOT_FOUND.value[0], message="layout 7 not found")
        with self.assertRaises(AgentError) as e:
            c.transfer_blocks("write", src_l, np.array([3]), to_layout(dst_l), np.array([5]))
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIsNone(status_first(reply(ok, status_last=True)))
        self.assertIsNone(status_first(reply(pb.TransferResponse(transfer_id=1, status=long_failure))))
        conn.call_frame = agent_call

    def test_mailbox_socket_and_sleeping_callers_move_the_same_bytes(self):
        # The fast connection's mailbox (frames through shared memory) where the machine offers it, the socket
        # without one, and a caller that sleeps at once (woken by the agent on the socket) all move the same
        # blocks; a frame too large for the mailbox goes on the socket of the same connection, and refusals come
        # back through the mailbox as through the socket.
        import platform
        boxed = Client(SOCKET)
        self.addCleanup(boxed.close)
        plain = Client(SOCKET, mailbox=False)
        self.addCleanup(plain.close)
        sleepy = Client(SOCKET, spin=0)
        self.addCleanup(sleepy.close)
        # Sealed frames, as on CPUs other than x86; here also asleep at once, so a sealed reply is read after a
        # wake-up as well.
        checked = Client(SOCKET, mailbox="checked")
        self.addCleanup(checked.close)
        checked_sleepy = Client(SOCKET, mailbox="checked", spin=0)
        self.addCleanup(checked_sleepy.close)
        for c in (boxed, sleepy, checked, checked_sleepy):
            self.assertIsNotNone(c._fast.mailbox)
        self.assertEqual(boxed._fast._checked, platform.machine() not in ("x86_64", "AMD64"))
        self.assertTrue(checked._fast._checked)
        self.assertIsNone(plain._fast.mailbox)
        with self.assertRaises(ValueError):
            Client(SOCKET, mailbox="sealed")
        rng = np.random.default_rng(11)
        lids, rids = rng.permutation(4096)[:3000], rng.permutation(4096)[:3000]
        for c in (boxed, plain, sleepy, checked, checked_sleepy):
            with self.subTest(mailbox=c._fast.mailbox is not None, checked=c._fast._checked, spin=c._spin):
                src_l, src = self.layout(c, blocks=4096, block=64)
                dst_l, dst = self.layout(c, blocks=4096, block=64, fill=False)
                if c._fast._checked:
                    # A checked mailbox carries no transfer that reaches this process's host memory (its frames
                    # are ordered, the memory is not): those go on the socket.
                    seq = c._fast._seq
                    c.transfer_blocks("write", src_l, lids[:1], to_layout(dst_l), rids[:1])
                    self.assertEqual(c._fast._seq, seq, "a host-memory transfer went through a checked mailbox")
                    # Layouts taken for GPU memory (x86 orders host memory anyway), to carry the calls below.
                    src_l._host = dst_l._host = False
                before = [d.copy() for d in dst]
                seq = getattr(c._fast, "_seq", 0)
                for k in range(0, 200, 2):  # one block a call: the latency-bound kind
                    c.transfer_blocks("write", src_l, lids[k:k + 2], to_layout(dst_l), rids[k:k + 2])
                if c._fast.mailbox is not None:
                    self.assertEqual(c._fast._seq, seq + 100, "short block calls not through the mailbox")
                # 2,800 int64 ids a side as bytes: 45 KB, larger than the mailbox's area.
                big_l, big_r = lids[200:].astype("<i8").tobytes(), rids[200:].astype("<i8").tobytes()
                c.transfer_blocks("write", src_l, big_l, to_layout(dst_l), big_r, id_bytes=8)
                tids = [c.transfer_blocks("write", src_l, lids[k:k + 1], to_layout(dst_l), rids[k:k + 1], wait=False)
                        for k in range(200, 210)]
                self.assertEqual(c.wait_all(tids, timeout=10).state, pb.TRANSFER_STATE_SUCCEEDED)
                self.check(dst, src, rids, lids, before)
                was = [d.copy() for d in dst]
                with self.assertRaises(AgentError) as e:
                    c.transfer_blocks("write", src_l, lids[:1], to_layout(dst_l), np.array([4096]))
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                for k, (d, b) in enumerate(zip(dst, was)):
                    self.assertTrue(np.array_equal(d, b), "a refused call changed region %d" % k)

    def test_a_checked_mailbox_is_used_only_where_the_agent_seals(self):
        # An agent from before Mailbox.checked maps the mailbox but leaves the checked word clear: it would neither
        # seal its replies nor check the requests, so the client keeps that connection's frames on the socket.
        c = Client(SOCKET, mailbox="checked")
        self.addCleanup(c.close)
        attached = []

        class Conn:
            def attach_mailbox(self, mm, checked=False):
                attached.append(checked)

        for word, want in ((0, []), (1, [True])):
            attached.clear()
            fd, buf = shared_memory("py-test-mailbox", 64 << 10)
            os.close(fd)
            self.addCleanup(buf.close)
            buf[200:204] = word.to_bytes(4, "little")
            c._pass_memory = lambda *args, buf=buf: buf
            c._open_mailbox(Conn(), True, lambda: 1.0)
            self.assertEqual(attached, want, "checked word %d" % word)

    def test_prepared_transfers_move_the_ids_they_were_given(self):
        for c in (self.c, self.slow):
            with self.subTest(fast=c._fast is not None):
                src_l, src = self.layout(c)
                dst_l, dst = self.layout(c, fill=False)
                lids, rids = np.array([3, 0, 15], dtype=np.int64), np.array([1, 2, 14], dtype=np.int32)
                p = c.prepare_blocks("write", src_l, lids, to_layout(dst_l), rids)
                # The ids are copied when prepared: changing the arrays afterwards moves nothing else.
                want_l, want_r = lids.copy(), rids.copy()
                lids[:], rids[:] = 9, 9
                for run in range(3):
                    for v in src:
                        v[:] = np.frombuffer(os.urandom(v.size), dtype=np.uint8).reshape(v.shape)
                    before = [d.copy() for d in dst]
                    self.assertIsNone(p.run() if run % 2 else p())
                    self.check(dst, src, want_r, want_l, before)
                # Read, not waited for: the transfer id, then waited.
                back_l, back = self.layout(c, fill=False)
                before = [b.copy() for b in back]
                p = c.prepare_blocks("read", back_l, np.array([7], np.int32), to_layout(dst_l),
                                     np.array([14], np.int32), wait=False)
                self.assertEqual(c.wait(p.run(), timeout=5.0).state, pb.TRANSFER_STATE_SUCCEEDED)
                self.check(back, dst, [7], [14], before)
                # A long list (the id arena's path) and one of mixed widths go through transfer_blocks.
                for lw, rw, n in ((np.int64, np.int64, 16), (np.int32, np.int64, 5)):
                    perm = np.random.default_rng(n).permutation(BLOCKS)[:n]
                    before = [d.copy() for d in dst]
                    p = c.prepare_blocks("write", src_l, np.arange(n, dtype=lw), to_layout(dst_l), perm.astype(rw))
                    p.run()
                    self.check(dst, src, perm, np.arange(n), before)
                # Checked by the agent at every run, as transfer_blocks's ids are: refused, nothing moved.
                before = [d.copy() for d in dst]
                bad = c.prepare_blocks("write", src_l, np.array([0, 16], np.int64), to_layout(dst_l),
                                       np.array([1, 2], np.int64))
                for _ in range(2):
                    with self.assertRaises(grpc.RpcError) as e:
                        bad.run()
                    self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                for k, (d, b) in enumerate(zip(dst, before)):
                    self.assertTrue(np.array_equal(d, b), "a refused prepared transfer changed region %d" % k)
                with self.assertRaises(ValueError):
                    c.prepare_blocks("write", src_l, np.array([0, 1]), to_layout(dst_l), np.array([1]))
                with self.assertRaises(TypeError):
                    c.prepare_blocks("write", src_l, np.array([0]), dst_l, np.array([1]))
                # A layout deregistered since is refused at the run.
                c.deregister_layout(back_l)
                gone = c.prepare_blocks("read", back_l, np.array([0], np.int32), to_layout(dst_l),
                                        np.array([0], np.int32))
                with self.assertRaises(grpc.RpcError):
                    gone.run()

    def test_refusals_move_nothing(self):
        for c in (self.c, self.slow):
            with self.subTest(fast=c._fast is not None):
                src_l, src = self.layout(c)
                dst_l, dst = self.layout(c, fill=False)
                before = [d.copy() for d in dst]
                other_block, _ = self.layout(c, blocks=BLOCKS * 2, block=BLOCK // 2)  # same bytes, other blocks
                one_region, _ = self.layout(c, regions=1)
                fewer_blocks, fewer = self.layout(c, blocks=BLOCKS - 1, fill=False)
                i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
                cases = {
                    "out-of-range local id": (src_l, i64(0, 16), to_layout(dst_l), i64(1, 2)),
                    "out-of-range remote id": (src_l, i64(0, 1), to_layout(dst_l), i64(1, 16)),
                    "negative id": (src_l, np.array([-1], dtype=np.int32), to_layout(dst_l), np.array([0], np.int32)),
                    "duplicate destination ids": (src_l, i64(0, 1, 2), to_layout(dst_l), i64(4, 5, 4)),
                    "other block size": (src_l, i64(0), to_layout(other_block), i64(0)),
                    "other region count": (src_l, i64(0), to_layout(one_region), i64(0)),
                    # Block counts may differ (the agent checks block size and region count): ids are checked
                    # against each side's own count.
                    "id past the smaller layout": (src_l, i64(0), to_layout(fewer_blocks), i64(BLOCKS - 1)),
                }
                for name, (local, lids, remote, rids) in cases.items():
                    with self.subTest(name):
                        with self.assertRaises(grpc.RpcError) as e:
                            c.transfer_blocks("write", local, lids, remote, rids)
                        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                        if c._fast is not None:
                            self.assertIsInstance(e.exception, AgentError)
                        for k, (d, b) in enumerate(zip(dst, before)):
                            self.assertTrue(np.array_equal(d, b), "%s changed region %d" % (name, k))
                # Layouts of other block counts but one block size and region count pair up.
                was = [f.copy() for f in fewer]
                c.transfer_blocks("write", src_l, i64(15, 0), to_layout(fewer_blocks), i64(14, 3))
                self.check(fewer, src, [14, 3], [15, 0], was)
                # Unequal counts never leave the client; the agent refuses them too.
                with self.assertRaises(ValueError):
                    c.transfer_blocks("write", src_l, i64(0, 1), to_layout(dst_l), i64(1))
                lm, _, _ = pack_ids(i64(0, 1))
                rm, _, _ = pack_ids(i64(1))
                with self.assertRaises(grpc.RpcError) as e:
                    if c._fast is not None:
                        c._fast_call(blocks_frame(pb.OP_WRITE, src_l.id, to_layout(dst_l).ref, lm, rm, 8))
                    else:
                        c.stub.TransferBlocks(pb.TransferBlocksRequest(
                            op=pb.OP_WRITE, layout_id=src_l.id, remote=to_layout(dst_l).ref, local_ids=lm.tobytes(),
                            remote_ids=rm.tobytes(), id_bytes=8, wait=True), timeout=5)
                self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, e.exception.details())
                for k, (d, b) in enumerate(zip(dst, before)):
                    self.assertTrue(np.array_equal(d, b), "unequal counts changed region %d" % k)


if __name__ == "__main__":
    unittest.main()
