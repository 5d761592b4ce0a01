# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Block ids as packed little-endian integers, and the fast-socket frame of a TransferBlocksRequest built
around them without copying them.

Ids come as numpy int32/int64 arrays, torch CPU int32/int64 tensors, or any buffer of int32/int64
(memoryview, array.array; raw bytes with id_bytes given), one list each: 1-D (a 0-d array or tensor is one id;
more dimensions are refused, not flattened). Nothing here loops over ids in Python.
"""

import struct
import sys
from typing import List, Optional, Tuple, Union

from fabricxfer.agent.v1 import agent_pb2 as pb

_LITTLE = sys.byteorder == "little"
_SIGNED = {"i", "l", "q"}
# Tags of TransferBlocksRequest's local_ids (4) and remote_ids (5), and FastRequest's blocks (2): wire type 2.
_TAG_LOCAL_IDS = b"\x22"
_TAG_REMOTE_IDS = b"\x2a"
_TAG_FAST_BLOCKS = b"\x12"


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _dtype_error(what) -> ValueError:
    return ValueError("block ids must be int32 or int64, got %s" % (what,))


def _shape_error(shape) -> ValueError:
    return ValueError("block ids must be one list (1-D), got shape %s: pass ids.reshape(-1) if that is meant"
                      % (tuple(shape),))


def _from_numpy(a, id_bytes: Optional[int]):
    dt = a.dtype
    if dt.kind != "i" or dt.itemsize not in (4, 8):
        raise _dtype_error("numpy %s" % dt)
    if id_bytes is not None and id_bytes != dt.itemsize:
        raise ValueError("ids are %s but id_bytes=%d" % (dt, id_bytes))
    if a.ndim > 1:
        raise _shape_error(a.shape)
    if a.ndim == 0:  # one id (a numpy scalar, ids[i])
        a = a.reshape(1)
    if dt.byteorder == ">" or (dt.byteorder == "=" and not _LITTLE):
        a = a.astype("<i%d" % dt.itemsize)
    if not a.flags.c_contiguous:
        a = a.copy()
    return memoryview(a).cast("B"), dt.itemsize, a.shape[0]


_TORCH_WIDTHS: dict = {}
# Torch id tensors of up to this many ids are read as Python ints (tolist), fewer calls into torch than a view.
_TORCH_SHORT = 16
_SHORT_PACKS = {(w, n): struct.Struct("<%d%s" % (n, "i" if w == 4 else "q")).pack
                for w in (4, 8) for n in range(_TORCH_SHORT + 1)}


def _torch_widths(torch_mod) -> dict:
    """torch.int32 -> 4 and torch.int64 -> 8, keyed by the dtype objects themselves (comparing them is cheaper
    than naming them)."""
    if not _TORCH_WIDTHS:
        _TORCH_WIDTHS.update({torch_mod.int32: 4, torch_mod.int64: 8})
    return _TORCH_WIDTHS


def _from_torch(t, id_bytes: Optional[int]):
    # Every step here is a call into torch, each costing a microsecond or more: ask only what decides something.
    width = (_TORCH_WIDTHS or _torch_widths(sys.modules["torch"])).get(t.dtype)
    if width is None:
        raise _dtype_error(t.dtype)
    if not t.is_cpu:
        raise ValueError("block ids are on %s: pass CPU ids (ids.cpu(), outside your timed loop)" % (t.device,))
    if id_bytes is not None and id_bytes != width:
        raise ValueError("ids are %s but id_bytes=%d" % (t.dtype, id_bytes))
    n = t.numel()
    if n <= _TORCH_SHORT:
        # A few blocks (a contiguous copy, a page or two): their values in one call into torch, packed here. A
        # view of the storage (numpy(), or reshape and contiguous first) costs several calls.
        v = t.tolist()
        if type(v) is int:  # a 0-d tensor: one id (ids[i])
            return _SHORT_PACKS[width, 1](v), width, 1
        if (v and type(v[0]) is int) or (not v and t.dim() == 1):
            return _SHORT_PACKS[width, n](*v), width, n
        raise _shape_error(t.shape)
    if t.dim() != 1:
        raise _shape_error(t.shape)
    if not t.is_contiguous():
        t = t.contiguous()
    try:
        arr = t.numpy()
    except (RuntimeError, ImportError, TypeError):  # torch without numpy: read the storage in place
        import ctypes

        raw = (ctypes.c_char * (n * width)).from_address(t.data_ptr())
        raw._keep = t  # the tensor lives as long as the view of its bytes
        mv = memoryview(raw).cast("B")
    else:
        mv = memoryview(arr).cast("B")
    if not _LITTLE:
        import array

        a = array.array("i" if width == 4 else "q", mv.tobytes())
        a.byteswap()
        mv = memoryview(a).cast("B")
    return mv, width, n


def _from_buffer(obj, id_bytes: Optional[int]):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("block ids must be a numpy array, a torch CPU tensor or a buffer of int32/int64 "
                        "(array.array('q', ids), numpy.asarray(ids, dtype=numpy.int64)), not %s"
                        % type(obj).__name__) from None
    if mv.ndim > 1:
        raise _shape_error(mv.shape)
    fmt = mv.format.lstrip("@=<>!")
    big = mv.format[:1] in (">", "!") or (mv.format[:1] in ("@", "=", "") and not _LITTLE)
    if fmt in ("B", "b", "c") and mv.itemsize == 1:
        if id_bytes not in (4, 8):
            raise ValueError("ids given as raw bytes need id_bytes=4 (int32) or id_bytes=8 (int64)")
        if mv.nbytes % id_bytes:
            raise ValueError("%d bytes of ids are not a whole number of %d-byte ids" % (mv.nbytes, id_bytes))
        width, big = id_bytes, False  # raw bytes are taken as already little-endian
    elif fmt in _SIGNED and mv.itemsize in (4, 8):
        width = mv.itemsize
        if id_bytes is not None and id_bytes != width:
            raise ValueError("ids are %d-byte integers but id_bytes=%d" % (width, id_bytes))
    else:
        raise _dtype_error("a buffer of format %r (%d-byte items)" % (mv.format, mv.itemsize))
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    mv = mv.cast("B")
    if big:
        import array

        a = array.array("i" if width == 4 else "q")
        if a.itemsize != width:
            a = array.array("l")
        a.frombytes(mv.tobytes())
        a.byteswap()
        mv = memoryview(a).cast("B")
    return mv, width, mv.nbytes // width


def pack_ids(ids, id_bytes: Optional[int] = None) -> Tuple[Union[memoryview, bytes], int, int]:
    """Returns (little-endian bytes of ids, bytes per id, count): a memoryview of ids, without copying, when they
    are already contiguous little-endian int32/int64, else bytes (a short torch tensor's values packed). Raises
    ValueError for another dtype or more than one dimension, TypeError for a type that is not an array or a buffer
    (a list: wrap it in array.array('q', ids) or numpy)."""
    pack = _PACKERS.get(type(ids))
    if pack is None:
        pack = _packer(ids)
    return pack(ids, id_bytes)


# How each type of ids is packed, decided once per type: asking a torch tensor for its module and attributes
# costs about a microsecond a list, on every call.
_PACKERS: dict = {}


def _packer(ids):
    tp = type(ids)
    mod = tp.__module__ or ""
    if mod.startswith("numpy") and hasattr(ids, "dtype"):
        pack = _from_numpy
    elif mod.startswith("torch") and hasattr(ids, "dtype") and hasattr(ids, "device"):
        pack = _from_torch
    elif isinstance(ids, (list, tuple, range)):
        raise TypeError("block ids must be an array, not a Python %s: use numpy.asarray(ids, dtype=numpy.int64) "
                        "or array.array('q', ids)" % tp.__name__)
    else:
        pack = _from_buffer
    if len(_PACKERS) < 64:
        _PACKERS[tp] = pack
    return pack


# Buffer formats of native int32/int64 ids; on a little-endian host their bytes go into a frame as they are.
_SHORT_FORMATS = frozenset(("i", "l", "q")) if _LITTLE else frozenset()


def short_ids(ids):
    """pack_ids(ids) found with as few steps as a latency-bound call allows, or None for what pack_ids must take
    itself (then call it): a 1-D numpy int32/int64 array shorter than ARENA_MIN_IDS is copied into bytes (fewer
    steps than a view of it, whatever its strides), a longer one and a contiguous native int32/int64 buffer
    (an array.array) viewed as they are, and a torch tensor packed as pack_ids packs it (refusals included)."""
    pack = _PACKERS.get(type(ids))
    if pack is None:
        try:
            pack = _packer(ids)
        except TypeError:  # a list: pack_ids says what to pass instead
            return None
    if pack is _from_torch:  # before memoryview(), whose refusal costs a microsecond or two
        return _from_torch(ids, None)
    if pack is _from_numpy and _LITTLE:
        width = (_NUMPY_WIDTHS or _numpy_widths(sys.modules["numpy"])).get(ids.dtype)
        if width is not None and ids.ndim == 1:
            n = len(ids)
            if n < ARENA_MIN_IDS:
                return ids.tobytes(), width, n
    try:
        mv = memoryview(ids)
    except TypeError:
        return None
    if mv.ndim != 1 or mv.format not in _SHORT_FORMATS or not mv.c_contiguous:
        return None
    width = mv.itemsize
    if width != 4 and width != 8:
        return None
    return mv.cast("B"), width, mv.shape[0]


# numpy's native int32 and int64 dtypes and their widths, filled once numpy is met.
_NUMPY_WIDTHS: dict = {}


def _numpy_widths(np) -> dict:
    if not _NUMPY_WIDTHS:
        _NUMPY_WIDTHS.update({np.dtype(np.int32): 4, np.dtype(np.int64): 8})
    return _NUMPY_WIDTHS


def narrow_ids(ids, count: int):
    """int64 ids (a numpy array or a torch CPU tensor) as 32-bit little-endian bytes when every one fits in 32
    bits, else None. Half the bytes cross the socket (a list of 15,360 pairs then fits the socket's buffer in one
    write) and the agent copies them as they are instead of checking each (it reads 32-bit ids as unsigned, so
    ids of 2^31 or more stay what they are). One OR over the ids shows whether any has a high bit set (a
    negative one has them all), one cast narrows them. torch tensors go through their numpy view: torch's own
    reductions start its thread pool and cost twice as much."""
    try:
        a = _as_numpy(ids)
        if a is None or a.dtype.itemsize != 8 or not _fits_32(a):
            return None
        return memoryview(a.astype("<u4")).cast("B")
    except (RuntimeError, TypeError, ValueError, AttributeError, ImportError, KeyError):
        return None


def _fits_32(a) -> bool:
    """Whether every id of a numpy int32/int64 array fits in 32 bits: one OR shows whether an int64 id has a
    high bit set (a negative one has them all); int32 ids keep their bits."""
    return a.dtype.itemsize == 4 or not a.size or not int(sys.modules["numpy"].bitwise_or.reduce(a)) >> 32


def widen(mv: memoryview) -> memoryview:
    """int32 ids as int64 ids (when the two sides' ids differ in width)."""
    import array

    a32 = array.array("i")
    if a32.itemsize != 4:
        raise ValueError("this platform has no 4-byte array type: pass ids of one width")
    a32.frombytes(mv)
    if not _LITTLE:
        a32.byteswap()
    a64 = array.array("q", a32)
    if not _LITTLE:
        a64.byteswap()
    return memoryview(a64).cast("B")


def nanos(seconds: float) -> int:
    """A timeout of seconds as a Duration's nanoseconds, at least one: a positive one shorter than a nanosecond
    would travel as 0, which the agent reads as no timeout given (its default)."""
    return max(int(seconds * 1e9), 1)


def blocks_request(op: int, layout_id: int, remote: pb.LayoutRef, local: memoryview, remote_ids: memoryview,
                   id_bytes: int, timeout: Optional[float] = None, notify: Optional[bytes] = None,
                   wait: bool = True) -> pb.TransferBlocksRequest:
    """The request as a protobuf message (for the gRPC call; copies the ids once)."""
    req = pb.TransferBlocksRequest(op=op, layout_id=layout_id, remote=remote, local_ids=bytes(local),
                                   remote_ids=bytes(remote_ids), id_bytes=id_bytes, wait=wait, notify=notify or b"")
    if timeout:
        req.timeout.FromNanoseconds(nanos(timeout))
    return req


_HEADS: dict = {}


def _remote_key(remote):
    """The cache key of the other side: a RemoteLayout says it without building its LayoutRef (reading a
    protobuf message's fields costs as much as the rest of a small frame); a LayoutRef is read."""
    key = getattr(remote, "_key", None)
    if key is not None:
        return key()
    return (remote.WhichOneof("target"), remote.layout_id, remote.segment, remote.node)


def _head(op, layout_id, remote, id_bytes, timeout, notify, wait) -> bytes:
    """The serialized scalar fields of a block request; the few distinct ones a caller sends are kept, since
    building a protobuf message costs more than the rest of the frame. remote is a LayoutRef or anything with
    ref and _key() (a RemoteLayout)."""
    key = None
    if not notify:
        key = (op, layout_id, _remote_key(remote), id_bytes, timeout, wait)
        head = _HEADS.get(key)
        if head is not None:
            return head
    ref = remote if isinstance(remote, pb.LayoutRef) else remote.ref
    msg = pb.TransferBlocksRequest(op=op, layout_id=layout_id, remote=ref, id_bytes=id_bytes, wait=wait,
                                   notify=notify or b"")
    if timeout:
        msg.timeout.FromNanoseconds(nanos(timeout))
    head = msg.SerializeToString()
    if key is not None:
        if len(_HEADS) >= 256:
            _HEADS.clear()
        _HEADS[key] = head
    return head


# Tag of FastRequest.call_timeout (6): wire type 2.
_TAG_CALL_TIMEOUT = b"\x32"
# FastRequest.call_timeout fields by seconds: the few a caller uses.
_CALL_TIMEOUTS: dict = {}


def call_timeout_field(seconds: Optional[float]) -> bytes:
    """FastRequest.call_timeout (how long the agent has to answer: what it does for the call ends by then), as
    bytes appended to a frame's FastRequest (a reader takes its fields in any order); b"" for None."""
    if not seconds:
        return b""
    field = _CALL_TIMEOUTS.get(seconds)
    if field is None:
        d = pb.FastRequest()
        d.call_timeout.FromNanoseconds(nanos(seconds))
        field = d.SerializeToString()
        if len(_CALL_TIMEOUTS) >= 256:
            _CALL_TIMEOUTS.clear()
        _CALL_TIMEOUTS[seconds] = field
    return field


def blocks_frame(op: int, layout_id: int, remote, local: memoryview, remote_ids: memoryview,
                 id_bytes: int, timeout: Optional[float] = None, notify: Optional[bytes] = None,
                 wait: bool = True, call_timeout: Optional[float] = None) -> List:
    """The fast-socket frame (u32 big-endian length + FastRequest{blocks, call_timeout}) as a list of buffers
    for socket.sendmsg: the scalar fields are serialized by protobuf, the two id fields are appended as
    length-delimited fields pointing at the callers' buffers (protobuf readers take fields in any order).
    remote is a LayoutRef or a RemoteLayout."""
    head = _head(op, layout_id, remote, id_bytes, timeout, notify, wait)
    ln, rn = len(local), len(remote_ids)
    ct = call_timeout_field(call_timeout)
    # A caller repeats a few shapes (one id, a batch of a given size): their framing is kept beside the heads.
    key = (head, ln, rn, ct) if not notify else None
    framing = _FRAMINGS.get(key) if key is not None else None
    if framing is None:
        lk = _TAG_LOCAL_IDS + _varint(ln)
        rk = _TAG_REMOTE_IDS + _varint(rn)
        inner = len(head) + len(lk) + ln + len(rk) + rn
        outer = _TAG_FAST_BLOCKS + _varint(inner)
        framing = (struct.pack(">I", len(outer) + inner + len(ct)) + outer + head + lk, rk, ct)
        if key is not None:
            if len(_FRAMINGS) >= 1024:
                _FRAMINGS.clear()
            _FRAMINGS[key] = framing
    if framing[2]:
        return [framing[0], local, framing[1], remote_ids, framing[2]]
    return [framing[0], local, framing[1], remote_ids]


# The framing of recent frames: (head, local id bytes, remote id bytes) -> (prefix, remote ids' key).
_FRAMINGS: dict = {}


# Tag of FastRequest.wait (4): wire type 2.
_TAG_FAST_WAIT = b"\x22"
# Serialized FastWait{timeout} by timeout (seconds): the few a caller uses.
_WAIT_TIMEOUTS: dict = {}


def wait_frame(transfer_ids, timeout: float, call_timeout: Optional[float] = None) -> List[bytes]:
    """The fast-socket frame of FastRequest{wait: FastWait{transfer_ids, timeout}}: the ids serialized by protobuf,
    the timeout's bytes kept per timeout and appended (a reader merges fields in any order), the FastRequest's own
    framing written here. Half of what building both messages cost (about 3 against 6 µs for one id on the
    development VM)."""
    tail = _WAIT_TIMEOUTS.get(timeout)
    if tail is None:
        w = pb.FastWait()
        w.timeout.FromNanoseconds(nanos(timeout))
        tail = w.SerializeToString()
        if len(_WAIT_TIMEOUTS) >= 256:
            _WAIT_TIMEOUTS.clear()
        _WAIT_TIMEOUTS[timeout] = tail
    inner = pb.FastWait(transfer_ids=transfer_ids).SerializeToString() + tail
    head = _TAG_FAST_WAIT + _varint(len(inner))
    ct = call_timeout_field(call_timeout)
    return [struct.pack(">I", len(head) + len(inner) + len(ct)), head, inner + ct]


# Tag of TransferBlocksRequest's arena_ids (10): wire type 0.
_TAG_ARENA_IDS = b"\x50"
# Lists at least this long go through the connection's id arena when it has one.
ARENA_MIN_IDS = 1024


def _as_numpy(ids):
    """ids as a 1-D numpy int32/int64 array without copying, or None when they are something else (the packing
    path then takes them and says what is wrong)."""
    mod = type(ids).__module__ or ""
    if mod.startswith("torch"):
        # One call into torch (each costs microseconds: reshape, contiguous and the checks cost 19 µs of a
        # 15,360-id call on the H200 VM); numpy then does the rest on the view. A CUDA tensor or one that needs
        # grad raises, and takes the packing path, which says what is wrong.
        try:
            ids = ids.numpy()
        except (TypeError, RuntimeError):
            return None
    elif not mod.startswith("numpy"):
        return None
    a = ids.reshape(-1)
    if a.dtype.kind != "i" or a.dtype.itemsize not in (4, 8):
        return None
    return a


class IdArena:
    """Shared memory (a sealed memfd, mapped by the agent read-only) that a fast connection writes block ids
    into, so long lists do not cross the socket. Not thread-safe: the client fills it under its fast lock."""

    def __init__(self, buf, np):
        self.buf = buf
        self.size = len(buf)
        self._np = np
        self._u32 = np.frombuffer(buf, dtype="<u4")
        self._dtypes = {4: np.dtype("<i4"), 8: np.dtype("<i8")}

    def close(self):
        self._u32 = None
        try:
            self.buf.close()
        except BufferError:  # a view of it still lives somewhere: the mapping goes when that view does
            pass

    def fill(self, local, local_width: int, remote, remote_width: int) -> Optional[int]:
        """Writes two packed id lists (pack_ids' little-endian bytes and their widths) as 32-bit ids, local
        first, and returns their count, or None when they differ in length, an id does not fit in 32 bits or
        they do not fit the arena (the frame then carries them)."""
        np = self._np
        a = np.frombuffer(local, dtype=self._dtypes[local_width])
        b = np.frombuffer(remote, dtype=self._dtypes[remote_width])
        n = a.shape[0]
        if n != b.shape[0] or 8 * n > self.size:
            return None
        if not _fits_32(a) or not _fits_32(b):
            return None
        # int32 ids keep their bits (a negative one reads as a huge unsigned id, refused as out of range).
        np.copyto(self._u32[:n], a, casting="unsafe")
        np.copyto(self._u32[n:2 * n], b, casting="unsafe")
        return n


def arena_frame(op: int, layout_id: int, remote, count: int, timeout: Optional[float] = None,
                notify: Optional[bytes] = None, wait: bool = True, call_timeout: Optional[float] = None) -> List:
    """The fast-socket frame of a block transfer whose count ids a side (32-bit) are in the connection's arena."""
    head = _head(op, layout_id, remote, 4, timeout, notify, wait)
    ak = _TAG_ARENA_IDS + _varint(count)
    inner = len(head) + len(ak)
    outer = _TAG_FAST_BLOCKS + _varint(inner)
    ct = call_timeout_field(call_timeout)
    return [struct.pack(">I", len(outer) + inner + len(ct)) + outer + head + ak + ct]

