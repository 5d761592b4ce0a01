# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""One connection to the agent's fast socket: a framed request (u32 big-endian length, then the payload) and its
framed reply, with as few system calls and Python steps as a round trip allows.

The socket stays non-blocking for its whole life, so a call never switches modes (each switch is a system call)
and Python never polls before a read that would succeed at once. A reply is read into one buffer kept for the
connection: a small reply arrives in one recv_into. The caller polls for the reply for up to spin seconds (waking
a blocked reader costs tens of microseconds, as much as a small GPU copy) and only then waits in poll(), always
within the call's deadline.
"""

import select
import socket
import struct
import time

_HDR = struct.Struct(">I")


class FastConnError(ConnectionError):
    """The fast connection broke (closed by the agent, a reply over its bound, or no reply in time)."""


class FastConn:
    """A bound fast-socket connection. Not safe for concurrent calls: the client holds a lock around call()."""

    def __init__(self, sock: socket.socket, spin: float, max_reply: int = 1 << 20):
        sock.setblocking(False)
        self.sock = sock
        self.spin = spin
        self.max_reply = max_reply
        self._buf = bytearray(64 << 10)
        self._view = memoryview(self._buf)
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._wpoll = select.poll()
        self._wpoll.register(sock.fileno(), select.POLLOUT)

    def close(self):
        self.sock.close()

    def _wait(self, poller, deadline: float, what: str):
        left = deadline - time.perf_counter()
        if left <= 0 or not poller.poll(max(1, int(left * 1e3))):
            if time.perf_counter() >= deadline:
                raise FastConnError("no %s from the agent within the call's deadline" % what)

    def send(self, parts, deadline: float):
        """Writes the buffers of parts (bytes-like, one byte per item) in order: one sendmsg for a frame that fits
        the socket's buffer."""
        sock = self.sock
        views = parts
        spin_until = time.perf_counter() + self.spin
        while True:
            try:
                n = sock.sendmsg(views)
            except (BlockingIOError, InterruptedError):
                # A frame larger than the socket's buffer goes out as the agent reads it; the agent is reading at
                # that moment, so the room comes within microseconds: poll for it rather than sleep.
                if time.perf_counter() >= spin_until:
                    self._wait(self._wpoll, deadline, "room to write")
                continue
            if n == sum(map(len, views)):
                return
            views = [memoryview(v) for v in views]
            while views and n >= views[0].nbytes:
                n -= views[0].nbytes
                views.pop(0)
            if n:
                views[0] = views[0][n:]
            views = [v for v in views if v.nbytes]
            if not views:
                return

    def recv_frame(self, deadline: float) -> bytes:
        """Reads one reply frame and returns its payload."""
        sock, view = self.sock, self._view
        got = 0
        need = 4
        spin_until = time.perf_counter() + self.spin
        while True:
            try:
                n = sock.recv_into(view[got:])
            except (BlockingIOError, InterruptedError):
                if time.perf_counter() < spin_until:
                    continue
                self._wait(self._poll, deadline, "reply")
                continue
            if n == 0:
                raise FastConnError("the agent closed the fast socket%s" % (" mid-reply" if got else ""))
            got += n
            if got >= 4 and need == 4:
                (size,) = _HDR.unpack_from(view, 0)
                if size > self.max_reply:
                    raise FastConnError("a reply of %d bytes, at most %d" % (size, self.max_reply))
                need = 4 + size
                if need > len(self._buf):
                    self._grow(need)
                    view = self._view
            if got >= need:
                if got > need:
                    raise FastConnError("%d bytes after the reply: the connection is out of step" % (got - need))
                return bytes(view[4:need])

    def _grow(self, n: int):
        buf = bytearray(n)
        buf[:len(self._buf)] = self._buf
        self._buf, self._view = buf, memoryview(buf)

    def call(self, parts, deadline: float) -> bytes:
        self.send(parts, deadline)
        return self.recv_frame(deadline)
