# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Tests of the Python client against a real agent socket: FABRICXFER_SOCKET names it (client/python_test.go
starts an agent and runs this with /usr/bin/python3)."""

import array
import fcntl
import gc
import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
import weakref

import grpc

import fabricxfer.client

from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.client import (AgentError, AgentUnreachable, Client, Item, Region, SessionLost, TransferFailed, shared_memory,
                               to_descriptor, to_layout, to_region, to_segment)

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")


@unittest.skipUnless(SOCKET, "FABRICXFER_SOCKET not set: run through go test ./client")
class ClientTest(unittest.TestCase):
    def setUp(self):
        self.c = Client(SOCKET)
        self.addCleanup(self.c.close)

    def shm(self, size, fill=True):
        fd, buf = shared_memory("py-test", size)
        self.addCleanup(os.close, fd)
        self.addCleanup(buf.close)
        if fill:
            buf[:] = os.urandom(size)
        return fd, buf

    def await_segment_gone(self, segment, what):
        """Waits up to 5 s for this node's segment to be NOT_FOUND."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.c.resolve_segment("", segment)
            except AgentError as e:
                self.assertEqual(e.code(), grpc.StatusCode.NOT_FOUND)
                return
            self.assertLess(time.monotonic(), deadline, "%s still resolves after 5 s" % what)
            time.sleep(0.01)

    def test_info_names_the_caller_and_version(self):
        self.assertEqual(self.c.info.api_version, "v1")
        self.assertEqual(self.c.info.caller.pid, os.getpid())
        with self.assertRaises(grpc.RpcError) as e:
            self.c.stub.GetInfo(pb.GetInfoRequest(api_versions=["v9"]))
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_write_and_read_back_checksums_match(self):
        size = 1 << 20
        sfd, src = self.shm(size)
        dfd, dst = self.shm(size, fill=False)
        rs = self.c.register_host(sfd, 0, size)
        rd = self.c.register_host(dfd, 0, size, segment="py-dst")
        items = [Item(rs, to_segment("", "py-dst"), 64 << 10, off, off, tag="blk%d" % (off >> 16))
                 for off in range(0, size // 2, 64 << 10)]
        tid = self.c.transfer("write", items, timeout=5.0, wait=False)
        st = self.c.wait(tid, timeout=5.0)
        self.assertEqual(st.state, pb.TRANSFER_STATE_SUCCEEDED)
        self.c.read(rd, size // 2, to_region(rs), size // 2, size // 2)
        self.assertEqual(hashlib.sha256(src).hexdigest(), hashlib.sha256(dst).hexdigest())
        # The descriptor is a capability another client may use.
        other = Client(SOCKET)
        self.addCleanup(other.close)
        ofd, obuf = self.shm(4096, fill=False)
        ro = other.register_host(ofd, 0, 4096)
        other.read(ro, 0, to_descriptor(rd.descriptor), 0, 4096)
        self.assertEqual(bytes(obuf[:4096]), bytes(src[:4096]))

    def test_bad_fd_and_out_of_range_are_refused_and_change_nothing(self):
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        with self.assertRaises(grpc.RpcError) as e:
            self.c.register_host(r, 0, 4096)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertRegex(e.exception.details(), "is a pipe")
        # The fd socket takes one descriptor per PUT: more are refused or closed, never kept.
        line = self._send_two_fds()
        self.assertTrue(line.startswith("ERR") or line.startswith("OK "), line)

        sfd, src = self.shm(8192)
        dfd, dst = self.shm(8192, fill=False)
        rs, rd = self.c.register_host(sfd, 0, 8192), self.c.register_host(dfd, 0, 8192)
        with self.assertRaises(grpc.RpcError) as e:
            self.c.transfer("write", [Item(rs, to_region(rd), 4096, tag="ok"),
                                      Item(rs, to_region(rd), 4096, 4096, 8000, tag="overrun")])
        self.assertEqual(e.exception.code(), grpc.StatusCode.OUT_OF_RANGE)
        self.assertIn('"overrun"', e.exception.details())
        self.assertEqual(bytes(dst), bytes(8192), "a refused batch changed the destination")

    def test_memory_nobody_touched_is_refused_raw_and_populated_by_register_host(self):
        # shared_memory's pages are allocated when it is made, charged to this process.
        fd, buf = self.shm(1 << 20, fill=False)
        self.assertEqual(fabricxfer.client._first_untouched(fd, 0, 1 << 20), 1 << 20)
        page, size = os.sysconf("SC_PAGE_SIZE"), 16 << 20
        mine = os.memfd_create("py-untouched", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, mine)
        os.ftruncate(mine, size)
        fcntl.fcntl(mine, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        written = os.urandom(4 * page)
        os.pwrite(mine, written, 8 * page)  # pages 8..11 written, the rest untouched
        os.lseek(mine, 77, os.SEEK_SET)
        # Registered without the client's help, as another program might: refused, naming the byte and what to do,
        # and the agent touched none of the pages.
        req = pb.RegisterMemoryRequest(kind=pb.MEMORY_KIND_HOST, handle_type=pb.HANDLE_TYPE_SHM_FD, offset=8 * page,
                                       length=4 * page + 1, fd_token=fabricxfer.client.put_fd(self.c.fd_socket, mine))
        with self.assertRaises(grpc.RpcError) as e:
            self.c.stub.RegisterMemory(req, timeout=5.0)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("byte %d of range" % (12 * page), e.exception.details())
        self.assertIn("MAP_POPULATE", e.exception.details())
        self.assertEqual(fabricxfer.client._first_untouched(mine, 0, size), 0)
        # register_host reads the untouched pages first: the whole memfd registers, no byte changed, and the
        # descriptor's offset is where it was.
        r = self.c.register_host(mine, 0, size)
        self.assertEqual(fabricxfer.client._first_untouched(mine, 0, size), size)
        self.assertEqual(os.lseek(mine, 0, os.SEEK_CUR), 77)
        want = bytearray(size)
        want[8 * page:12 * page] = written
        self.assertEqual(os.pread(mine, size, 0), bytes(want))
        self.c.write(r, 8 * page, to_region(r), 100 * page, 4 * page)
        self.assertEqual(os.pread(mine, 4 * page, 100 * page), written)
        # What is no memfd is neither reopened nor filled: a FIFO without a writer (reopening it would block for
        # good) and a sparse file (filling it would read it all in) get the agent's refusal at once; so does an
        # offset past 2^63, which the checks must not fail on first.
        d = self.enterContext(tempfile.TemporaryDirectory())
        os.mkfifo(d + "/fifo")
        fifo = os.open(d + "/fifo", os.O_RDONLY | os.O_NONBLOCK)
        self.addCleanup(os.close, fifo)
        sparse = os.open(d + "/sparse", os.O_RDWR | os.O_CREAT)
        self.addCleanup(os.close, sparse)
        os.ftruncate(sparse, 1 << 30)
        for what, f, off in (("fifo", fifo, 0), ("sparse file", sparse, 0), ("offset 2^63", mine, 1 << 63)):
            t0 = time.monotonic()
            with self.assertRaises(grpc.RpcError) as e:  # the fd socket's refusal (a pipe) or the agent's
                self.c.register_host(f, off, 4096)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, what)
            self.assertLess(time.monotonic() - t0, 3.0, what)
        with self.assertRaises(OSError):  # still sparse: nothing was read in
            os.lseek(sparse, 0, os.SEEK_DATA)
        # The client's timeout bounds the touching: past it, DeadlineExceeded names what to do, and nothing is
        # registered.
        fresh = os.memfd_create("py-untouched-late", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, fresh)
        os.ftruncate(fresh, 256 << 20)
        usage = lambda: self.c.stub.GetInfo(pb.GetInfoRequest(api_versions=["v1"]), metadata=self.c._session_md).usage
        held = usage().registered_bytes
        self.c.timeout, timeout = 1e-9, self.c.timeout
        try:
            with self.assertRaises(fabricxfer.client.DeadlineExceeded) as e:
                self.c.register_host(fresh, 0, 256 << 20)
        finally:
            self.c.timeout = timeout
        self.assertIn("shared_memory()", str(e.exception))
        self.assertEqual(fabricxfer.client._first_untouched(fresh, 0, 256 << 20), 0)
        self.assertEqual(usage().registered_bytes, held)

    def _send_two_fds(self):
        import socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5.0)
            s.connect(self.c.fd_socket)
            socket.send_fds(s, [b"PUT\n"], [0, 1])
            return s.recv(256).decode()

    def test_notification_reaches_the_target(self):
        sfd, _ = self.shm(4096)
        dfd, _ = self.shm(4096, fill=False)
        rs, rd = self.c.register_host(sfd, 0, 4096), self.c.register_host(dfd, 0, 4096, segment="py-inbox")
        stream = self.c.notifications([rd])
        got = []
        t = threading.Thread(target=lambda: got.append(next(stream)))
        t.start()
        self.c.transfer("write", [Item(rs, to_segment("", "py-inbox"), 4096)], notify=b"block ready")
        t.join(5.0)
        stream.cancel()
        self.assertTrue(got, "no notification within 5 s")
        self.assertEqual(got[0].payload, b"block ready")
        self.assertEqual(got[0].region_id, rd.id)

    def test_notify_payloads_the_agent_would_not_deliver_are_refused_naming_the_limit(self):
        # notify=b"" travelled as none (the listener waited for nothing); a payload past the agent's 64 KiB was
        # refused by it through gRPC, and on the fast socket past 4 MiB broke the connection as SessionLost.
        most = self.c.info.limits.max_notify_bytes
        self.assertEqual(most, 64 << 10)
        fd, buf = self.shm(4 * 4096)
        r = self.c.register_host(fd, 0, 4 * 4096)
        lay = self.c.register_layout([r], 4096)
        ids, rids = array.array("q", [0]), array.array("q", [3])
        calls = (lambda notify, wait=True: self.c.transfer("write", [Item(r, to_region(r), 64, remote_offset=4096)],
                                                           notify=notify, wait=wait),
                 lambda notify, wait=True: self.c.transfer_blocks("write", lay, ids, to_layout(lay), rids,
                                                                  notify=notify, wait=wait))
        for call in calls:
            for wait in (True, False):
                with self.assertRaisesRegex(ValueError, "sends no notification"):
                    call(b"", wait)
                for size in (most + 1, 5 << 20):
                    with self.assertRaisesRegex(ValueError, "at most %d .info.limits.max_notify_bytes" % most):
                        call(b"z" * size, wait)
                with self.assertRaisesRegex(TypeError, "notify is bytes"):
                    call("text", wait)
                try:
                    import numpy as np
                except ImportError:
                    continue
                # Counted in bytes, not items: no bytes in three rows, and 8-byte items past the limit.
                with self.assertRaisesRegex(ValueError, "sends no notification"):
                    call(np.zeros((3, 0), np.uint8), wait)
                with self.assertRaisesRegex(ValueError, "notify is %d bytes" % (most // 4 * 8)):
                    call(np.zeros(most // 4, np.uint64), wait)
        stream = self.c.notifications([r])
        self.addCleanup(stream.cancel)
        got = []
        t = threading.Thread(target=lambda: got.append(next(stream)))
        t.start()
        buf[:4096] = os.urandom(4096)
        self.c.transfer_blocks("write", lay, ids, to_layout(lay), rids, notify=bytearray(b"n" * most))
        t.join(5.0)
        self.assertTrue(got, "no notification within 5 s")
        self.assertEqual(got[0].payload, b"n" * most)
        self.assertEqual(bytes(buf[3 * 4096:4 * 4096]), bytes(buf[:4096]))
        self.assertIsNotNone(self.c._fast, "a refused payload dropped the fast connection")

    def test_refusals_of_the_connection_itself_raise_agent_error(self):
        # Client()'s GetInfo went around the conversion: an API version the agent does not speak raised gRPC's
        # own error, which `except AgentError` missed.
        from unittest import mock
        import fabricxfer.client as fxc
        with mock.patch.object(fxc, "API_VERSION", "v0"):
            with self.assertRaises(AgentError) as e:
                Client(SOCKET)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION, e.exception.details())

    def test_a_published_layout_resolves_to_its_geometry(self):
        # A consumer started before its producer could learn of the layout only by failed transfers, and its
        # geometry only from a refusal naming it.
        with self.assertRaises(AgentError) as e:  # gRPC's refusal raised as the fast socket's are
            self.c.resolve_layout("", "py-geometry")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIsInstance(e.exception, grpc.RpcError)
        fds = [self.shm(3 * 8192)[0] for _ in range(2)]
        lay = self.c.register_layout([self.c.register_host(fd, 0, 3 * 8192) for fd in fds], 8192,
                                     segment="py-geometry")
        g = self.c.resolve_layout("", "py-geometry")
        self.assertEqual((g.block_bytes, g.blocks, g.regions), (8192, 3, 2))
        self.c.register_host(self.shm(4096)[0], 0, 4096, segment="py-geometry-region")
        with self.assertRaisesRegex(grpc.RpcError, "is a region's segment") as e:
            self.c.resolve_layout("", "py-geometry-region")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaisesRegex(grpc.RpcError, "resolve_layout") as e:
            self.c.resolve_segment("", "py-geometry")
        self.c.deregister_layout(lay)
        with self.assertRaises(grpc.RpcError) as e:
            self.c.resolve_layout("", "py-geometry")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_a_for_loop_over_notifications_ends_when_the_stream_is_cancelled(self):
        # Every listening thread ended in a traceback: gRPC's iterator raised CANCELLED into the loop.
        sfd, _ = self.shm(4096)
        dfd, _ = self.shm(4096, fill=False)
        rs, rd = self.c.register_host(sfd, 0, 4096), self.c.register_host(dfd, 0, 4096, segment="py-loop")
        stream = self.c.notifications([rd])
        got, ended = [], []

        def listen():
            try:
                for n in stream:
                    got.append(n.payload)
                ended.append("loop ended")
            except Exception as e:
                ended.append(e)
        t = threading.Thread(target=listen)
        t.start()
        for k in range(3):
            self.c.transfer("write", [Item(rs, to_segment("", "py-loop"), 4096)], notify=b"n%d" % k)
        deadline = time.monotonic() + 5
        while len(got) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        stream.cancel()
        t.join(5.0)
        self.assertFalse(t.is_alive(), "the loop went on after cancel()")
        self.assertEqual(ended, ["loop ended"])
        self.assertEqual(got, [b"n0", b"n1", b"n2"])

    def test_a_loop_over_a_cancelled_stream_ends_when_close_follows_at_once(self):
        # A decode process's shutdown, cancel() and then close(): the loop raised ClientClosed, every time.
        for round_ in range(5):
            c = Client(SOCKET)
            fd, _ = self.shm(4096)
            r = c.register_host(fd, 0, 4096)
            stream = c.notifications([r])
            ended = []

            def listen():
                try:
                    for _ in stream:
                        pass
                    ended.append("loop ended")
                except Exception as e:
                    ended.append(e)
            t = threading.Thread(target=listen)
            t.start()
            time.sleep(0.01)
            stream.cancel()
            c.close()
            t.join(5.0)
            self.assertFalse(t.is_alive(), "round %d: the loop went on after cancel() and close()" % round_)
            self.assertEqual(ended, ["loop ended"], "round %d" % round_)

    def test_a_pool_slice_keeps_its_client(self):
        # The loan is the client's session's: a client collected without close() under a slice still in use
        # ended the loan, and the slice's mapping silently stopped being the agent's memory.
        if not self.c.info.HasField("pool_memory"):
            self.skipTest("the agent has no pool memory")
        c = Client(SOCKET)
        ref = weakref.ref(c)
        s = c.allocate_from_pool(4096, segment="py-pool-kept")
        del c
        gc.collect()
        self.assertIsNotNone(ref(), "a client was collected under its pool slice")
        self.c.resolve_segment("", "py-pool-kept")  # still lent
        ref().release(s)
        ref().close()

    def test_pool_memory_round_trip(self):
        if not self.c.info.HasField("pool_memory"):
            self.skipTest("the agent has no pool memory")
        s = self.c.allocate_from_pool(64 << 10, segment="py-pool")
        s.data[:] = os.urandom(64 << 10)
        dfd, dst = self.shm(64 << 10, fill=False)
        rd = self.c.register_host(dfd, 0, 64 << 10)
        self.c.write(s.region, 0, to_region(rd), 0, 64 << 10)
        self.assertEqual(bytes(s.data), bytes(dst))
        self.c.release(s)

    def test_fast_path_and_grpc_answer_alike(self):
        slow = Client(SOCKET, fast=False)
        self.addCleanup(slow.close)
        self.assertIsNotNone(self.c._fast, "the fast path was not opened")
        for c in (self.c, slow):
            sfd, src = self.shm(8192)
            dfd, dst = self.shm(8192, fill=False)
            rs, rd = c.register_host(sfd, 0, 8192), c.register_host(dfd, 0, 8192)
            c.write(rs, 0, to_region(rd), 0, 8192)
            self.assertEqual(bytes(src), bytes(dst))
            with self.assertRaises(grpc.RpcError) as e:
                c.write(rs, 0, to_region(rd), 4096, 8192)
            self.assertEqual(e.exception.code(), grpc.StatusCode.OUT_OF_RANGE)

    def test_each_client_is_a_session_of_its_own(self):
        # gRPC shares one connection between channels of one target unless told not to, and the agent ties
        # regions to the connection: closing one client must free its regions (and names) while another client of
        # the same process stays open and keeps its own.
        fd, buf = self.shm(4096)
        kept = self.c.register_host(fd, 0, 4096, segment="py-kept")
        for k in range(3):
            c = Client(SOCKET)
            c.register_host(fd, 0, 4096, segment="py-own-session")
            c.close()
            deadline = time.monotonic() + 5
            while True:  # the agent frees the closed session's regions once it sees the connection end
                probe = Client(SOCKET)
                try:
                    probe.register_host(fd, 0, 4096, segment="py-own-session")
                    break
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.ALREADY_EXISTS, e.details())
                    self.assertLess(time.monotonic(), deadline, "round %d: a closed client's segment is still "
                                    "registered after 5 s" % k)
                    time.sleep(0.05)
                finally:
                    probe.close()
        self.c.write(kept, 0, to_segment("", "py-kept"), 0, 16)

    def test_the_agents_own_unavailable_is_not_a_lost_session(self):
        # UNAVAILABLE is also what the agent answers for a peer it cannot reach; the session is fine, and
        # recover() on a live session registers nothing again (region ids stay, no second copy is held).
        slow = Client(SOCKET, fast=False)
        self.addCleanup(slow.close)
        fd, _ = self.shm(4096)
        r = slow.register_host(fd, 0, 4096)
        before = r.id
        # The agent marks its own answer, so the client raises it at once instead of watching its connection for
        # a quarter of a second (which a 1 ms timeout paid on every such call).
        for c in (self.c, slow):
            t0 = time.monotonic()
            with self.assertRaises(grpc.RpcError) as e:
                c.transfer("write", [Item(r if c is slow else self.c.register_host(fd, 0, 4096),
                                          to_segment("node-nowhere", "kv"), 16)], timeout=0.001)
            self.assertNotIsInstance(e.exception, SessionLost)
            # gRPC reports the channel's state on its own thread, so a new client may not have seen READY yet when
            # the agent answers: the answer alone says the session is up.
            with c._lock:
                seen, c._state = c._state, grpc.ChannelConnectivity.CONNECTING
            try:
                with self.assertRaises(grpc.RpcError) as e:
                    c.resolve_segment("node-nowhere", "kv")
                self.assertNotIsInstance(e.exception, SessionLost, "an answered UNAVAILABLE before READY was seen")
            finally:
                with c._lock:
                    c._state = seen
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())
            t1 = time.monotonic()
            with self.assertRaises(grpc.RpcError) as e:
                c.resolve_segment("node-nowhere", "kv")
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, e.exception.details())
            self.assertLess(max(t1 - t0, time.monotonic() - t1), 0.2, "an UNAVAILABLE the agent answered was held")
        slow.recover()
        self.assertEqual(r.id, before, "recover() on a live session registered the region again")
        slow.write(r, 0, to_region(r), 2048, 16)

    def test_a_call_that_reaches_another_session_is_refused_as_a_lost_one(self):
        # Every call names the session the client's memory is in; one that reaches another (the agent restarted,
        # or gRPC made the connection again under the call) is refused before it registers anything.
        c = Client(SOCKET, fast=False)
        self.addCleanup(c.close)
        self.assertTrue(c.info.instance and c.info.session, "the agent names no instance or session")
        fd, _ = self.shm(4096)
        mine = c._session_md
        c._session_md = (("fabricxfer-session", "%s/%d" % (c.info.instance, c.info.session + 1)),)
        with self.assertRaises(SessionLost) as e:
            c.register_host(fd, 0, 4096, segment="py-other-session")
        self.assertIn("session lost", str(e.exception))
        c._session_md = mine
        c.register_host(fd, 0, 4096, segment="py-other-session")  # the refused one held nothing

    def test_threads_recovering_a_dropped_fast_socket_open_one(self):
        # Only the fast socket ended (the session lives): of three threads that each call recover(), one opens a
        # new fast socket and the others return, rather than each closing the one the last had just opened.
        c = Client(SOCKET)
        self.addCleanup(c.close)
        fd, _ = self.shm(8192)
        r = c.register_host(fd, 0, 8192)
        before = r.id
        with c._fast_lock:
            c._fast.close()
            c._fast = None
        opened, real = [], c._open_fast
        c._open_fast = lambda: (opened.append(1), real())
        go = threading.Event()
        threads = [threading.Thread(target=lambda: (go.wait(10), c.recover(timeout=10))) for _ in range(3)]
        for th in threads:
            th.start()
        go.set()  # all three ask at once; one recovery takes 50 ms or more (it waits for the connection to settle)
        for th in threads:
            th.join(30)
        self.assertEqual(len(opened), 1, "fast sockets opened by three recovering threads")
        self.assertIsNotNone(c._fast)
        self.assertEqual(r.id, before, "recover() of a live session registered the region again")
        c.write(r, 0, to_region(r), 4096, 64)

    def test_recover_of_a_live_session_leaves_other_threads_calls_alone(self):
        # Nothing was lost: the fast connection stays, and the calls other threads make on it go on (recover()
        # closed it first, and each call that came meanwhile raised SessionLost).
        c = Client(SOCKET)
        self.addCleanup(c.close)
        fd, _ = self.shm(8192)
        lay = c.register_layout([c.register_host(fd, 0, 8192)], 4096)
        fast, stop, errors, calls = c._fast, threading.Event(), [], [0]
        ids, rids = array.array("q", [0]), array.array("q", [1])

        def loop():
            while not stop.is_set():
                try:
                    c.transfer_blocks("write", lay, ids, to_layout(lay), rids)
                    calls[0] += 1
                except Exception as e:  # noqa: BLE001 - any error fails the test
                    errors.append(repr(e))
                    return
        threads = [threading.Thread(target=loop) for _ in range(3)]
        for th in threads:
            th.start()
        try:
            for _ in range(10):
                c.recover(timeout=5)
                time.sleep(0.02)
        finally:
            stop.set()
            for th in threads:
                th.join(30)
        self.assertEqual(errors, [], "calls of other threads while recover() ran on a live session")
        self.assertIs(c._fast, fast, "recover() of a live session replaced its working fast connection")
        self.assertGreater(calls[0], 0)

    def test_a_client_dropped_without_close_ends_its_session(self):
        # gRPC's connectivity watch held the client: one dropped without close() kept its session, its names and
        # its fast connection (one of its caller's 32) for the life of the process.
        fd, _ = self.shm(8192)

        def dropped():
            c = Client(SOCKET)
            c.register_layout([c.register_host(fd, 0, 8192, segment="py-dropped")], 4096, segment="py-dropped-kv")
            return weakref.ref(c)
        ref = dropped()
        gc.collect()
        self.assertIsNone(ref(), "a client dropped without close() is still alive")
        self.await_segment_gone("py-dropped", "the dropped client's segment")
        with self.assertRaises(AgentError) as e:
            self.c.resolve_layout("", "py-dropped-kv")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_a_fast_connection_refused_on_reopening_is_that_refusal_not_a_lost_session(self):
        # The caller's fast connections all taken (outside Kubernetes every process of a user is one caller): a
        # client whose connection was dropped (an interrupted call) hears the agent's RESOURCE_EXHAUSTED when it
        # opens it again, not SessionLost (its session is fine, and recover() would fail alike), and the next call
        # opens it once there is room.
        c = Client(SOCKET)
        self.addCleanup(c.close)
        fd, buf = self.shm(8192)
        r = c.register_host(fd, 0, 8192)
        with c._fast_lock:
            c._fast_drop(c._fast)  # what an interrupted call leaves
        others = []
        try:
            for _ in range(40):
                try:
                    others.append(Client(SOCKET))
                except AgentError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                    break
            else:
                self.fail("40 clients of one caller bound 40 fast connections")
            with self.assertRaises(AgentError) as e:
                c.write(r, 0, to_region(r), 4096, 64)
            self.assertEqual(e.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.exception.details())
            others.pop().close()
            c.write(r, 0, to_region(r), 4096, 64)
            self.assertEqual(bytes(buf[4096:4160]), bytes(buf[:64]))
        finally:
            for o in others:
                o.close()

    def test_waited_transfers_carry_the_clients_deadline_and_calls_outlast_theirs(self):
        # A waited transfer without a timeout is given the client's, so the agent ends it and answers before the
        # call gives up; a gRPC call waits for its transfer's own timeout, not only the client's.
        seen = []

        class Stub:
            def Transfer(self, req, timeout=None, **kw):
                seen.append((req.timeout.ToNanoseconds() / 1e9 if req.HasField("timeout") else None, timeout))
                return pb.TransferResponse(transfer_id=1, status=pb.TransferStatus(
                    state=pb.TRANSFER_STATE_SUCCEEDED))

        c = Client.__new__(Client)
        c.stub, c.timeout, c._fast, c._losses, c._session = Stub(), 0.2, None, 0, 0
        c.info = pb.GetInfoResponse(features=["fast-call-timeout"])
        r = Region(id=1, length=4096)
        c.transfer("write", [Item(r, to_region(r), 16)])
        c.transfer("write", [Item(r, to_region(r), 16)], timeout=5.0)
        c.transfer("write", [Item(r, to_region(r), 16)], wait=False)
        self.assertEqual(seen[0], (0.2, 1.2))
        self.assertEqual(seen[1], (5.0, 6.0))
        # Unwaited without a timeout: the transfer keeps the agent's default, the call the client's timeout (the
        # agent ends a gRPC call's work before its deadline); an older agent may hold it up to that default.
        self.assertEqual(seen[2], (None, 1.2))
        c.info = pb.GetInfoResponse()
        c.transfer("write", [Item(r, to_region(r), 16)], wait=False)
        self.assertEqual(seen[3], (None, 61.0))

    def test_calls_after_close_say_the_client_is_closed(self):
        # As the Go client's ErrClosed: every call after close() raises one error that says so, not gRPC's
        # "Cannot invoke RPC on closed channel!" or what an empty client would say ("holds no regions").
        for fast in (True, False):
            c = Client(SOCKET, fast=fast)
            fd, _ = self.shm(8192)
            r = c.register_host(fd, 0, 8192)
            lay = c.register_layout([r], 4096)
            one, other, many = array.array("q", [0]), array.array("q", [1]), array.array("q", [0]) * 2048
            prepared = c.prepare_blocks("write", lay, one, to_layout(lay), other)
            tid = c.transfer("write", [Item(r, to_region(r), 16, 0, 4096)], wait=False)
            pool = c.allocate_from_pool(4096) if c.info.HasField("pool_memory") else None
            c.close()
            calls = {
                "register_host": lambda: c.register_host(fd, 0, 4096),
                "register_tensor": lambda: c.register_tensor(None),
                "register_layout": lambda: c.register_layout([r], 4096),
                "deregister": lambda: c.deregister(r),
                "deregister_layout": lambda: c.deregister_layout(lay),
                "allocate_from_pool": lambda: c.allocate_from_pool(4096),
                "transfer": lambda: c.transfer("write", [Item(r, to_region(r), 16)], wait=False),
                "write": lambda: c.write(r, 0, to_region(r), 4096, 16),
                "read": lambda: c.read(r, 0, to_region(r), 4096, 16),
                "transfer_blocks": lambda: c.transfer_blocks("write", lay, one, to_layout(lay), other),
                "transfer_blocks arena": lambda: c.transfer_blocks("write", lay, many, to_layout(lay), many,
                                                                   wait=False),
                "prepare_blocks": lambda: c.prepare_blocks("write", lay, one, to_layout(lay), other),
                "PreparedBlocks.run": prepared.run,
                "wait": lambda: c.wait(tid),
                "wait_all": lambda: c.wait_all([tid]),
                "cancel": lambda: c.cancel(tid),
                "resolve_segment": lambda: c.resolve_segment("", "py-any"),
                "notifications": c.notifications,
                "notifications of a region": lambda: c.notifications([r]),
                "recover": c.recover,
            }
            if pool is not None:
                calls["release"] = lambda: c.release(pool)
            for name, call in calls.items():
                with self.subTest(fast=fast, call=name):
                    with self.assertRaisesRegex(ValueError, "^the client is closed") as e:
                        call()
                    self.assertEqual(type(e.exception).__name__, "ClientClosed")
            c.close()  # again: nothing

    def test_a_socket_path_with_no_agent_says_so(self):
        start = time.monotonic()
        with self.assertRaises(AgentUnreachable) as e:
            Client(os.path.join(os.path.dirname(SOCKET), "no-such-pool", "agent.sock"), timeout=0.3)
        self.assertLess(time.monotonic() - start, 5)
        self.assertIn("no-such-pool", str(e.exception))
        self.assertIn("no socket there", str(e.exception))
        self.assertIsInstance(e.exception, grpc.RpcError)
        with self.assertRaises(AgentUnreachable) as e:
            Client(os.path.join(os.path.dirname(os.path.dirname(SOCKET)), "agent.sock"), timeout=0.3)
        self.assertIn("pools' sockets are in that folder: name %s" % os.path.realpath(SOCKET), str(e.exception))
        # A name mistyped beside the socket names the socket.
        with self.assertRaises(AgentUnreachable) as e:
            Client(os.path.join(os.path.dirname(SOCKET), "agnt.sock"), timeout=0.3)
        self.assertIn("beside it: name %s" % SOCKET, str(e.exception))

    def test_a_socket_path_with_a_scheme_or_too_long_is_refused_saying_so(self):
        for path, says in (("unix://" + SOCKET, "without the unix: scheme: " + SOCKET),
                           (os.path.join(os.path.dirname(SOCKET), "d" * 100, "agent.sock"),
                            "more than a Unix socket address holds")):
            start = time.monotonic()
            with self.assertRaises(AgentUnreachable) as e:
                Client(path, timeout=5)
            self.assertLess(time.monotonic() - start, 1, path)
            self.assertIn(says, str(e.exception))

    def test_a_link_to_the_socket_in_another_folder_reaches_the_agents_other_sockets(self):
        # They were looked for beside the link: registering failed on the descriptor socket, the fast path too.
        import tempfile
        d = tempfile.mkdtemp()
        link = os.path.join(d, "agent.sock")
        os.symlink(SOCKET, link)
        with Client(link) as c:
            fd, buf = self.shm(8192)
            r = c.register_host(fd, 0, 8192)
            c.write(r, 0, to_region(r), 4096, 64)
            self.assertEqual(bytes(buf[:64]), bytes(buf[4096:4096 + 64]))
            self.assertIsNotNone(c._fast, "no fast connection through the link")

    def test_agent_sock_mounted_alone_names_the_missing_socket_and_the_folder_to_mount(self):
        # A pod that mounts agent.sock alone (a hostPath of the file) reaches the agent but not the sockets beside
        # it: Client() raised a bare "No such file or directory" naming no path, and left its gRPC channel open;
        # a registration the same of the descriptor socket.
        import tempfile
        from unittest import mock
        alone = os.path.join(tempfile.mkdtemp(), "agent.sock")
        os.link(SOCKET, alone)  # the socket itself, without its folder
        opened = []
        real = grpc.insecure_channel
        with mock.patch.object(grpc, "insecure_channel", lambda *a, **k: opened.append(real(*a, **k)) or opened[-1]):
            with self.assertRaises(FileNotFoundError) as e:
                Client(alone)
        self.assertEqual(e.exception.filename, os.path.join(os.path.dirname(alone), "agent.fast.sock"))
        for says in ("mount the agent's whole socket folder", "fast=False"):
            self.assertIn(says, str(e.exception))
        with self.assertRaisesRegex(ValueError, "closed channel"):
            opened[0].unary_unary("/fabricxfer.agent.v1.Agent/GetInfo")(b"")
        with Client(alone, fast=False) as c:
            fd, _ = self.shm(4096)
            with self.assertRaises(FileNotFoundError) as e:
                c.register_host(fd, 0, 4096)
            self.assertEqual(e.exception.filename, os.path.join(os.path.dirname(alone), "agent.fd.sock"))
            self.assertIn("mount the agent's whole socket folder", str(e.exception))
        fd, buf = self.shm(8192)  # the agent serves the others as before
        r = self.c.register_host(fd, 0, 8192)
        buf[:64] = os.urandom(64)
        self.c.write(r, 0, to_region(r), 4096, 64)
        self.assertEqual(bytes(buf[:64]), bytes(buf[4096:4096 + 64]))

    def test_the_agents_other_sockets_are_refused_at_once_naming_agent_sock(self):
        # Its fast and descriptor sockets do not speak gRPC: a client there waited its whole timeout and blamed a
        # stopped agent.
        for name, kind in (("agent.fast.sock", "fast"), ("agent.fd.sock", "descriptor")):
            path = os.path.join(os.path.dirname(SOCKET), name)
            if not os.path.exists(path):
                continue  # an agent without that socket
            start = time.monotonic()
            with self.assertRaises(AgentUnreachable) as e:
                Client(path, timeout=10)
            self.assertLess(time.monotonic() - start, 2, name)
            self.assertIn("the agent's %s socket" % kind, str(e.exception))
            self.assertIn("name " + SOCKET, str(e.exception))

    def test_wrong_sides_are_refused_with_what_to_pass(self):
        fd, _ = self.shm(4096)
        r = self.c.register_host(fd, 0, 4096)
        lay = self.c.register_layout([r], 1024)
        ids = array.array("q", [1])
        for remote, says in ((lay, "to_layout"), (to_segment("", "x"), "to_layout"), (to_region(r), "name regions")):
            with self.assertRaisesRegex(TypeError, says):
                self.c.transfer_blocks("write", lay, ids, remote, ids)
        with self.assertRaisesRegex(TypeError, "of a Layout"):
            self.c.transfer_blocks("write", r, ids, to_layout(lay), ids)
        with self.assertRaisesRegex(TypeError, "to_region"):
            self.c.transfer("write", [Item(r, to_layout(lay), 16)])
        with self.assertRaisesRegex(TypeError, "Region"):
            to_region(lay)

    def test_closed_descriptors_and_negative_offsets_are_refused_naming_them(self):
        # A closed descriptor's number may already name another (the client's own socket to the agent was sent
        # in its place and refused as a socket); negative offsets got protobuf's "Value out of range: -1".
        fd, buf = self.shm(8192)
        r = self.c.register_host(fd, 0, 8192)
        closed = os.dup(fd)
        os.close(closed)
        with self.assertRaisesRegex(ValueError, "descriptor %d is not open" % closed):
            self.c.register_host(closed, 0, 4096)
        for bad in (-1, "3"):
            with self.assertRaisesRegex((ValueError, TypeError), "open descriptor"):
                self.c.register_host(bad, 0, 4096)
        with self.assertRaisesRegex(ValueError, "byte counts from 0"):
            self.c.register_host(fd, -1, 4096)
        with self.assertRaisesRegex(ValueError, "item 0: offsets and length"):
            self.c.write(r, -1, to_region(r), 4096, 64)
        with self.assertRaisesRegex(ValueError, "item 1: offsets and length"):
            self.c.transfer("write", [Item(r, to_region(r), 64, 0, 4096), Item(r, to_region(r), -64, 0, 4096)])
        before = bytes(buf)
        self.c.write(r, 0, to_region(r), 4096, 64)  # the region still works, and only it moved
        self.assertEqual(bytes(buf[4096:4096 + 64]), before[:64])

    def test_timeouts_that_are_not_seconds_are_refused_with_what_to_pass(self):
        # NaN, infinite and negative timeouts raise one ValueError that says what a timeout is, before any call;
        # nothing moves.
        fd, buf = self.shm(4096)
        r = self.c.register_host(fd, 0, 4096)
        lay = self.c.register_layout([r], 1024)
        before = bytes(buf)
        ids, other = array.array("q", [1]), array.array("q", [2])
        calls = {
            "transfer_blocks": lambda t: self.c.transfer_blocks("write", lay, ids, to_layout(lay), other, timeout=t),
            "transfer": lambda t: self.c.transfer("write", [Item(r, to_region(r), 16, 0, 2048)], timeout=t),
            "unwaited transfer": lambda t: self.c.transfer("write", [Item(r, to_region(r), 16, 0, 2048)], timeout=t,
                                                           wait=False),
            "wait": lambda t: self.c.wait(1, timeout=t),
            "wait_all": lambda t: self.c.wait_all([1], timeout=t),
            "recover": lambda t: self.c.recover(timeout=t),
            "Client": lambda t: Client(SOCKET, timeout=t),
        }
        for name, call in calls.items():
            for bad in (float("nan"), float("inf"), -1.0, 1e12, "5", True):
                with self.assertRaisesRegex(ValueError, "must be .*seconds", msg="%s(timeout=%r)" % (name, bad)):
                    call(bad)
        with self.assertRaisesRegex(ValueError, "positive"):
            Client(SOCKET, timeout=0)
        self.assertEqual(bytes(buf), before, "a refused call moved bytes")
        self.c.transfer_blocks("write", lay, ids, to_layout(lay), other, timeout=2.5)
        # A timeout shorter than a nanosecond is one nanosecond, not 0 (the agent's default of 60 s), and a wait
        # that has next to no time asks the agent all the same (a transfer that ended is not called pending).
        for name in ("transfer_blocks", "transfer"):
            with self.assertRaises((TransferFailed, AgentError), msg=name) as e:  # its end, or the agent's answer
                calls[name](1e-12)
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED, name)
        tid = self.c.transfer_blocks("write", lay, ids, to_layout(lay), other, wait=False)
        self.c.wait(tid)
        self.assertEqual(self.c.wait_all([tid], timeout=1e-12).state, pb.TRANSFER_STATE_SUCCEEDED)

    def test_more_blocks_than_a_call_moves_are_refused_with_the_limit(self):
        # More blocks than the agent moves in a call are refused here with the limit, not by gRPC's message size
        # (past 4 MiB the request cannot even be read).
        fd, buf = self.shm(4096)
        r = self.c.register_host(fd, 0, 4096)
        lay = self.c.register_layout([r], 1024)
        before = bytes(buf)
        most = self.c.info.limits.max_items_per_transfer
        self.assertGreater(most, 0)
        for n in (most + 1, 600000):
            many = array.array("q", [0]) * n
            with self.assertRaisesRegex(ValueError, "at most %d blocks a call" % most):
                self.c.transfer_blocks("write", lay, many, to_layout(lay), many)
        self.assertEqual(bytes(buf), before, "a refused call moved bytes")

    def test_item_transfers_past_the_agents_limits_are_refused_with_them(self):
        # More items than a call moves, or a request the agent could not read (past 4 MiB, here through long
        # tags), are refused before anything is sent, naming the limit; the memory is untouched.
        fd, buf = self.shm(4096)
        r = self.c.register_host(fd, 0, 4096)
        before = bytes(buf)
        most = self.c.info.limits.max_items_per_transfer
        many = [Item(r, to_region(r), 1)] * (most + 1)
        with self.assertRaisesRegex(ValueError, "at most %d items a call" % most):
            self.c.transfer("write", many)
        wide = [Item(r, to_region(r), 1, tag="t" * 1000)] * 5000
        with self.assertRaisesRegex(ValueError, "requests of at most 4194304 bytes"):
            self.c.transfer("write", wide)
        self.assertEqual(bytes(buf), before, "a refused call moved bytes")
        self.c.transfer("write", [Item(r, to_region(r), 64, 0, 2048)])

    def test_to_region_follows_the_region_across_recover(self):
        fd, _ = self.shm(4096)
        r = self.c.register_host(fd, 0, 4096)
        remote = to_region(r)
        r.id = r.id + 1  # what recover() does in place
        self.assertEqual(remote.ref.region_id, r.id)

    def test_a_forked_child_can_neither_use_nor_break_its_parents_client(self):
        fd, buf = self.shm(8192)
        r = self.c.register_host(fd, 0, 8192)
        self.c.write(r, 0, to_region(r), 4096, 64)
        pid = os.fork()
        if pid == 0:  # the child: every use of the parent's client, and a new one, is refused at once
            code = 0
            try:
                for k, call in enumerate((lambda: self.c.write(r, 0, to_region(r), 4096, 64),
                                          lambda: self.c.recover(timeout=1),
                                          lambda: Client(SOCKET, timeout=1))):
                    try:
                        call()
                        code = code or 10 + k
                    except RuntimeError as e:
                        if "fork" not in str(e) and "spawn" not in str(e):
                            code = code or 20 + k
                self.c.close()
            except BaseException:
                code = code or 30
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        # The parent's client and connection are untouched, on the fast socket and through gRPC.
        buf[:64] = os.urandom(64)
        self.c.write(r, 0, to_region(r), 4096, 64)
        self.assertEqual(bytes(buf[:64]), bytes(buf[4096:4096 + 64]))
        slow = Client(SOCKET, fast=False)
        self.addCleanup(slow.close)
        self.assertEqual(slow.info.caller.pid, os.getpid())

    def test_a_forked_child_that_collects_its_parents_clients_exits(self):
        # A child holds its parent's clients for good: one collected there (dropped, or in a cycle the child's
        # collector finds, as a multiprocessing worker's does) closed its gRPC channel, whose cleanup waits for a
        # thread of the parent's: the child never exited.
        script = textwrap.dedent("""
            import gc, os, sys, time
            from fabricxfer.client import Client
            c = Client(%r)
            cycle = Client(%r, fast=False)
            cycle.me = cycle
            del cycle
            pid = os.fork()
            if pid == 0:
                del c
                gc.collect()
                sys.exit(0)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    print("child", os.waitstatus_to_exitcode(status))
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, 9)
                print("child hung")
            c.close()
        """) % (SOCKET, SOCKET)
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.assertEqual(out.stdout.strip(), "child 0", out.stderr[-2000:])
        self.assertEqual(out.returncode, 0, out.stderr[-2000:])

    def test_a_forked_child_that_exits_leaves_its_parents_notification_stream_open(self):
        # The child's copy of the parent's stream, collected when the child exited through sys.exit, cancelled the
        # stream on the parent's connection (gRPC cancels a call collected unfinished): the parent's reader waited
        # for ever and nothing said why. A child's cancel() did the same. A script of its own: as the test
        # process's child, unittest's own objects would run at its exit too.
        script = textwrap.dedent("""
            import os, sys, threading
            from fabricxfer.client import Client, Item, shared_memory, to_region
            c = Client(sys.argv[1])
            fd, buf = shared_memory("py-fork-notes", 8192)
            r = c.register_host(fd, 0, 8192)
            stream = c.notifications()
            for how in ("exit", "cancel"):
                pid = os.fork()
                if pid == 0:
                    if how == "cancel":
                        stream.cancel()
                    sys.exit(0)
                os.waitpid(pid, 0)
                got = []
                t = threading.Thread(target=lambda: got.append(next(stream).payload), daemon=True)
                t.start()
                c.transfer("write", [Item(r, to_region(r), 16, 0, 4096)], notify=how.encode())
                t.join(5)
                print(how, got == [how.encode()], flush=True)
            os._exit(0)
        """)
        package = os.path.dirname(os.path.dirname(os.path.abspath(fabricxfer.client.__file__)))
        env = dict(os.environ, PYTHONPATH=package)
        out = subprocess.run([sys.executable, "-c", script, SOCKET], capture_output=True, text=True, timeout=60,
                             env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split("\n")[:2], ["exit True", "cancel True"],
                         "the parent's stream after a child's exit, then a child's cancel():\n" + out.stdout + out.stderr)

    def test_names_are_free_when_close_returns(self):
        # close() ends the session with the agent, which frees the names before it answers: when only the
        # connection closed they went in the background (close() took 200 ms, gRPC's connectivity watch, and a
        # faster close left them registered), so a restarted engine registering them at once could find them taken.
        fd, _ = self.shm(8192)
        for round_ in range(10):
            c = Client(SOCKET)
            r = c.register_host(fd, 0, 8192, segment="py-close-names")
            c.register_layout([r], 4096, segment="py-close-kv")
            self.assertTrue(c.close(), "round %d: close() says the session did not end" % round_)
            self.assertTrue(c.close(), "round %d: closing again" % round_)
            with self.assertRaises(AgentError) as e:
                self.c.resolve_segment("", "py-close-names")
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, "round %d" % round_)
            with self.assertRaises(AgentError) as e:
                self.c.resolve_layout("", "py-close-kv")
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, "round %d" % round_)

    def test_close_says_when_the_agent_did_not_end_the_session(self):
        # Go's Close returns an error when the session did not end in time; Python's close() returned None either
        # way, and a caller registering the names elsewhere next could not know they might still be taken.
        c = Client(SOCKET)

        class Late(grpc.RpcError):
            def code(self):
                return grpc.StatusCode.DEADLINE_EXCEEDED

        def end_session(req, **kw):  # an agent that did not end the session within close()'s wait
            raise Late()
        c.stub.EndSession = end_session
        fd, _ = self.shm(4096)
        c.register_host(fd, 0, 4096, segment="py-close-late")
        self.assertIs(c.close(), False)
        self.assertIs(c.close(), False, "closing again")
        with self.assertRaisesRegex(ValueError, "^the client is closed"):
            c.resolve_segment("", "py-close-late")
        # The agent frees the names once it sees the connection go.
        self.await_segment_gone("py-close-late", "the segment of a closed client")

    def test_notifications_are_this_clients_own_and_refusals_raise_at_once(self):
        # The agent's filter is the caller (every client of this process here): by default a client listens to
        # the regions it holds, so another client's notified write does not reach its stream.
        other = Client(SOCKET)
        self.addCleanup(other.close)
        empty = Client(SOCKET)
        self.addCleanup(empty.close)
        with self.assertRaises(ValueError):
            empty.notifications()
        fd, _ = self.shm(3 * 4096)
        src = self.c.register_host(fd, 0, 4096)
        self.c.register_host(fd, 4096, 4096, segment="py-notes-mine")
        other.register_host(fd, 8192, 4096, segment="py-notes-theirs")
        stream = self.c.notifications()
        self.addCleanup(stream.cancel)
        got = []
        t = threading.Thread(target=lambda: got.append(next(stream)))
        t.start()
        self.c.transfer("write", [Item(src, to_segment("", "py-notes-theirs"), 16)], notify=b"theirs")
        self.c.transfer("write", [Item(src, to_segment("", "py-notes-mine"), 16)], notify=b"mine")
        t.join(5.0)
        self.assertTrue(got, "no notification within 5 s")
        self.assertEqual(got[0].payload, b"mine")
        with self.assertRaises(grpc.RpcError) as e:
            self.c.notifications([Region(id=12345, length=1)])
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())

    def test_cancel_answers_a_settled_transfer_and_refuses_unknown_ids(self):
        fd, _ = self.shm(8192)
        r = self.c.register_host(fd, 0, 8192)
        tid = self.c.transfer("write", [Item(r, to_region(r), 4096, 0, 4096)], wait=False)
        self.c.wait(tid, timeout=5.0)
        st = self.c.cancel(tid)
        self.assertEqual((st.transfer_id, st.state), (tid, pb.TRANSFER_STATE_SUCCEEDED))
        with self.assertRaises(grpc.RpcError) as e:
            self.c.cancel(tid + 1000)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())

    def test_unknown_segment_is_not_found(self):
        sfd, _ = self.shm(4096)
        rs = self.c.register_host(sfd, 0, 4096)
        with self.assertRaises(grpc.RpcError) as e:
            self.c.transfer("write", [Item(rs, to_segment("", "no-such-segment"), 16, tag="t")])
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_transfer_past_its_deadline_fails_with_its_tag(self):
        size = 64 << 20
        sfd, _ = self.shm(size, fill=False)
        dfd, _ = self.shm(size, fill=False)
        rs, rd = self.c.register_host(sfd, 0, size), self.c.register_host(dfd, 0, size)
        with self.assertRaises((TransferFailed, grpc.RpcError)) as e:
            self.c.transfer("write", [Item(rs, to_region(rd), size, tag="big")], timeout=1e-9)
        # Either way it ended, one except clause and code() tell it.
        self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED, e.exception.details())
        if isinstance(e.exception, grpc.RpcError):
            # An agent with engines that resolve peers first runs out of time before the transfer exists.
            self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED, e.exception.details())
            return
        self.assertEqual(e.exception.status.state, pb.TRANSFER_STATE_DEADLINE_EXCEEDED)
        self.assertEqual([f.tag for f in e.exception.status.failures], ["big"])
        # The failure's code as the agent spells it reads as the status code it is.
        self.assertEqual([fabricxfer.client._CODE_NAMES.get(f.code) for f in e.exception.status.failures],
                         [grpc.StatusCode.DEADLINE_EXCEEDED], e.exception.status)


