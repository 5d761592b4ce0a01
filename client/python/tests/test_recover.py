# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""An agent restart under a live client: client/python_test.go restarts the agent when this test prints
RESTART-AGENT and answers on stdin once the new agent listens (FABRICXFER_RESTARTS=1)."""

import array
import hashlib
import os
import sys
import threading
import time
import unittest

import grpc

from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.client import Client, Item, SessionLost, shared_memory, to_layout, to_region, to_segment

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")
RESTARTS = os.environ.get("FABRICXFER_RESTARTS") == "1"


def restart_agent():
    print("RESTART-AGENT", flush=True)
    line = sys.stdin.readline()
    if line.strip() != "restarted":
        raise RuntimeError("the test driver did not restart the agent: %r" % line)


@unittest.skipUnless(SOCKET and RESTARTS, "needs an agent the test driver restarts: run through go test ./client")
class RecoverTest(unittest.TestCase):
    def test_calls_fail_fast_then_recover_reregisters_and_transfers_work(self):
        for fast in (True, False):
            with self.subTest(fast=fast):
                self.run_once(fast)

    def run_once(self, fast):
        size = 256 << 10
        c = Client(SOCKET, timeout=5.0, fast=fast)
        self.addCleanup(c.close)
        sfd, src = shared_memory("py-recover-src", size)
        dfd, dst = shared_memory("py-recover-dst", size)
        for buf in (src, dst):
            self.addCleanup(buf.close)
        src[:] = os.urandom(size)
        rs = c.register_host(sfd, 0, size)
        rd = c.register_host(dfd, 0, size, segment="py-recover-%d" % fast)
        pool = c.allocate_from_pool(4096) if c.info.HasField("pool_memory") else None
        c.write(rs, 0, to_region(rd), 0, 4096)
        old = (rs.id, rd.id, rd.descriptor)
        # A layout whose region was deregistered since cannot come back: recover() drops it instead of failing.
        xfd, xbuf = shared_memory("py-recover-x", 4096)
        self.addCleanup(xbuf.close)
        rx = c.register_host(xfd, 0, 4096)
        os.close(xfd)
        lx = c.register_layout([rx], 1024)
        c.deregister(rx)
        kept = c.register_layout([rs], 4096)
        dst_layout = c.register_layout([rd], 4096)
        # Prepared before the restart: its frame names the layouts' ids of the old agent.
        prepared = c.prepare_blocks("write", kept, array.array("i", [1]), to_layout(dst_layout), array.array("i", [1]))
        prepared.run()
        # A transfer id of this agent names nothing of the next one (ids restart there, but carry its epoch).
        tid = c.transfer("write", [Item(rs, to_region(rd), 16)], wait=False)
        c.wait(tid, timeout=5.0)

        # The caller closing its own fds must not stop recover() from registering the memory again.
        os.close(sfd)
        os.close(dfd)
        stream = c.notifications([rd])
        restart_agent()
        # A notification stream the restart ended says so as the client's calls do, not as gRPC's UNAVAILABLE.
        with self.assertRaises(SessionLost):
            next(stream)
        with self.assertRaises((SessionLost, grpc.RpcError)) as e:
            c.write(rs, 0, to_region(rd), 0, size)
        print("after the restart: %s: %s" % (type(e.exception).__name__, e.exception), flush=True)
        if isinstance(e.exception, grpc.RpcError):
            self.assertIn(e.exception.code(), (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND))

        # Threads sharing the client each catch SessionLost and recover(): one recovers, the others wait for it.
        errors, threads = [], [threading.Thread(target=lambda: self._recover_into(c, errors)) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)
        self.assertEqual(errors, [], "concurrent recover() calls failed")
        # The caller's usage counts each region once (an earlier test's client may still be leaving: wait for it).
        deadline = time.monotonic() + 5
        while True:
            regions = c.stub.GetInfo(pb.GetInfoRequest(api_versions=["v1"]), timeout=5).usage.regions
            if regions <= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(regions, 2, "regions held after three concurrent recover() calls")
        self.assertNotIn(lx, c._layouts, "a layout over a deregistered region was kept")
        c.transfer("write", [Item(rs, to_region(rd), 4096)], wait=False)
        with self.assertRaises(grpc.RpcError) as e:
            c.wait(tid, timeout=5.0)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND, e.exception.details())
        self.assertIn("previous agent", e.exception.details())
        with self.assertRaises(grpc.RpcError) as e:
            c.deregister_layout(lx)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn(kept, c._layouts)
        src[:64] = os.urandom(64)
        c.transfer_blocks("write", kept, memoryview(b"\0\0\0\0").cast("i"), to_layout(dst_layout),
                          memoryview(b"\0\0\0\0").cast("i"))
        self.assertEqual(bytes(src[:4096]), bytes(dst[:4096]), "a layout recover() brought back moved nothing")
        src[4096:4160] = os.urandom(64)
        self.assertIsNone(prepared.run())
        self.assertEqual(bytes(src[4096:8192]), bytes(dst[4096:8192]),
                         "a transfer prepared before recover() did not follow its layouts' new ids")
        self.assertNotEqual(rd.descriptor, old[2], "the destination kept its old descriptor")
        self.assertFalse(rs.lost or rd.lost)
        if pool is not None:
            self.assertTrue(pool.region.lost, "a pool slice cannot survive the agent and must say so")
            c.release(pool)
        items = [Item(rs, to_segment("", rd.segment), 64 << 10, off, off, tag="b%d" % off)
                 for off in range(0, size, 64 << 10)]
        c.transfer("write", items, timeout=5.0)
        self.assertEqual(hashlib.sha256(src).hexdigest(), hashlib.sha256(dst).hexdigest())
        c.deregister(rs)
        c.deregister(rd)


    @staticmethod
    def _recover_into(c, errors):
        try:
            c.recover(timeout=10.0)
        except Exception as e:  # reported by the test's thread
            errors.append(e)

    def test_a_recover_that_failed_partway_registers_the_rest_when_called_again(self):
        # A region whose published name another client took on the new agent cannot come back: recover() raises,
        # the other regions are back, and once the name is free a second recover() registers the missing one
        # (and its layout) instead of returning as if all were back.
        c = Client(SOCKET, timeout=5.0)
        self.addCleanup(c.close)
        fds = []
        for name in ("py-partway-a", "py-partway-b"):
            fd, buf = shared_memory(name, 8192)
            self.addCleanup(buf.close)
            self.addCleanup(os.close, fd)
            fds.append((fd, buf))
        ra = c.register_host(fds[0][0], 0, 8192)
        rb = c.register_host(fds[1][0], 0, 8192, segment="py-partway-name")
        lb = c.register_layout([rb], 4096)
        instance = c.info.instance
        restart_agent()
        squatter = Client(SOCKET, timeout=5.0)
        sfd, sbuf = shared_memory("py-partway-squat", 4096)
        self.addCleanup(sbuf.close)
        self.addCleanup(os.close, sfd)
        squatter.register_host(sfd, 0, 4096, segment="py-partway-name")
        with self.assertRaises(grpc.RpcError) as e:
            c.recover(timeout=10.0)
        self.assertEqual(e.exception.code(), grpc.StatusCode.ALREADY_EXISTS, e.exception.details())
        self.assertNotEqual(c.info.instance, instance, "the agent's instance did not change with its restart")
        c.write(ra, 0, to_region(ra), 4096, 64)  # the region that could come back did
        squatter.close()
        deadline = time.monotonic() + 5
        while True:  # the agent frees the closed client's name once it sees its connection end
            try:
                c.recover(timeout=10.0)
                break
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.ALREADY_EXISTS, e.details())
                self.assertLess(time.monotonic(), deadline, "the name was not freed within 5 s")
                time.sleep(0.05)
        fds[1][1][:64] = os.urandom(64)
        c.transfer_blocks("write", lb, array.array("i", [0]), to_layout(lb), array.array("i", [1]))
        self.assertEqual(bytes(fds[1][1][:64]), bytes(fds[1][1][4096:4096 + 64]))
        self.assertEqual(c.resolve_segment("", "py-partway-name"), rb.descriptor)

    def test_a_waited_call_cut_short_by_the_agent_stopping_is_a_lost_session(self):
        # The agent stopping mid-call closes the fast connection instead of answering "pending, wait for it by
        # id": the caller hears SessionLost (then recovers), never an AgentError whose id dies with the agent.
        size = 64 << 20
        c = Client(SOCKET, timeout=10.0)
        self.addCleanup(c.close)
        sfd, src = shared_memory("py-stop-src", size)
        dfd, dst = shared_memory("py-stop-dst", size)
        for fd, buf in ((sfd, src), (dfd, dst)):
            self.addCleanup(buf.close)
            self.addCleanup(os.close, fd)
        ls = c.register_layout([c.register_host(sfd, 0, size)], 1 << 20)
        ld = c.register_layout([c.register_host(dfd, 0, size)], 1 << 20)
        ids = array.array("i", range(64))
        got, running = [], threading.Event()

        def loop():
            while True:
                try:
                    c.transfer_blocks("write", ls, ids, to_layout(ld), ids)
                    running.set()
                except BaseException as e:
                    got.append(e)
                    running.set()
                    return

        th = threading.Thread(target=loop)
        th.start()
        running.wait(10)
        restart_agent()
        th.join(30)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], SessionLost, "%s: %s" % (type(got[0]).__name__, got[0]))
        c.recover(timeout=10.0)


if __name__ == "__main__":
    unittest.main()
