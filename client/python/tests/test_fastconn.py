# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Tests of the fast connection's mailbox against a thread that plays the agent in shared memory: what a checked
mailbox does when the other side's bytes reach this core late, or never match their seal. No agent needed."""

import mmap
import socket
import struct
import threading
import time
import unittest
import zlib

from fabricxfer import fastconn

U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
AREAS = 4096


def seal(seq, frame):
    return zlib.crc32(frame, seq & 0xFFFFFFFF)


class CheckedMailboxTest(unittest.TestCase):
    def setUp(self):
        self.mm = mmap.mmap(-1, 16 << 10)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(theirs.close)
        self.conn = fastconn.FastConn(ours, spin=1.0)
        self.addCleanup(self.conn.close)
        U32.pack_into(self.mm, 192, 1)  # the "agent" polls: no doorbell on the socket
        self.conn.attach_mailbox(self.mm, checked=True)
        self.area = (len(self.mm) - AREAS) // 2

    def agent(self, answer, late=0.0):
        """Plays the agent for one request: waits for it, checks its seal, then answers with answer(seq, request)
        -> (reply frame, seal); with late, raises the reply sequence first and writes the reply late seconds
        after (bytes reaching the caller after the sequence did)."""
        got = {}

        def run():
            deadline = time.monotonic() + 5
            while U64.unpack_from(self.mm, 0)[0] == 0:
                if time.monotonic() > deadline:
                    return
            seq = U64.unpack_from(self.mm, 0)[0]
            (n,) = struct.unpack_from(">I", self.mm, AREAS)
            frame = bytes(self.mm[AREAS:AREAS + 4 + n])
            got["sealed"] = U32.unpack_from(self.mm, AREAS + 4 + n)[0] == seal(seq, frame)
            got["payload"] = frame[4:]
            reply, sealed = answer(seq, got["payload"])
            at = AREAS + self.area
            if late:
                U64.pack_into(self.mm, 128, seq)
                time.sleep(late)
            self.mm[at:at + len(reply)] = reply
            U32.pack_into(self.mm, at + len(reply), sealed)
            U64.pack_into(self.mm, 128, seq)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        self.addCleanup(th.join, 5)
        return got

    def test_requests_are_sealed_and_late_replies_read_once_whole(self):
        # A stale reply under the new sequence (last call's bytes) must not be taken for this call's.
        old = struct.pack(">I", 5) + b"stale"
        at = AREAS + self.area
        self.mm[at:at + len(old)] = old
        U32.pack_into(self.mm, at + len(old), seal(0, old))

        def answer(seq, payload):
            reply = struct.pack(">I", len(payload) + 4) + b"re: " + payload
            return reply, seal(seq, reply)

        got = self.agent(answer, late=0.05)
        body = b"a request"
        out = self.conn.call([struct.pack(">I", len(body)), body], time.perf_counter() + 5)
        self.assertTrue(got["sealed"], "the request's seal did not match its sequence and bytes")
        self.assertEqual(got["payload"], body)
        self.assertEqual(out, b"re: a request")

    def test_a_reply_that_never_matches_its_seal_ends_with_the_deadline(self):
        got = self.agent(lambda seq, payload: (struct.pack(">I", 2) + b"no", seal(seq + 1, b"no")))
        start = time.perf_counter()
        with self.assertRaisesRegex(fastconn.FastConnError, "does not match its seal"):
            self.conn.call([struct.pack(">I", 3) + b"abc"], start + 0.2)
        took = time.perf_counter() - start
        self.assertGreaterEqual(took, 0.2)
        self.assertLess(took, 2.0)
        self.assertTrue(got["sealed"])

    def test_frames_leave_room_for_their_seal(self):
        # A frame that fills the area but for its seal goes on the socket, not into the mailbox.
        self.assertEqual(self.conn._fits, self.area - 4)