class TransferFailedTest(unittest.TestCase):
    def test_code_reads_how_the_transfer_ended(self):
        # A too-short timeout raised AgentError (code() DEADLINE_EXCEEDED) or TransferFailed (no code()), as the
        # time ran out before or during the transfer: a caller had to tell the two apart. The agent spells a
        # failure's code as Go does ("OutOfRange").
        def failed(state, *codes):
            return TransferFailed(pb.TransferStatus(transfer_id=7, state=state, error="summary", failures=[
                pb.TagFailure(tag="t%d" % k, code=c, message="m") for k, c in enumerate(codes)]))

        for e, want in ((failed(pb.TRANSFER_STATE_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"), grpc.StatusCode.DEADLINE_EXCEEDED),
                        (failed(pb.TRANSFER_STATE_CANCELLED), grpc.StatusCode.CANCELLED),
                        (failed(pb.TRANSFER_STATE_FAILED, "Unavailable", "Internal"), grpc.StatusCode.UNAVAILABLE),
                        (failed(pb.TRANSFER_STATE_FAILED, "OutOfRange"), grpc.StatusCode.OUT_OF_RANGE),
                        (failed(pb.TRANSFER_STATE_FAILED, "Canceled"), grpc.StatusCode.CANCELLED),
                        (failed(pb.TRANSFER_STATE_FAILED, "UNAVAILABLE"), grpc.StatusCode.UNAVAILABLE),
                        (failed(pb.TRANSFER_STATE_FAILED, "NOT_A_CODE"), grpc.StatusCode.UNKNOWN),
                        (failed(pb.TRANSFER_STATE_FAILED, "__class__"), grpc.StatusCode.UNKNOWN),
                        (failed(pb.TRANSFER_STATE_FAILED), grpc.StatusCode.UNKNOWN)):
            with self.subTest(status=e.status):
                self.assertEqual(e.code(), want)
                self.assertEqual(e.details(), "summary")


if __name__ == "__main__":
    unittest.main()
