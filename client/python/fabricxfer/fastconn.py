# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""One connection to the agent's fast socket: a framed request (u32 big-endian length, then the payload) and its
framed reply, with as few system calls and Python steps as a round trip allows.

The socket stays non-blocking for its whole life, so a call never switches modes (each switch is a system call)
and Python never polls before a read that would succeed at once. A reply is read into one buffer kept for the
connection: a small reply arrives in one recv_into. The caller polls for the reply for up to spin seconds (waking
a blocked reader costs tens of microseconds, as much as a small GPU copy) and only then waits in poll(), always
within the call's deadline.

With a mailbox (shared memory the agent maps, see agent.proto's Mailbox) a frame that fits travels through memory
instead: the caller writes it and raises a sequence number, the agent, polling, answers in the same memory. While
both sides poll, a round trip needs no system call. An agent that does not poll says so, and the caller rings it
with an empty frame on the socket; a caller that stops polling says so, and the agent wakes it with four 0xff bytes,
a header no reply has.

Python has no memory fences. x86 keeps a core's stores in order and its loads in order, which the mailbox relies
on; elsewhere (arm64) the mailbox is checked: each frame carries a seal (a CRC-32 over its sequence number and its
bytes), and a side that reads a frame whose seal is wrong reads it again, since the writer's bytes are on their way.
The sequence words are written and read in one 8-byte access each (a memoryview of native 8-byte items, which
copies an item in one access): standard-size packing writes byte by byte, and the agent could read half a number.
"""

import os
import select
import socket
import struct
import time
import zlib
from typing import Optional

_HDR = struct.Struct(">I")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")

# The mailbox's layout (agent.proto, Mailbox).
MAILBOX_BYTES = 64 << 10
_REQUEST_SEQ, _TAKEN, _REPLY_SEQ, _POLLING, _ASLEEP, CHECKED_WORD, _AREAS = 0, 64, 128, 192, 196, 200, 4096
# The sequence words' indices in a view of the mailbox as 8-byte items, and the agent's polling word's in a view
# of 4-byte items (native items: the mailbox is used only on little-endian machines, where they match its layout).
_REQUEST_SEQ_ITEM, _TAKEN_ITEM, _REPLY_SEQ_ITEM = _REQUEST_SEQ // 8, _TAKEN // 8, _REPLY_SEQ // 8
_POLLING_ITEM = _POLLING // 4
# What a checked mailbox's seal adds behind a frame.
_SEAL_BYTES = 4
# A request the agent has not taken after this long is rung for, whatever the agent said: the caller's write of
# the sequence and its read of the agent's word may pass each other, so "polling" may be stale.
_RING_AFTER = 50e-6
_EMPTY_FRAME = b"\0\0\0\0"
# A polling caller offers its core to the kernel this often (sched_yield, which returns at once when no other
# thread waits for it): on a host whose cores are all busy, the agent's thread that is to answer may be waiting for
# this very core, and without the offer it ran only when this thread's time slice ended (milliseconds later).
_YIELD_GAP = 50e-6


def _core_offer():
    """sched_yield called with the GIL held: the offer is for other processes' threads (the agent's). os.sched_yield
    lets the GIL go, and a busy thread of this process that took it would then hold up the poll until Python's
    switch interval (5 ms) passed."""
    try:
        import ctypes

        offer = ctypes.PyDLL(None).sched_yield
        offer.argtypes, offer.restype = (), ctypes.c_int
        return offer
    except (ImportError, OSError, AttributeError):
        return getattr(os, "sched_yield", lambda: None)


_offer_core = _core_offer()
# The agent's wake-up: a frame header no reply has.
_WAKE = 0xFFFFFFFF


class FastConnError(ConnectionError):
    """The fast connection broke (closed by the agent, a reply over its bound, or no reply in time)."""


class FastConnTimeout(FastConnError):
    """The call's deadline passed before the agent's reply (or room to write the frame) came: the agent may still
    be serving the frame, and its late reply would reach the next call, so the connection is out of step."""


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
        self.mailbox = None
        self._words = self._words32 = None
        self._checked = False

    def attach_mailbox(self, mm, checked: bool = False):
        """Sends the frames that fit through mm, the mailbox the agent has just mapped; checked: seal them, and
        check the agent's seals (the agent was asked to, and said it does)."""
        self.mailbox = mm
        self._words = memoryview(mm).cast("Q")
        self._words32 = memoryview(mm).cast("I")
        self._checked = checked
        self._area = (len(mm) - _AREAS) // 2
        # The largest frame that goes through the mailbox, its seal left room for.
        self._fits = self._area - (_SEAL_BYTES if checked else 0)
        self._reply_at = _AREAS + self._area
        (self._seq,) = _U64.unpack_from(mm, _REQUEST_SEQ)

    def __del__(self):
        # One dropped with its client (a Client collected without close()) closes its socket as close() would,
        # not with a ResourceWarning.
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close()

    def cut(self):
        """Closes the connection as close() does but hands back its socket, half-closed: the agent reads that as
        the caller gone, stops a waited transfer it serves, and closes its end once the copies stopped (which
        await_closed sees). None when the socket could not be half-closed (closed already)."""
        sock, self.sock = self.sock, None
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            sock = None
        self.close()
        return sock

    def close(self):
        if self.sock is not None:
            self.sock.close()
        if self._words is not None:
            self._words.release()
            self._words32.release()
            self._words = self._words32 = None
        if self.mailbox is not None:
            try:
                self.mailbox.close()
            except BufferError:  # a view of it still lives: the mapping goes with that view
                pass
            self.mailbox = None

    def _wait(self, poller, deadline: float, what: str):
        left = deadline - time.perf_counter()
        if left <= 0 or not poller.poll(max(1, int(left * 1e3))):
            if time.perf_counter() >= deadline:
                raise FastConnTimeout("no %s from the agent within the call's deadline" % what)

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
        """Reads one reply frame and returns its payload, passing over the agent's wake-ups."""
        sock, view = self.sock, self._view
        got = 0
        need = 0  # 4 + the payload's length, once the header is in
        offered = time.perf_counter()
        spin_until = offered + self.spin
        while True:
            try:
                n = sock.recv_into(view[got:])
            except (BlockingIOError, InterruptedError):
                now = time.perf_counter()
                if now < spin_until:
                    if now - offered > _YIELD_GAP:
                        _offer_core()
                        offered = now
                    continue
                self._wait(self._poll, deadline, "reply")
                continue
            if n == 0:
                raise FastConnError("the agent closed the fast socket%s" % (" mid-reply" if got else ""))
            got += n
            while not need and got >= 4:
                (size,) = _HDR.unpack_from(view, 0)
                if size == _WAKE:
                    view[:got - 4] = view[4:got]
                    got -= 4
                    continue
                if size > self.max_reply:
                    raise FastConnError("a reply of %d bytes, at most %d" % (size, self.max_reply))
                need = 4 + size
                if need > len(self._buf):
                    self._grow(need)
                    view = self._view
            if need and got >= need:
                if got > need:
                    raise FastConnError("%d bytes after the reply: the connection is out of step" % (got - need))
                return bytes(view[4:need])

    def _grow(self, n: int):
        buf = bytearray(n)
        buf[:len(self._buf)] = self._buf
        self._buf, self._view = buf, memoryview(buf)

    def call(self, parts, deadline: float, mailbox: bool = True) -> bytes:
        """One frame and its reply: through the mailbox where there is one, the frame fits and mailbox allows,
        else on the socket."""
        mm = self.mailbox
        if mm is not None and mailbox:
            if len(parts) == 1:
                frame = parts[0]
            elif sum(map(len, parts)) <= self._fits:
                frame = b"".join(parts)  # a few short parts: one copy into the mailbox rather than one per part
            else:
                frame = None
            if frame is not None and len(frame) <= self._fits:
                return self._mailbox_call(mm, frame, deadline - time.perf_counter())
        self.send(parts, deadline)
        return self.recv_frame(deadline)

    def call_frame(self, frame: bytes, wait: float, mailbox: bool = True) -> bytes:
        """call() of one built frame whose deadline is wait seconds away: a mailbox call reads the clock only
        once it has polled for a while (a short call never does)."""
        mm = self.mailbox
        if mm is not None and mailbox and len(frame) <= self._fits:
            return self._mailbox_call(mm, frame, wait)
        deadline = time.perf_counter() + wait
        self.send((frame,), deadline)
        return self.recv_frame(deadline)

    def wake(self, deadline: float):
        """Rings an agent that says it does not poll the mailbox, ahead of a frame that takes a while to build:
        waking it costs tens of microseconds, which then pass while the frame is built rather than after it is
        posted (the agent polls again for a couple of milliseconds once woken)."""
        if self._words32 is not None and not self._words32[_POLLING_ITEM]:
            self.send([_EMPTY_FRAME], deadline)

    def _mailbox_call(self, mm, frame, wait: float) -> bytes:
        """One frame through the mailbox and its reply, within wait seconds of the call (counted from the first
        read of the clock, a few microseconds in)."""
        seq = self._seq + 1
        self._seq = seq
        mm[_AREAS:_AREAS + len(frame)] = frame
        if self._checked:
            _U32.pack_into(mm, _AREAS + len(frame), zlib.crc32(frame, seq & 0xFFFFFFFF))
        words = self._words
        words[_REQUEST_SEQ_ITEM] = seq  # one 8-byte store, as the agent reads it
        rang = not self._words32[_POLLING_ITEM]
        deadline = None
        if rang:
            deadline = time.perf_counter() + wait
            self.send([_EMPTY_FRAME], deadline)
        # The clock is first read after 64 polls (a few microseconds): a short call never reads it.
        start = spin_until = None
        i = 0
        while words[_REPLY_SEQ_ITEM] != seq:
            i += 1
            if i & 63:
                continue
            now = time.perf_counter()
            if start is None:
                start = offered = now
                spin_until = now + self.spin
                if deadline is None:
                    deadline = now + wait
            elif now - offered > _YIELD_GAP:
                _offer_core()
                offered = now
            if not rang and now - start > _RING_AFTER and words[_TAKEN_ITEM] != seq:
                self.send([_EMPTY_FRAME], deadline)
                rang = True
            if now >= spin_until:
                self._sleep(mm, seq, deadline)
                break
        if self._checked:
            return self._sealed_reply(mm, seq, time.perf_counter() + wait if deadline is None else deadline)
        at = self._reply_at
        (n,) = _HDR.unpack_from(mm, at)
        if n > self._area - 4:
            raise FastConnError("a mailbox reply of %d bytes, at most %d" % (n, self._area - 4))
        return mm[at + 4:at + 4 + n]

    def _sealed_reply(self, mm, seq: int, deadline: float) -> bytes:
        """The reply to seq in a checked mailbox: read until its seal matches (its bytes may reach this core after
        the sequence did), within the call's deadline."""
        at, most, start = self._reply_at, self._area - 4 - _SEAL_BYTES, seq & 0xFFFFFFFF
        while True:
            (n,) = _HDR.unpack_from(mm, at)
            if n <= most:
                raw = mm[at:at + 4 + n + _SEAL_BYTES]  # one copy: what is checked is what is returned
                if zlib.crc32(raw[:-_SEAL_BYTES], start) == _U32.unpack_from(raw, 4 + n)[0]:
                    return raw[4:-_SEAL_BYTES]
            if time.perf_counter() >= deadline:
                raise FastConnTimeout("a mailbox reply (%d bytes) that does not match its seal within the call's "
                                      "deadline" % n)

    def _sleep(self, mm, seq: int, deadline: float):
        """Waits on the socket for the reply to seq: the agent sends an empty frame after a reply to a caller that
        says it sleeps (a wake-up: four 0xff bytes). Polls wake at least every millisecond, in case that word and the reply passed each other."""
        _U32.pack_into(mm, _ASLEEP, 1)
        words = self._words
        try:
            while words[_REPLY_SEQ_ITEM] != seq:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise FastConnTimeout("no reply from the agent within the call's deadline")
                if words[_TAKEN_ITEM] != seq:
                    self.send([_EMPTY_FRAME], deadline)
                self._poll.poll(1)
                self._drain()
        finally:
            _U32.pack_into(mm, _ASLEEP, 0)

    def _drain(self):
        """Reads the wake-ups waiting on the socket (nothing else comes while a mailbox call is on)."""
        while True:
            try:
                n = self.sock.recv_into(self._view)
            except (BlockingIOError, InterruptedError):
                return
            if n == 0:
                raise FastConnError("the agent closed the fast socket")
            if n % 4 or self._view[:n].tobytes().strip(b"\xff"):
                raise FastConnError("a frame on the socket during a mailbox call: the connection is out of step")


def await_closed(sock: socket.socket, deadline: Optional[float]) -> bool:
    """Reads (and drops) what comes on a socket cut() handed back until the agent closes its end; False when
    deadline (time.perf_counter()) passed first; None: only what is there now."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    while True:
        if deadline is None:
            wait = 0
        else:
            wait = max(0, int((deadline - time.perf_counter()) * 1e3) + 1)
        if not poller.poll(wait):
            if deadline is None or time.perf_counter() >= deadline:
                return False
            continue
        try:
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return True
        except BlockingIOError:
            continue
        except OSError:
            return True  # reset: the agent's end is gone