class PollingOffersItsCoreTest(unittest.TestCase):
    """A caller polling for its reply, in the mailbox or on the socket, offers its core to the kernel
    (os.sched_yield) every _YIELD_GAP: on a host whose cores are all busy, the agent's thread that is to answer may
    be waiting for this very core."""

    def setUp(self):
        self.offers = 0
        kept = fastconn._offer_core

        def counted():
            self.offers += 1
            kept()

        fastconn._offer_core = counted
        self.addCleanup(setattr, fastconn, "_offer_core", kept)
        ours, self.theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.theirs.close)
        self.conn = fastconn.FastConn(ours, spin=1.0)
        self.addCleanup(self.conn.close)

    def answer_later(self, answer, after=0.02):
        th = threading.Thread(target=lambda: (time.sleep(after), answer()), daemon=True)
        th.start()
        self.addCleanup(th.join, 5)

    def test_the_offer_keeps_the_gil(self):
        # Letting the GIL go (os.sched_yield does) would let a busy thread of this process hold up the poll for
        # Python's switch interval; the offer is for other processes' threads.
        import ctypes

        offer = fastconn._core_offer()
        self.assertTrue(offer._flags_ & ctypes._FUNCFLAG_PYTHONAPI, "the offer lets the GIL go")
        self.assertEqual(offer(), 0)

    def test_a_mailbox_caller_offers_its_core_while_it_polls(self):
        mm = mmap.mmap(-1, 16 << 10)
        U32.pack_into(mm, 192, 1)  # the "agent" polls: no doorbell on the socket
        self.conn.attach_mailbox(mm)
        at = AREAS + (len(mm) - AREAS) // 2

        def answer():
            mm[at:at + 6] = struct.pack(">I", 2) + b"ok"
            U64.pack_into(mm, 128, U64.unpack_from(mm, 0)[0])

        self.answer_later(answer)
        self.assertEqual(self.conn.call([struct.pack(">I", 3) + b"abc"], time.perf_counter() + 5), b"ok")
        self.assertGreater(self.offers, 10, "a caller polling 20 ms for its reply never offered its core")

    def test_a_socket_caller_offers_its_core_while_it_polls(self):
        def answer():
            self.theirs.recv(64)
            self.theirs.sendall(struct.pack(">I", 2) + b"ok")

        self.answer_later(answer)
        self.assertEqual(self.conn.call([struct.pack(">I", 3) + b"abc"], time.perf_counter() + 5), b"ok")
        self.assertGreater(self.offers, 10, "a caller polling 20 ms for its reply never offered its core")


class WakeTest(unittest.TestCase):
    """wake() rings an agent that says it does not poll its mailbox (an empty frame on the socket), and writes
    nothing to one that polls: a frame that takes a while to build is preceded by the agent's wake-up."""

    def test_only_an_agent_that_does_not_poll_is_rung(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(theirs.close)
        conn = fastconn.FastConn(ours, spin=0.0)
        self.addCleanup(conn.close)
        conn.wake(time.perf_counter() + 1)  # no mailbox: nothing to ring
        mm = mmap.mmap(-1, 16 << 10)
        conn.attach_mailbox(mm)
        U32.pack_into(mm, 192, 1)
        conn.wake(time.perf_counter() + 1)
        theirs.setblocking(False)
        with self.assertRaises(BlockingIOError):
            theirs.recv(64)
        U32.pack_into(mm, 192, 0)
        conn.wake(time.perf_counter() + 1)
        self.assertEqual(theirs.recv(64), b"\0\0\0\0")

    def test_a_frame_built_under_the_lock_rings_a_parked_agent_first(self):
        from fabricxfer.client import Client

        order = []

        class Conn:
            def wake(self, deadline):
                order.append("wake")

            def call(self, parts, deadline, mailbox):
                order.append(("call", mailbox))
                return b"reply"

        c = Client.__new__(Client)
        c._fast_lock, c._fast, c.timeout = threading.Lock(), Conn(), 5.0
        self.assertEqual(c._fast_raw(None, 1.0, lambda conn: order.append("build") or [b"frame"], True), b"reply")
        self.assertEqual(order, ["wake", "build", ("call", True)])
        order.clear()
        c._fast_raw(None, 1.0, lambda conn: order.append("build") or [b"frame"], False)  # the frame goes on the socket
        self.assertEqual(order, ["build", ("call", False)])

    def test_a_ring_into_a_broken_socket_leaves_the_call_to_say_so(self):
        from fabricxfer.client import Client, SessionLost

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.close()
        conn = fastconn.FastConn(ours, spin=0.0)
        mm = mmap.mmap(-1, 16 << 10)
        conn.attach_mailbox(mm)  # the agent's polling word is 0: the call rings first
        c = Client.__new__(Client)
        c._fast_lock, c._fast, c.timeout, c._lock = threading.Lock(), conn, 5.0, threading.Lock()
        with self.assertRaises(SessionLost):
            c._fast_raw(None, 1.0, lambda conn: [struct.pack(">I", 3) + b"abc"], True)
        self.assertIsNot(c._fast, conn, "the broken fast connection was kept")
        self.assertIsNotNone(c._fast, "the fast path was given up: the next call would go through gRPC unseen")

if __name__ == "__main__":
    unittest.main()
