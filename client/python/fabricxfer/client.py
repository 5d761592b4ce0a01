# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Python client of the fabricxfer agent's sidecar socket.

    from fabricxfer.client import Client, shared_memory, to_segment

    with Client("/var/run/fabricxfer/kv/agent.sock") as c:
        fd, buf = shared_memory("kv", 1 << 20)
        kv = c.register_host(fd, 0, len(buf), segment="kv-0")
        c.write(kv, 0, to_segment("node-b", "kv-0"), 0, 4096)

File descriptors go to the agent's fd socket (agent.fd.sock beside agent.sock) with SCM_RIGHTS; the agent
answers with a one-time token the gRPC call names. Needs grpcio and protobuf (Debian: python3-grpcio,
python3-protobuf); the generated stubs live in fabricxfer/agent/v1 (hack/gen-proto.sh). torch (register_tensor)
and numpy (block ids) are optional.

Block layouts (a paged KV cache: every layer's K and V tensor cut into blocks of one size):

    kv = [c.register_tensor(t) for t in kv_tensors]          # or register_host regions
    lay = c.register_layout(kv, block_bytes=16 * 1024, segment="kv-0")
    c.transfer_blocks("write", lay, src_ids, to_layout_segment("node-b", "kv-0"), dst_ids)
"""

import array
import atexit
import contextlib
import errno
import fcntl
import mmap
import operator
import os
import platform
import random
import socket
import stat
import struct
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence

import grpc

from fabricxfer import blocks as _blocks
from fabricxfer import fastconn as _fastconn
from fabricxfer import cuda as _cuda
from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.agent.v1 import agent_pb2_grpc as pb_grpc

_short_ids, _ARENA_MIN_IDS = _blocks.short_ids, _blocks.ARENA_MIN_IDS

FD_SOCKET_NAME = "agent.fd.sock"
FAST_SOCKET_NAME = "agent.fast.sock"
API_VERSION = "v1"
_CODES = {c.value[0]: c for c in grpc.StatusCode}
# Status codes by name, as a TagFailure spells them (the agent's are Go's: "Unavailable", "OutOfRange",
# "Canceled") and as gRPC's Python names do ("UNAVAILABLE").
_CODE_NAMES = {**{c.name: c for c in grpc.StatusCode},
               **{"".join(w.capitalize() for w in c.name.split("_")): c for c in grpc.StatusCode},
               "OK": grpc.StatusCode.OK, "Canceled": grpc.StatusCode.CANCELLED}
_OPS = {"read": pb.OP_READ, "write": pb.OP_WRITE}
_OP_NAMES = {code: name for name, code in _OPS.items()}
# The largest frame the agent reads on its fast socket (agent/server/fastsock.go).
FAST_FRAME_MAX = 4 << 20
# The notify payload limit of an agent too old to say it (info.limits.max_notify_bytes).
DEFAULT_MAX_NOTIFY_BYTES = 64 << 10
# The most transfers one FastWait lists (the agent refuses more).
_MAX_WAIT_IDS = 1024
# The timeout the agent gives a transfer that names none (engines.DefaultTimeout): an unwaited transfer without
# a timeout may hold its call that long (a peer that does not answer), so the call waits for the agent past it.
AGENT_DEFAULT_TIMEOUT = 60.0
# GetInfoResponse.features of an agent that bounds a fast call by its FastRequest.call_timeout.
_FEATURE_CALL_TIMEOUT = "fast-call-timeout"


def _seconds(timeout, what: str = "timeout", default: str = " (None or 0: the client's)"):
    """timeout itself, refused unless None or a number of seconds from 0 to a year (NaN fails both comparisons; True
    is not a second). A positive one shorter than a nanosecond travels as one (as 0 it would read as the default)."""
    try:
        if timeout is None or (0 <= timeout <= _MAX_TIMEOUT and type(timeout) is not bool):
            return timeout
    except TypeError:  # a string, say
        pass
    raise ValueError("%s must be seconds from 0 to %d%s, not %r" % (what, _MAX_TIMEOUT, default, timeout))


# The longest timeout a call takes: a year.
_MAX_TIMEOUT = 365 * 24 * 3600


def _op(op: str) -> int:
    try:
        return _OPS[op]
    except (KeyError, TypeError):
        raise ValueError("op must be \"read\" or \"write\", not %r" % (op,)) from None


# How long close() waits for the agent to end the session (EndSession).
_CLOSE_WAIT = 2.0

# How long a call waits for the fast connection while another thread's call holds it: past it the call goes
# through gRPC (a one-block call behind another thread's waited 256 MiB one waited for all of it), as the Go
# client's do.
FAST_QUEUE_WAIT = 200e-6


class _FastBusy(Exception):
    """Another thread's call held the fast connection past FAST_QUEUE_WAIT: this call goes through gRPC."""


def _freed_soon(lock) -> bool:
    """Whether a fast lock another thread holds is given back within FAST_QUEUE_WAIT, polled (sleeping between
    looks, so the holder gets the interpreter) and never taken here. The call then takes it with `with`, and
    waits should another thread take it first: a lock taken by acquire() and given back in a finally, here or in
    the call, was left held for good by a signal handled between the two (every later call through gRPC,
    recover() waiting for ever); `with` gives it back."""
    end = time.perf_counter() + FAST_QUEUE_WAIT
    while lock.locked():
        if time.perf_counter() >= end:
            return False
        time.sleep(20e-6)
    return True


# How long a fast-socket call polls for the agent's reply before sleeping in poll(): waking a sleeping reader
# costs tens of microseconds, as much as a small transfer, and a waited 1 GiB copy takes half a millisecond. A
# waiting caller has nothing else to do on that thread; torch.cuda.synchronize() polls the same way.
FAST_SPIN = 10e-3
_HDR = struct.Struct(">I")
_U32 = struct.Struct("<I")
# CPUs that keep a core's stores in order and its loads in order (x86), as an unsealed mailbox needs.
_ORDERED_CPUS = frozenset(("x86_64", "AMD64", "i386", "i686"))
# The fast connection's id arena: 131,072 32-bit ids, two lists of the most one transfer may name.
ID_ARENA_BYTES = 1 << 20


class _StatusError(grpc.RpcError):
    """An error that reads like a gRPC call's: code() and details()."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self._code, self._details = code, message

    def code(self):
        return self._code

    def details(self):
        return self._details

    def __str__(self):
        return "%s: %s" % (self._code.name, self._details)


class AgentError(_StatusError):
    """A call's error status, whichever socket the call took (the fast socket's, and gRPC's in its place): code()
    and details() read like a gRPC error's, which it is (a grpc.RpcError), so one except clause covers both. The
    agent's DEADLINE_EXCEEDED (a deadline ran out: the call's, which the agent answers a little before the caller
    gives up, or the transfer's own) is also a TimeoutError, as a silent agent's DeadlineExceeded is."""

    def __new__(cls, code=None, message: str = ""):
        if cls is AgentError and code in _DEADLINE_CODES:
            cls = AgentDeadlineExceeded
        return super().__new__(cls, code, message)

    def __init__(self, code, message: str):
        super().__init__(code if isinstance(code, grpc.StatusCode) else _CODES.get(code, grpc.StatusCode.UNKNOWN),
                         message)


# DEADLINE_EXCEEDED as a grpc.StatusCode and as the number a fast reply carries.
_DEADLINE_CODES = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])


class AgentDeadlineExceeded(AgentError, TimeoutError):
    """The agent's answer that a deadline ran out, naming what (a peer that did not answer, say): an AgentError and
    a TimeoutError. AgentError(DEADLINE_EXCEEDED, ...) makes one."""


def _agent_error(e: grpc.RpcError) -> "_StatusError":
    """gRPC's error e as the fast socket's for the same outcome: the agent's answer as AgentError, and gRPC's own
    deadline (no answer came in time) as DeadlineExceeded, whichever way the call went (an answer of the agent's
    with that code is its own, and stays an AgentError). Raise it outside the except clause that caught e, so that
    e is not chained to it: e's traceback would hold the call's frames, and the memory their locals name (a
    caller's mapped buffers), for as long as the error is kept."""
    if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and e.details() == _GRPC_DEADLINE:
        return DeadlineExceeded("the agent did not answer within the call's deadline: what it asked may still "
                                "take effect")
    return AgentError(e.code(), e.details() or "")


class DeadlineExceeded(_StatusError, TimeoutError):
    """The agent did not answer a call within its deadline; code() is DEADLINE_EXCEEDED, as gRPC's own call would
    say (wait_all and notifications raise it too when their time ran out; the rest is of silent calls). The
    session is fine, but what the call asked may still happen (a transfer may land, under
    an id the client never learns); a silent call's fast connection is closed, and the next fast call opens a
    new one."""

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, message)


class ClientClosed(ValueError):
    """A call on a Client after its close() (a ValueError, as a call on a closed file or gRPC channel)."""

    def __init__(self, message: str = "the client is closed: create a new Client"):
        super().__init__(message)


DEFAULT_SOCKET = "/run/fabricxfer/agent.sock"
HOST_SOCKET_DIRS = ("/run/fabricxfer", "/var/run/fabricxfer")


def default_socket(default: Optional[str] = None, host_dirs: Optional[Sequence[str]] = None) -> str:
    """The socket a client dials when given no path and no $FABRICXFER_SOCKET, by the Go client's rule: default
    (where a pod mounts it) when it is there, else the one pool socket under the host's socket directories
    (<dir>/<pool>/agent.sock: an agent run standalone, or a DaemonSet's on its node), else default. Several
    pools' sockets are not guessed between: dialing default then fails naming them."""
    default = default or DEFAULT_SOCKET
    if _is_socket(default):
        return default
    found = _host_sockets(host_dirs)
    return found[0] if len(found) == 1 else default


def _host_sockets(host_dirs: Optional[Sequence[str]] = None) -> List[str]:
    """The pool sockets under the host's socket directories (<dir>/<pool>/agent.sock), each counted once."""
    found = []
    for d in host_dirs or HOST_SOCKET_DIRS:
        try:
            pools = sorted(os.listdir(d))
        except OSError:
            continue
        for pool in pools:
            path = os.path.realpath(os.path.join(d, pool, "agent.sock"))
            if _is_socket(path) and path not in found:
                found.append(path)
    return found


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _request_fits(nbytes: int, items: int):
    """Refuses a request the agent could not read (past 4 MiB), which gRPC would refuse saying only its size."""
    if nbytes > FAST_FRAME_MAX:
        raise ValueError("%d items make a %d-byte request; the agent reads requests of at most %d bytes: split the "
                         "transfer (or move blocks of a layout with transfer_blocks)" % (items, nbytes, FAST_FRAME_MAX))


class AgentUnreachable(_StatusError, ConnectionError):
    """No agent answered at the socket within the client's timeout, or (at once, UNAVAILABLE) there is no socket at
    the path; the message names the path and what was found there. code() is gRPC's (DEADLINE_EXCEEDED or
    UNAVAILABLE)."""


def _unreachable(path: str, timeout: float, details: str) -> str:
    found = (_why_no_socket(path) if not _is_socket(path) else
             "the socket exists but nothing answered on it (%s): a socket left by a stopped agent?" % details)
    return "no agent answered at %s within %.1f s: %s" % (path, timeout, found)


# The longest path a Unix socket address holds (sockaddr_un.sun_path, less its terminating zero).
_SUN_PATH_MAX = 107


def _why_no_socket(path: str, pools: Sequence[str] = ()) -> str:
    """Why no agent can answer at path, which is no socket; pools: the host's pool sockets, when Client() was
    given no path and found several."""
    if len(pools) > 1:
        return ("this host has several pools' sockets (%s): name one (Client(path) or FABRICXFER_SOCKET)"
                % ", ".join(pools))
    if path.startswith("unix:"):
        rest = path[len("unix:"):]
        return "give the socket's path, without the unix: scheme: %s" % (rest[2:] if rest.startswith("//") else rest)
    if os.path.isdir(path):
        inside = [p for p in [os.path.join(path, "agent.sock")] + _host_sockets((path,)) if _is_socket(p)]
        return "it is a folder, not a socket: name %s" % (
            " or ".join(inside[:4]) if inside else "a pool's socket (<socket dir>/<pool>/agent.sock)")
    if os.path.exists(path):
        return "it is not a socket: name the agent's (<socket dir>/<pool>/agent.sock)"
    folder = os.path.dirname(path) or "."
    beside = os.path.join(folder, "agent.sock")
    if _is_socket(beside):
        return "nothing of that name, but the agent's socket is beside it: name %s" % beside
    pools = _host_sockets((folder,))
    if pools:
        return "nothing of that name, but pools' sockets are in that folder: name %s" % " or ".join(pools[:4])
    return ("there is no socket there: is the agent running, and is this its socket directory "
            "(<socket dir>/<pool>/agent.sock; FABRICXFER_SOCKET names it in a pod with a claim)?")


def _sibling_socket(path: str) -> Optional[str]:
    """Why path, a socket, is not the one a Client connects to: the agent's fast or descriptor socket, which the
    client opens itself beside agent.sock (their protocol is not gRPC, so a connection would wait out the whole
    timeout and blame a stopped agent); None for any other."""
    name = os.path.basename(path)
    if name not in (FAST_SOCKET_NAME, FD_SOCKET_NAME):
        return None
    return "%s is the agent's %s socket, which the client opens itself: name %s" % (
        path, "fast" if name == FAST_SOCKET_NAME else "descriptor", os.path.join(os.path.dirname(path), "agent.sock"))


# What gRPC's client says of a call whose deadline passed with no answer (an agent's own answer says more).
_GRPC_DEADLINE = "Deadline Exceeded"

# The trailer key of an UNAVAILABLE the agent answered itself (fastwire.AnsweredHeader in the Go tree).
_ANSWERED = "fabricxfer-answered"


def _answered(call) -> bool:
    """Whether a failed gRPC call's UNAVAILABLE came from the agent (a peer it cannot reach) rather than from a
    connection that broke under it."""
    try:
        return any(key == _ANSWERED for key, _ in call.trailing_metadata() or ())
    except Exception:  # a call that never reached a server has no trailers to read
        return False


def _header_of(call):
    """Waits for a streaming call's header (or its end)."""
    try:
        call.initial_metadata()
    except grpc.RpcError:
        pass


class _NotificationStream:
    """The iterator notifications() returns: the gRPC call's, but a stream the agent's restart or stop ended raises
    SessionLost, as the client's other calls do, instead of gRPC's UNAVAILABLE, and the agent's other ends
    (RESOURCE_EXHAUSTED for a listener too far behind) raise AgentError. cancel() ends it: a for loop over it
    finishes (gRPC's iterator raised CANCELLED into it). The call's other methods pass through."""

    def __init__(self, client: "Client", call):
        self._client, self._call = client, call
        self._cancelled = self._forked = False
        _FORKS.streams.add(self)

    def __iter__(self):
        return self

    def __next__(self) -> pb.Notification:
        if self._forked:
            raise RuntimeError("this notification stream is the parent process's (inherited across a fork): open one "
                               "in this process with a Client of its own")
        try:
            return next(self._call)
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                # The caller's own cancel(), a close() after it or not: a for loop over the stream ends.
                raise StopIteration from None
            if self._client._closed:
                raise ClientClosed() from e
            if self._client._session_lost(e.code(), e.details(), _answered(e)):
                raise SessionLost("agent session lost (%s): call recover() and notifications() again"
                                  % e.details()) from e
            ended = _agent_error(e)
        raise ended  # outside the except clause, as Client._call's

    def cancel(self):
        self._cancelled = True
        if self._forked:
            return False  # the parent's: a cancel sent from here would end the parent's stream
        return self._call.cancel()

    def _inherited(self):
        """Marks the stream as a forked child's copy of its parent's. gRPC cancels a call that is garbage-collected
        unfinished, and the child's copy of it, collected when the child exits (sys.exit, not os._exit), sent that
        cancel on the parent's connection: the parent's stream ended with nothing said, and its reader waited for
        ever. The copy is marked finished so that nothing is sent."""
        self._forked = True
        state = getattr(self._call, "_state", None)  # gRPC's own; absent in other versions: nothing to do
        try:
            if state is not None and state.code is None:
                # Not under state.condition: a thread of the parent may have held it at the fork, and this
                # process has one thread. gRPC's __del__ takes it: a fresh one cannot be held.
                state.code, state.details = grpc.StatusCode.CANCELLED, "inherited by a forked process"
                state.condition = threading.Condition()
        except AttributeError:
            pass

    def __getattr__(self, name):
        return getattr(self._call, name)


def status_first(raw) -> Optional[pb.TransferStatus]:
    """The status of a fast reply whose response starts with it (agent.proto, FastReply: 1a LEN 2a LEN', the status
    in the LEN' bytes after), decoded alone; None for any other reply (an error, a response without a status, a
    status of 128 bytes or more), which is decoded whole. A waited call that moved one block spent a microsecond of
    its round trip decoding the rest."""
    if (len(raw) < 4 or raw[0] != 0x1A or raw[2] != 0x2A or raw[1] != len(raw) - 2 or raw[1] > 0x7F
            or raw[3] > len(raw) - 4 or raw[3] > 0x7F):
        return None
    return pb.TransferStatus.FromString(raw[4:4 + raw[3]])


class _StateWatch:
    """Client._on_state for gRPC's connectivity watch, holding the client weakly until the interpreter exits, then
    strongly (pinned): gRPC's watch thread then keeps it, and its channel, out of the interpreter's teardown, where
    the channel's own cleanup would wait for a thread that no longer runs (the process never exited)."""

    __slots__ = ("_ref", "pinned")

    def __init__(self, client: "Client"):
        self._ref = weakref.ref(client)
        self.pinned = None

    def __call__(self, state):
        c = self._ref()
        if c is not None:
            c._on_state(state)


def _end_dropped_client(stub, channel, watch, owned: dict, session_box: list):
    """What close() does, for a Client collected without it, in a thread of its own (a collection may happen in
    any thread, in the middle of anything): the session ends (the agent frees its regions and names), then the
    client's descriptors close and PyTorch's references go back, then the connection."""

    def end():
        ended = False
        try:
            stub.EndSession(pb.EndSessionRequest(), timeout=_CLOSE_WAIT, metadata=session_box[0])
            ended = True
        except (grpc.RpcError, ValueError):
            pass
        for how in list(owned.values()):
            if how is not None:
                # Without the agent's word that it let go, PyTorch's reference stays: the allocator must not hand
                # the memory out again while the agent may still reach it.
                Client._drop(how, release=ended)
        channel.unsubscribe(watch)
        channel.close()
    threading.Thread(target=end, name="fabricxfer-dropped-client", daemon=True).start()


class _Forks:
    """What a forked child inherits: the parent's clients and notification streams (their gRPC connection, fast
    socket and mailbox are the parent's, and a child writing to them breaks the parent's calls), and whether gRPC
    was running when the process forked (without GRPC_ENABLE_FORK_SUPPORT it cannot start again in the child: a
    new client would wait forever, and its traffic can reach the parent's connection)."""

    def __init__(self):
        self.clients = weakref.WeakSet()
        self.streams = weakref.WeakSet()
        self.grpc_running = False

    def after_in_child(self):
        for c in list(self.clients):
            c._forked = True
            # The session is the parent's to end, and the client stays (pinned) as long as the child: a gRPC
            # channel collected here waits in its cleanup for a thread of the parent's, which the child has not.
            _keep_for_good(c)
            c._losses += 1  # the next session check says why
            # A lock another thread of the parent held at the fork stays held here: the child gets its own.
            c._lock, c._fast_lock, c._recover_lock = threading.Lock(), threading.Lock(), threading.Lock()
        for stream in list(self.streams):
            stream._inherited()
        if self.clients and os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").lower() not in ("1", "true"):
            self.grpc_running = True
        self.clients, self.streams = weakref.WeakSet(), weakref.WeakSet()


_FORKS = _Forks()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_FORKS.after_in_child)


def _keep_for_good(c: "Client"):
    """Detaches c's finalizer and pins c through its connectivity watch, so it is never collected (_StateWatch)."""
    finalizer = getattr(c, "_finalizer", None)  # None while its __init__ runs
    if finalizer is not None:
        finalizer.detach()
    watch = getattr(c, "_state_watch", None)
    if watch is not None:
        watch.pinned = c


def _let_clients_go_at_exit():
    """At the interpreter's exit the agent frees what the process held: clients still open are not ended one by
    one, and none is collected in the teardown (_StateWatch)."""
    for c in list(_FORKS.clients):
        _keep_for_good(c)


atexit.register(_let_clients_go_at_exit)

_FORKED_CLIENT = ("this Client belongs to the process that created it; a forked child must create its own (and "
                  "cannot while gRPC ran in the parent without GRPC_ENABLE_FORK_SUPPORT=1: start workers with "
                  "multiprocessing's 'spawn' method instead)")


# The metadata key a call names the session it registered its memory in with (the agent's SessionHeader).
_SESSION_HEADER = "fabricxfer-session"


def _session_metadata(info: pb.GetInfoResponse):
    """The metadata that names info's session on every call (none for an agent too old to name it): the agent
    refuses a call that reaches another session, instead of registering memory in one this client does not know."""
    if not info.instance:
        return None
    return ((_SESSION_HEADER, "%s/%d" % (info.instance, info.session)),)


def _broke(e: BaseException) -> bool:
    """Whether an OSError met in a fast call is the connection's (the agent's end gone, the stream out of step, the
    socket missing: the system's errors carry an errno), not one a signal handler raised into the call (a
    TimeoutError, say), which the caller should get back."""
    return isinstance(e, ConnectionError) or getattr(e, "errno", None) is not None


def _close_if_ended(sock: socket.socket) -> bool:
    """Closes a socket _fast_drop kept once the agent closed its end, and says whether it did."""
    try:
        ended = _fastconn.await_closed(sock, None)
    except (OSError, ValueError):
        ended = True
    if ended:
        sock.close()
    return ended


class SessionLost(Exception):
    """The connection to the agent ended (agent restarted?): every region registered through it is gone on the
    agent side. Call Client.recover(), then retry."""


def _check_socket_permission(path: str):
    """Fails at once, saying what to change, when this process may not open the agent socket: the socket and its
    directory are root's or the pool's spec.socketGroup, and gRPC would otherwise wait for a readiness that never
    comes. A socket that is not there yet is left to that wait (the agent may still be starting)."""
    try:
        os.stat(path)
        allowed = os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)
    except FileNotFoundError:
        return
    except PermissionError:
        allowed = False
    if not allowed:
        group = ""
        for p in (path, os.path.dirname(path)):  # the socket's folder is in its group too, and may be all we see
            try:
                group = ", socket group %d" % os.stat(p).st_gid
                break
            except OSError:
                pass
        raise PermissionError(
            13, "agent socket not open to uid %d (gid %d, groups %s%s): a non-root pod needs the pool's "
            "spec.socketGroup in its securityContext.supplementalGroups; without Kubernetes, run as the agent's user "
            "or start it with `agent standalone --socket-gid <gid>` naming a group of yours"
            % (os.geteuid(), os.getegid(), os.getgroups(), group), path)


class FdSocketError(_StatusError):
    """The agent's fd socket refused a request (the message says why). It reads like a gRPC error: code() is
    INVALID_ARGUMENT for a descriptor that cannot be memory (a socket, a pipe), RESOURCE_EXHAUSTED for a limit
    that frees up by itself, UNKNOWN otherwise."""

    def __init__(self, message: str):
        code = grpc.StatusCode.UNKNOWN
        for prefix, c in _FD_SOCKET_CODES:
            if message.startswith(prefix):
                code, message = c, message[len(prefix):]
                break
        super().__init__(code, message)


def _read_line(sock: socket.socket, want_fds: bool):
    data, fds = b"", []
    while b"\n" not in data:
        if want_fds:
            chunk, got, _flags, _addr = socket.recv_fds(sock, 256, 4)
            fds.extend(got)
        else:
            chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
        if len(data) > 256:
            break
    if b"\n" not in data:
        for fd in fds:
            os.close(fd)
        raise FdSocketError("connection ended before a full reply")
    return data.split(b"\n", 1)[0].decode(), fds


EXHAUSTED_PREFIX = "RESOURCE_EXHAUSTED: "
# The codes the fd socket's ERR lines start with (FdSocketError.code()).
_FD_SOCKET_CODES = (("INVALID_ARGUMENT: ", grpc.StatusCode.INVALID_ARGUMENT),
                    (EXHAUSTED_PREFIX, grpc.StatusCode.RESOURCE_EXHAUSTED))


def put_fd(fd_socket: str, fd: int, timeout: float = 5.0) -> str:
    """Hands fd to the agent and returns the token naming it (the caller keeps its own fd). A refusal the agent
    marks RESOURCE_EXHAUSTED (a limit that frees up by itself) is retried with backoff until timeout."""
    return _put(fd_socket, [fd], time.monotonic() + timeout)


# The most descriptors one "PUT <n>" carries: the kernel's SCM_MAX_FD.
MAX_PUT_FDS = 253


def put_fds(fd_socket: str, fds: Sequence[int], timeout: float = 5.0) -> List[str]:
    """Hands fds to the agent, in order, and returns the tokens naming them (RegisterMemoryRequest.fd_tokens):
    one "PUT <n>" of up to MAX_PUT_FDS descriptors per token. The caller keeps its own fds. Limits the agent
    marks RESOURCE_EXHAUSTED are retried with backoff until timeout."""
    if not fds:
        raise ValueError("no descriptors to put")
    deadline = time.monotonic() + timeout
    return [_put(fd_socket, list(fds[i:i + MAX_PUT_FDS]), deadline) for i in range(0, len(fds), MAX_PUT_FDS)]


def _put(fd_socket: str, fds: List[int], deadline: float) -> str:
    """One PUT <n> of fds (1 to MAX_PUT_FDS, in one message), retried on RESOURCE_EXHAUSTED until deadline."""
    backoff = 0.002
    line = "PUT\n" if len(fds) == 1 else "PUT %d\n" % len(fds)
    for attempt in range(10):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(max(deadline - time.monotonic(), 0.05))
            with _descriptor_socket(fd_socket):
                s.connect(fd_socket)
                try:
                    socket.send_fds(s, [line.encode()], fds)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # an agent at a limit answers and closes without reading: its answer is still there
                reply, _ = _read_line(s, False)
        if reply.startswith("OK "):
            return reply[3:]
        if reply.startswith("ERR " + EXHAUSTED_PREFIX) and attempt < 9 and time.monotonic() + backoff < deadline:
            time.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, 0.25)
            continue
        raise FdSocketError(reply[4:] if reply.startswith("ERR ") else "malformed reply %r" % reply)
    raise FdSocketError("the fd socket stayed at its limit")


@contextlib.contextmanager
def _descriptor_socket(fd_socket: str):
    """Turns a descriptor socket's timeout into the DeadlineExceeded of every other call the agent did not answer
    in time (a bare "timed out" said nothing of what was asked), and a socket that is not there into an error that
    names it (a bare "No such file or directory" named nothing)."""
    try:
        yield
    except (TimeoutError, socket.timeout) as e:  # socket.timeout is no TimeoutError before Python 3.10
        raise DeadlineExceeded("the agent's descriptor socket %s did not answer in time" % fd_socket) from e
    except FileNotFoundError as e:
        raise _not_beside_agent_sock(fd_socket, "descriptor") from e


def _not_beside_agent_sock(path: str, what: str, opt_out: str = "") -> FileNotFoundError:
    """One of the agent's other sockets is not where the client looks, beside agent.sock: a pod that mounts
    agent.sock alone (a hostPath of the file, not of its folder) reaches the agent but not them."""
    why = ("the agent's %s socket is not beside agent.sock: mount the agent's whole socket folder (agent.sock, %s, "
           "%s), not agent.sock alone (an agent that is restarting makes it again in a moment)"
           % (what, FAST_SOCKET_NAME, FD_SOCKET_NAME))
    return FileNotFoundError(errno.ENOENT, why + (", or " + opt_out if opt_out else ""), path)


def get_fd(fd_socket: str, token: str, timeout: float = 5.0) -> int:
    """Presents a token and returns the descriptor the agent lends (the caller must close it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        with _descriptor_socket(fd_socket):
            s.connect(fd_socket)
            s.sendall(("GET %s\n" % token).encode())
            line, fds = _read_line(s, True)
    if line != "OK" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise FdSocketError(line[4:] if line.startswith("ERR ") else "expected one descriptor, got %d" % len(fds))
    return fds[0]


def _gpu_uuid(tensor) -> str:
    """The tensor's GPU UUID ("GPU-..."), only where this process sees a remapped set of GPUs
    (CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES), whose indices are not the node's."""
    remapped = any(os.environ.get(v, "all") not in ("", "all") for v in ("CUDA_VISIBLE_DEVICES",
                                                                          "NVIDIA_VISIBLE_DEVICES"))
    if not remapped:
        return ""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(tensor.device).uuid)
    except Exception:  # an older torch without uuid: the index is all there is
        return ""
    return uuid if uuid.startswith("GPU-") else "GPU-" + uuid


def _release_ipc_counter(counter):
    """Gives back PyTorch's IPC reference on a storage shared with _share_cuda_() (as a receiving process would
    on release), so that the memory is freed normally once the tensor goes. Best effort."""
    if counter is None:
        return
    try:
        import torch

        torch.UntypedStorage._release_ipc_counter_cuda(counter[0], counter[1])
    except Exception:
        pass


def shared_memory(name: str, size: int):
    """Creates size bytes of shared memory (memfd) and maps it; returns (fd, mmap). The memfd is sealed
    against shrinking (F_SEAL_SHRINK), which the agent requires of host memory it maps: a file truncated under
    its mapping would fault the agent. Its pages are allocated now, charged to this process (the agent refuses
    pages nobody has touched, which its copies would allocate on its own memory limit)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        return fd, mmap.mmap(fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                             mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise


def _first_untouched(fd: int, offset: int, length: int) -> int:
    """The offset of the first byte of [offset, offset+length) of memfd fd in a page nobody has touched (a hole;
    pages set aside by fallocate count), or offset+length when there is none. Seeks a descriptor of its own, so
    fd's file offset does not move. fd must be a memfd (see _is_memfd): reopening a FIFO would block."""
    end = offset + length
    if length <= 0:
        return end
    own = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        return min(os.lseek(own, offset, os.SEEK_HOLE), end)
    finally:
        os.close(own)


def _is_memfd(fd: int) -> bool:
    """Whether fd is shared memory sealed against shrinking, as the agent takes: a regular file whose seals say
    so (only memfds carry seals; a disk file, a FIFO or a /dev/shm file does not)."""
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except (OSError, AttributeError):
        return False


# How much _populate maps at a time, so that its deadline is looked at every few tens of milliseconds.
_POPULATE_CHUNK = 64 << 20


def _populate(fd: int, offset: int, length: int, deadline: float) -> None:
    """Loads from every page of [offset, offset+length) of memfd fd that nobody has touched, so that it is
    allocated now and charged to this process: the agent refuses such pages, which its copies would allocate on
    its own memory limit. Bytes already there do not change. Raises DeadlineExceeded where time.monotonic()
    passes deadline first. Otherwise best effort: what is left (a range past the end, a memory limit reached, a
    descriptor that is no memfd) the agent's refusal names."""
    if length <= 0 or not _is_memfd(fd):
        return
    try:
        size = os.fstat(fd).st_size
        if offset >= size:
            return
        try:
            start = _first_untouched(fd, offset, length)
        except OSError:
            start = offset  # cannot look (a mode that shuts this process out): touch the whole range
        if start >= offset + length:
            return
        end = min(offset + length, size)
        at = start - start % mmap.PAGESIZE
    except (OSError, ValueError, OverflowError, AttributeError):
        return
    while at < end:
        if time.monotonic() > deadline:
            raise DeadlineExceeded("registering host memory: touching its untouched pages ran past the client's "
                                   "timeout with %d of %d bytes left: make it with shared_memory() (which touches "
                                   "it) or give the client a longer timeout" % (end - at, end - start))
        n = min(end - at, _POPULATE_CHUNK)
        try:
            mmap.mmap(fd, n, mmap.MAP_SHARED | mmap.MAP_POPULATE, mmap.PROT_READ, offset=at).close()
        except (OSError, ValueError, OverflowError):
            return
        at += n


@dataclass(eq=False)
class Region:
    """Memory registered with the agent. recover() gives it a new id and descriptor in place; lost is True once
    it could not come back (pool memory, which went away with the agent)."""

    id: int
    length: int
    segment: str = ""
    descriptor: bytes = b""
    allocation_id: str = ""
    lost: bool = False
    # What keeps the memory alive while it is registered (the torch tensor of register_tensor).
    keep: object = field(default=None, repr=False)
    # Whether this process's own loads and stores reach the memory (a memfd, pool memory); False for GPU memory.
    host_memory: bool = True


@dataclass
class PoolSlice:
    """Pool memory the agent lent, mapped here. It keeps its client: the loan is the client's session's, and a
    client collected without close() would end it under the slice."""

    region: Region
    buffer: mmap.mmap
    _mapping_offset: int = 0
    _client: object = field(default=None, repr=False)

    @property
    def data(self) -> memoryview:
        """The slice's bytes (shared with the agent)."""
        return memoryview(self.buffer)[self._mapping_offset:self._mapping_offset + self.region.length]


class Remote:
    """The other side of an item; build with to_region, to_segment or to_descriptor."""

    def __init__(self, ref: Optional[pb.RemoteRef] = None, region: Optional[Region] = None):
        self._ref = ref
        # The caller's own region named by to_region: its id is read at each call, so it follows recover().
        self.region = region

    @property
    def ref(self) -> pb.RemoteRef:
        if self.region is not None:
            return pb.RemoteRef(region_id=self.region.id)
        return self._ref

    def __repr__(self):
        return "Remote(%s)" % str(self.ref).replace("\n", " ").strip()


def to_region(r: Region) -> Remote:
    """Another of this caller's regions on this node (its id after recover() included)."""
    if not isinstance(r, Region):
        raise TypeError("to_region takes a Region (from register_host, register_tensor or a pool slice's .region), "
                        "not %s" % type(r).__name__)
    return Remote(pb.RemoteRef(region_id=r.id), region=r)


def to_segment(node: str, segment: str) -> Remote:
    return Remote(pb.RemoteRef(node=node, segment=segment))


def to_descriptor(desc: bytes) -> Remote:
    """Memory named by a descriptor (Region.desc of its owner, or resolve_segment's), as its node issued it: the
    agent asks that node to confirm it the first time (an altered one is refused)."""
    return Remote(pb.RemoteRef(desc=desc))


class Layout:
    """Regions of equal length cut into blocks of block_bytes (block i is [i*block_bytes, (i+1)*block_bytes)
    of every region); pb is the agent's Layout. recover() gives it a new id in place."""

    def __init__(self, layout: pb.Layout, regions: Sequence[Region], grants: Sequence[str] = ()):
        self.pb = layout
        self.regions = list(regions)
        self.grants = list(grants)
        # Whether a transfer of its blocks reaches this process's host memory (see Client's mailbox).
        self._host = any(r.host_memory for r in self.regions)

    @property
    def id(self) -> int:
        return self.pb.id

    @property
    def block_bytes(self) -> int:
        return self.pb.block_bytes

    @property
    def blocks(self) -> int:
        return self.pb.blocks

    @property
    def segment(self) -> str:
        return self.pb.segment_name

    def __repr__(self):
        return "Layout(id=%d, block_bytes=%d, blocks=%d, regions=%d%s)" % (
            self.id, self.block_bytes, self.blocks, len(self.regions),
            ", segment=%r" % self.segment if self.segment else "")


class RemoteLayout:
    """The other side of a block transfer; build with to_layout or to_layout_segment."""

    def __init__(self, layout: Optional[Layout] = None, node: str = "", segment: str = ""):
        self._layout = layout
        self._node, self._segment = node, segment

    @property
    def ref(self) -> pb.LayoutRef:
        if self._layout is not None:  # follows the layout's id across recover()
            return pb.LayoutRef(layout_id=self._layout.id)
        return pb.LayoutRef(node=self._node, segment=self._segment)

    def _key(self):
        """What ref would say, as a cheap hashable value: the frame's head is kept under it."""
        if self._layout is not None:
            return self._layout.pb.id
        return (self._node, self._segment)

    def __repr__(self):
        return "RemoteLayout(%s)" % str(self.ref).replace("\n", " ").strip()


def _blocks_sides_error(layout, remote) -> str:
    """What transfer_blocks says when its layout or remote is something else."""
    if type(layout) is not Layout:
        return "transfer_blocks moves blocks of a Layout (from register_layout), not of %s" % type(layout).__name__
    if isinstance(remote, Layout):
        return "remote is a Layout: pass to_layout(layout) (or to_layout_segment(node, segment) for a published one)"
    return ("remote must be to_layout(layout) or to_layout_segment(node, segment), not %s%s" % (
        type(remote).__name__, " (to_segment and to_region name regions, for transfer)" if isinstance(remote, Remote)
        else ""))


def to_layout(layout: Layout) -> RemoteLayout:
    """Another of this caller's layouts on this node."""
    return RemoteLayout(layout=layout)


def to_layout_segment(node: str, segment: str) -> RemoteLayout:
    """A layout published under segment on node (this node when node is empty)."""
    return RemoteLayout(node=node, segment=segment)


@dataclass
class _Owned:
    """How recover() registers a region again: the request, and the client's own duplicate of its fd."""

    req: pb.RegisterMemoryRequest
    fd: int = -1
    # The duplicates of every VMM allocation's fd, in order, for a tensor spanning several (fd is then -1).
    fds: List[int] = field(default_factory=list)
    # PyTorch's IPC reference counter of the shared storage (released at deregister).
    ipc_counter: Optional[tuple] = None


@dataclass
class Item:
    local: Region
    remote: Remote
    length: int
    local_offset: int = 0
    remote_offset: int = 0
    tag: str = ""


class TransferFailed(Exception):
    """A transfer did not succeed; .status holds the per-tag failures. code() says how it ended as a gRPC status
    code, as AgentError's does for a transfer refused before it started: a timeout too short reads
    DEADLINE_EXCEEDED either way (it runs out before the transfer starts, or while it runs)."""

    def __init__(self, status: pb.TransferStatus):
        self.status = status
        tags = "; ".join("%s: %s %s" % (f.tag, f.code, f.message) for f in status.failures)
        super().__init__("transfer %d %s: %s [%s]" % (status.transfer_id, pb.TransferState.Name(status.state),
                                                       status.error, tags))

    def code(self) -> grpc.StatusCode:
        """DEADLINE_EXCEEDED or CANCELLED for a transfer that ended so, else its first failure's code (UNKNOWN
        without one)."""
        st = self.status
        if st.state == pb.TRANSFER_STATE_DEADLINE_EXCEEDED:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        if st.state == pb.TRANSFER_STATE_CANCELLED:
            return grpc.StatusCode.CANCELLED
        for f in st.failures:
            return _CODE_NAMES.get(f.code, grpc.StatusCode.UNKNOWN)
        return grpc.StatusCode.UNKNOWN

    def details(self) -> str:
        """The transfer's error summary."""
        return self.status.error


# A fast reply whose response starts with a status of state SUCCEEDED (agent.proto: FastReply 1a LEN, its
# TransferResponse's status 2a LEN', then the TransferStatus's state 10 02 before its other fields), told by six
# bytes at fixed places without decoding it. Any other encoding is decoded whole.
def _landed(raw) -> bool:
    """Whether raw is a fast reply that says its transfer succeeded: 1a LEN 2a LEN' 10 02, its two lengths one
    byte each (the agent writes a response's status first and the status's state first, agent.proto FastReply).
    A reply that starts otherwise (an error, a failure, an agent that wrote the transfer id first) is decoded."""
    return (len(raw) > 5 and raw[4] == 0x10 and raw[5] == 2 and raw[0] == 0x1A and raw[2] == 0x2A
            and raw[1] == len(raw) - 2 and raw[3] < 0x80)


class _LandedStatus:
    """The TransferStatus of a waited transfer that succeeded, decoded from its reply when first read. A waited
    block call is latency-bound and most callers only need it not to raise: decoding the status took a third of
    the client's own work around a one-block call. Reading and setting fields, calling the message's methods,
    comparing, printing and isinstance(st, TransferStatus) act on the decoded message; a protobuf call that takes
    a message as its argument (CopyFrom, a repeated field's append) needs that message itself:
    transfer_status(st). Protobuf's message classes cannot be subclassed, hence a stand-in."""

    # _msg stays unset until the status is read: the hot path (_short_blocks) stores _raw alone.
    __slots__ = ("_raw", "_msg")

    def __init__(self, raw: bytes):
        _SET_RAW(self, raw)

    def _decoded(self) -> pb.TransferStatus:
        try:
            return _GET_MSG(self)  # the slot's own read: an unset one raises here, not through __getattr__
        except AttributeError:
            raw = _GET_RAW(self)
            msg = pb.TransferStatus.FromString(raw[4:4 + raw[3]])
            _SET_MSG(self, msg)
            return msg

    def __getattr__(self, name):
        return getattr(self._decoded(), name)

    def __setattr__(self, name, value):
        setattr(self._decoded(), name, value)

    def __delattr__(self, name):
        delattr(self._decoded(), name)

    @property
    def __class__(self):
        return pb.TransferStatus

    def __eq__(self, other):
        return self._decoded() == transfer_status(other)

    __hash__ = None  # as the message's

    def __repr__(self):
        return repr(self._decoded())

    def __str__(self):
        return str(self._decoded())

    def __dir__(self):
        return dir(self._decoded())

    def __reduce__(self):
        return (pb.TransferStatus.FromString, (self._decoded().SerializeToString(),))


_SET_RAW, _SET_MSG = _LandedStatus._raw.__set__, _LandedStatus._msg.__set__
_GET_RAW, _GET_MSG = _LandedStatus._raw.__get__, _LandedStatus._msg.__get__
_NEW = object.__new__


def transfer_status(st) -> pb.TransferStatus:
    """The TransferStatus message a call returned: itself, or the message behind the stand-in a waited
    transfer_blocks returns (for protobuf calls that take a message, such as CopyFrom)."""
    return st._decoded() if type(st) is _LandedStatus else st


def _typed(packed: bytes, width: int):
    """Packed little-endian ids as an array of their width in this host's order, as transfer_blocks reads one."""
    ids = array.array("i" if width == 4 else "q")
    ids.frombytes(packed)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


class PreparedBlocks:
    """A block transfer packed by Client.prepare_blocks; run() moves its blocks. A short list of ids of one width
    on the fast socket runs from its frame, built at the first run and again after recover() gave a layout a new
    id; any other goes through transfer_blocks with the packed ids."""

    __slots__ = ("_client", "_op", "_layout", "_local", "_width", "_remote", "_rids", "_rwidth", "_timeout",
                 "_wait", "_frame", "_mailbox", "_lay", "_other", "_conn", "_bound")

    def __init__(self, client: "Client", op: int, layout: Layout, local: bytes, width: int, remote: RemoteLayout,
                 rids: bytes, rwidth: int, timeout: Optional[float], wait: bool):
        self._client, self._op, self._layout, self._local, self._width = client, op, layout, local, width
        self._remote, self._rids, self._rwidth, self._timeout, self._wait = remote, rids, rwidth, timeout, wait
        self._frame = None
        self._mailbox = True
        self._lay = self._other = self._conn = self._bound = None

    def _short(self) -> bool:
        """Whether the frame path applies, building the frame where it is missing, names a layout id that
        recover() replaced, or was built for another fast connection (whose mailbox may be checked)."""
        c, lay = self._client, self._layout.pb
        own = self._remote._layout
        other = own.pb if own is not None else None
        if (self._frame is not None and lay is self._lay and other is self._other and c._fast is self._conn
                and c.timeout == self._bound):
            return True
        count = len(self._local) // self._width
        if (self._width != self._rwidth or count >= _blocks.ARENA_MIN_IDS or c._fast is None):
            return False
        parts = _blocks.blocks_frame(self._op, lay.id, self._remote, memoryview(self._local),
                                     memoryview(self._rids), self._width, self._timeout, None, self._wait,
                                     c._answer_within(self._timeout))
        self._frame = (b"".join(parts),)
        self._mailbox = c._mailbox_for(self._layout, self._remote)
        self._lay, self._other, self._conn, self._bound = lay, other, c._fast, c.timeout  # the frame's call_timeout
        return True

    def run(self):
        """Moves the prepared blocks. Waited for, it returns None once every block landed and raises
        TransferFailed (with the status) for any other end: the hot path decodes no status it does not need.
        Not waited for, it returns the transfer id for wait()."""
        c = self._client
        if not self._short():
            answer = c.transfer_blocks(_OP_NAMES[self._op], self._layout, _typed(self._local, self._width),
                                       self._remote, _typed(self._rids, self._rwidth), timeout=self._timeout,
                                       wait=self._wait)
            return None if self._wait else answer  # a waited call that did not land raised
        c._check_session()
        try:
            if not self._wait:
                return c._fast_reply(c._fast_raw(self._frame, self._timeout, mailbox=self._mailbox)).transfer_id
            raw = c._fast_frame(self._frame[0], self._timeout, self._mailbox)
        except _FastBusy:
            answer = c._grpc_blocks(self._op, self._layout, self._remote, self._local, self._rids, self._width,
                                    self._timeout, None, self._wait)
            return None if self._wait else answer  # a waited call that did not land raised
        if not _landed(raw):
            c._waited_status(raw)  # raises for any end but success
        return None

    __call__ = run

    def __repr__(self):
        return "PreparedBlocks(%s, layout=%d, %d blocks, %r)" % (
            _OP_NAMES[self._op], self._layout.id, len(self._local) // self._width, self._remote)


class _Dropped:
    """Stands for a fast connection closed after a call's deadline passed (Client._fast_late): the next fast call
    opens a new one in its place (Client._fast_again)."""

    mailbox = None

    def close(self):
        pass


_DROPPED = _Dropped()


class Client:
    """A connection to one agent socket. Regions belong to the connection: close() (or the process ending)
    makes the agent deregister them."""

    # The fast connection's id arena (blocks.IdArena), when it has one.
    _arena = None
    # Set in a forked child: the client is its parent's.
    _forked = False
    # Fast connections dropped under a call, half-closed until the agent closes its end (settle()).
    _cuts = ()
    # The metadata naming the session this client's memory is in (see _session_metadata).
    _session_md = None
    # Set by close(): every later call raises ClientClosed; _ended, whether the agent said the session ended.
    _closed = False
    _ended = False
    # Sessions lost (and close() counted) against those recover() caught up with: see _check_session.
    _losses = _session = 0
    # Reopens of the fast connection the agent did not answer in time (_fast_again).
    _reopens_failed = 0

    @property
    def _socket_dir(self) -> str:
        """The folder of the agent's sockets: socket_path's, links resolved now (the agent's other sockets lie
        beside the socket itself, not beside a link to it elsewhere; gRPC follows a link retargeted since, and so
        does this)."""
        return os.path.dirname(os.path.realpath(self.socket_path))

    @property
    def fd_socket(self) -> str:
        """The agent's descriptor socket."""
        return os.path.join(self._socket_dir, FD_SOCKET_NAME)

    def __init__(self, socket_path: Optional[str] = None, timeout: float = 10.0, name: str = "python", fast: bool = True,
                 spin: float = FAST_SPIN, mailbox=True):
        """socket_path: default $FABRICXFER_SOCKET (a prepared fabricxfer.io claim sets it), else
        default_socket() (/run/fabricxfer/agent.sock where a pod mounts it, or the host's one pool socket).
        fast: send waited transfers over the agent's fast socket (one framed round trip, no HTTP/2). spin:
        seconds a waited fast call polls for its reply, keeping its thread's core busy, before it sleeps until the reply comes (0: sleep at once, for callers that would rather give the core
        away than save the wake-up). mailbox: let the fast connection's frames travel through shared memory the
        agent polls (no system call per round trip) where the agent offers it; on CPUs other than x86 (arm64)
        its frames are sealed and checked, since Python cannot order its accesses to shared memory there, and
        mailbox="checked" seals them on x86 too. False keeps every frame on the socket. A path with no socket
        raises AgentUnreachable at once; a socket no agent answers on, after timeout."""
        if _FORKS.grpc_running:
            raise RuntimeError("this process was forked from one whose fabricxfer Client had started gRPC, which "
                               "cannot start again here: start workers with multiprocessing's 'spawn' method, or "
                               "set GRPC_ENABLE_FORK_SUPPORT=1 in the parent before it creates a Client")
        _seconds(timeout, "the client's timeout", "")
        if not timeout:
            raise ValueError("the client's timeout must be positive seconds, not %r" % (timeout,))
        named = socket_path or os.environ.get("FABRICXFER_SOCKET")
        socket_path = named or default_socket()
        self.socket_path = socket_path
        if len(os.fsencode(socket_path)) > _SUN_PATH_MAX:
            raise AgentUnreachable(grpc.StatusCode.UNAVAILABLE, "no agent reachable at %s: the path is %d bytes, more "
                                   "than a Unix socket address holds (%d): give the agent's socket folder a shorter path (its "
                                   "--socket-dir, or a bind mount of it; a link is resolved back to the long path)"
                                   % (socket_path, len(os.fsencode(socket_path)), _SUN_PATH_MAX))
        _check_socket_permission(socket_path)
        if not _is_socket(socket_path):
            # Nothing there to wait for: say so now, as the Go client does, rather than after the whole timeout.
            raise AgentUnreachable(grpc.StatusCode.UNAVAILABLE, "no agent at %s: %s" % (
                socket_path, _why_no_socket(socket_path, () if named else _host_sockets())))
        sibling = _sibling_socket(socket_path)
        if sibling:
            raise AgentUnreachable(grpc.StatusCode.UNAVAILABLE, "no agent's gRPC socket at %s: %s" % (socket_path, sibling))
        self._reopens_failed = 0  # an instance attribute: read on every fast call
        self.timeout = timeout
        self.name = name
        self._want_fast = fast
        self._spin = max(0.0, spin)
        if mailbox not in (True, False, "checked"):
            raise ValueError("mailbox must be True, False or \"checked\", not %r" % (mailbox,))
        # None: no mailbox; else whether its frames are sealed. The layout's words are little-endian.
        self._mailbox_checked = None
        if mailbox and sys.byteorder == "little":
            self._mailbox_checked = mailbox == "checked" or platform.machine() not in _ORDERED_CPUS
        # Regions are tied to the connection, so an idle channel must not quietly drop it, nor share it: gRPC
        # otherwise gives channels of one target one connection, and the agent would see one session for every
        # Client of this process (closing one would free nobody's regions).
        self._channel = grpc.insecure_channel("unix:" + socket_path, options=[
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.client_idle_timeout_ms", 2 ** 31 - 1),
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ])
        self.stub = pb_grpc.AgentStub(self._channel)
        self._lock = threading.Lock()
        self._recover_lock = threading.Lock()
        # recover(): how many completed, and what a restarted agent lost that is not registered again yet.
        self._recoveries = 0
        self._unregistered = set()
        self._layouts_pending = []
        # The agent ties regions to the connection: every time a READY channel leaves READY, a session ended.
        self._state = None
        self._losses = 0
        self._session = 0
        # Regions registered from this process's memory: Region -> _Owned; pool slices -> None.
        self._owned = {}
        # Layouts this client registered, re-registered by recover().
        self._layouts = []
        # Through a weak reference: gRPC's watch holds its callback, and a bound method would keep a client dropped
        # without close() alive, with its session, regions and fast connection, for the life of the process.
        self._state_watch = _StateWatch(self)
        self._channel.subscribe(self._state_watch, try_to_connect=True)
        refused = None
        try:
            self.info = self.stub.GetInfo(pb.GetInfoRequest(api_versions=[API_VERSION], client_name=name),
                                          timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as e:
            self._channel.unsubscribe(self._state_watch)
            self._channel.close()
            if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                raise AgentUnreachable(e.code(), _unreachable(socket_path, timeout, e.details())) from e
            refused = _agent_error(e)  # an API version it does not speak, a caller it cannot identify
        if refused is not None:
            raise refused
        self._session_md = _session_metadata(self.info)
        self._session_box = [self._session_md]  # the session the collected-client finalizer ends
        self._fast = None
        self._fast_lock = threading.Lock()
        # Framings of short block transfers, by shape (_short_blocks); recover() empties it.
        self._frames = {}
        if fast:
            try:
                self._open_fast()
            except BaseException:  # no Client to close(): its channel would stay open, and subscribed
                self._channel.unsubscribe(self._state_watch)
                self._channel.close()
                raise
        # A client dropped without close() ends its session when it is collected, as close() would (not at the
        # interpreter's exit: the agent frees what a process that ended held). Set before a fork can see it.
        self._finalizer = weakref.finalize(self, _end_dropped_client, self.stub, self._channel, self._state_watch,
                                           self._owned, self._session_box)
        self._finalizer.atexit = False
        _FORKS.clients.add(self)

    def _on_state(self, state):
        with self._lock:
            if self._state == grpc.ChannelConnectivity.READY and state != grpc.ChannelConnectivity.READY:
                self._losses += 1
            self._state = state

    def _settle(self, timeout: float):
        """Waits until connectivity reports READY and has been quiet for a moment: the state callbacks run on
        gRPC's own thread, so a loss may be reported just after the call that reconnected."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            with self._lock:
                now = (self._state, self._losses)
            if now[0] == grpc.ChannelConnectivity.READY and now == last:
                break
            last = now
            time.sleep(0.05)
        with self._lock:
            self._session = self._losses

    def _check_session(self):
        # Two ints read without the lock (each read is atomic): a loss counted just after this check is the same
        # race as one counted just after a locked check, and the next check sees it. close() counts one too.
        if self._losses != self._session:
            if self._closed:
                raise ClientClosed()
            if self._forked:
                raise RuntimeError(_FORKED_CLIENT)
            raise SessionLost("agent session lost (agent restarted?): call recover() and retry")

    def _call(self, method, req, **kw):
        """One unary call that fails with SessionLost, not with another session's answer, after a reconnect."""
        self._check_session()
        answered = None
        try:
            resp = method(req, timeout=kw.pop("timeout", self.timeout), metadata=self._session_md, **kw)
        except (grpc.RpcError, ValueError) as e:
            if self._closed:  # closed under the call (gRPC: CANCELLED, or ValueError for a closed channel)
                raise ClientClosed() from e
            if not isinstance(e, grpc.RpcError):
                raise
            if self._session_lost(e.code(), e.details(), _answered(e)):
                raise SessionLost("agent session lost (%s): call recover() and retry" % e.details()) from e
            if isinstance(e, _StatusError):
                raise
            answered = _agent_error(e)
        if answered is not None:
            raise answered  # outside the except clause: nothing chains gRPC's error, and its frames, to it
        self._check_session()
        return resp

    def _session_lost(self, code, details, answered: bool = False) -> bool:
        """Whether an error means this client's session, and the regions with it, are gone: UNAVAILABLE on a
        connection that went down, or the agent's ABORTED "session lost" (a call that reached another session than
        the one it names). UNAVAILABLE is also the agent's own answer (a peer it cannot reach): answered says the
        agent marked it so, or it came over the live fast socket, and then only a loss already counted is one;
        otherwise the connection's state is watched for a moment."""
        if code == grpc.StatusCode.ABORTED:
            return (details or "").startswith("session lost:")
        if code != grpc.StatusCode.UNAVAILABLE:
            return False
        if answered:
            # The agent answered on this session, so the connection was up: the channel's state, which gRPC
            # reports on its own thread and may not show READY yet for a new client, is not asked.
            with self._lock:
                return self._losses != self._session
        return self._connection_dropped()

    def _connection_dropped(self, within: float = 0.25) -> bool:
        """Whether the connection to the agent left READY (now, or within a moment: gRPC reports connectivity
        on its own thread, a little after a failed call returns)."""
        deadline = time.monotonic() + within
        while True:
            with self._lock:
                if self._losses != self._session or self._state != grpc.ChannelConnectivity.READY:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def recover(self, timeout: Optional[float] = None):
        """Waits (up to timeout, default the client's) for the agent to answer again and, when it is another agent
        instance than the one the regions were registered with (it restarted), registers every region this client
        registered from its own memory anew, then its layouts; their ids and descriptors change in place. Pool
        slices are marked lost. Raises the first error after trying every region; calling it again registers what
        is still missing. Threads that share the client may all call it: one recovers, the others wait for it
        and return (AgentUnreachable when no agent answers)."""
        if self._closed:
            raise ClientClosed()
        if self._forked:
            raise RuntimeError(_FORKED_CLIENT)
        timeout = _seconds(timeout) or self.timeout
        recovered = self._recoveries
        with self._recover_lock:
            if (self._recoveries != recovered and not self._unregistered and not self._layouts_pending
                    and self._losses == self._session and (self._fast is not None or not self._want_fast)):
                return  # another thread recovered while this one waited for it
            self._recover(timeout)

    def _recover(self, timeout: float):
        try:
            self._recover_session(timeout)
        except BaseException:
            # Wherever it failed (an agent still stopped fails GetInfo), the fast connection stays wanted: the
            # client must not go on through gRPC unseen.
            if self._want_fast:
                with self._fast_lock:
                    if self._fast is None:
                        self._fast = _DROPPED
            raise

    def _recover_session(self, timeout: float):
        # An agent still stopping or just starting can drop the first connection: keep asking until timeout.
        deadline = time.monotonic() + timeout
        while True:
            refused = None
            try:
                info = self.stub.GetInfo(pb.GetInfoRequest(api_versions=[API_VERSION], client_name=self.name),
                                         timeout=max(deadline - time.monotonic(), 0.001), wait_for_ready=True)
                break
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    refused = _agent_error(e)
                elif time.monotonic() >= deadline:
                    raise AgentUnreachable(e.code(), _unreachable(self.socket_path, timeout, e.details())) from e
            if refused is not None:
                raise refused
            time.sleep(0.05)
        session = self._session
        self._settle(min(timeout, 2.0))
        # Regions and layouts belong to a session (a connection) of one instance of the agent: another session or
        # instance holds none of them. The agent names both, however gRPC's connectivity callbacks were timed; one
        # too old to name them is judged by the connection dropping.
        if info.instance and self.info.instance:
            restarted = (info.instance, info.session) != (self.info.instance, self.info.session)
        else:
            restarted = self._session != session
        self.info = info
        self._session_md = self._session_box[0] = _session_metadata(info)  # what is registered below goes into this session
        # The session lives on (a recover() with nothing lost, or one that came after another thread's): a fast
        # connection that works stays, as the calls other threads make on it do (closing it failed them with
        # SessionLost while nothing was lost).
        if restarted or self._fast is _DROPPED or (self._fast is None and self._want_fast):
            with self._fast_lock:
                if self._fast is not None:
                    self._fast.close()
                    self._fast = None
            self._frames.clear()  # the layouts' agent records may be replaced below
        if restarted:
            with self._lock:
                for region, how in list(self._owned.items()):
                    if how is None:  # pool memory went with the agent
                        region.lost = True
                        self._owned.pop(region)
                self._unregistered = set(self._owned)
                self._layouts_pending = list(self._layouts)
        if self._want_fast and self._fast is None:
            # After the bookkeeping above, so a recover() that fails here leaves the next one what to register.
            self._open_fast()
        first = self._register_again()
        if first is not None:
            raise first
        self._recoveries += 1

    def _register_again(self):
        """Registers the regions and then the layouts a restarted agent lost (what an earlier try left over too)
        and returns the first error, having tried them all."""
        first = None
        with self._lock:
            pending = [(r, self._owned[r]) for r in self._unregistered if r in self._owned]
            self._unregistered &= set(self._owned)  # deregistered since: nothing to bring back
        for region, how in pending:
            try:
                fresh = self._register(how.req, how.fds if how.fds else how.fd)
            except Exception as e:  # keep going: one bad region must not strand the others
                first = first or e
                continue
            region.id, region.descriptor = fresh.id, fresh.descriptor
            with self._lock:
                self._unregistered.discard(region)
        for lay in list(self._layouts_pending):
            # A layout deregistered since, or over pool memory (lost with the agent) or a region deregistered
            # since, cannot come back.
            if lay not in self._layouts or any(r.lost or r not in self._owned for r in lay.regions):
                with self._lock:
                    if lay in self._layouts:
                        self._layouts.remove(lay)
                self._layouts_pending.remove(lay)
                continue
            if any(r in self._unregistered for r in lay.regions):
                continue  # its regions are not back yet: the next recover() tries again
            try:
                lay.pb = self._call(self.stub.RegisterLayout, pb.RegisterLayoutRequest(
                    region_ids=[r.id for r in lay.regions], block_bytes=lay.block_bytes,
                    segment_name=lay.segment, segment_grants=lay.grants)).layout
            except Exception as e:
                first = first or e
                continue
            self._layouts_pending.remove(lay)
        return first

    def _open_fast(self, within: Optional[float] = None):
        """Opens and sets up a fast connection within the client's timeout, or within seconds when a call opens
        it on its way (its own wait bounds everything done for it)."""
        deadline = time.monotonic() + (self.timeout if within is None else min(self.timeout, within))

        def left():
            return max(deadline - time.monotonic(), 0.001)
        refused = None
        try:
            token = self.stub.OpenFastPath(pb.OpenFastPathRequest(), timeout=left(),
                                           metadata=self._session_md).token
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                # An agent without the fast path (older than it): calls go through gRPC, as the Go client's do,
                # and nothing is opened again later.
                self._want_fast = False
                return
            refused = _agent_error(e)
        if refused is not None:
            raise refused
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(left())
        try:
            path = os.path.join(self._socket_dir, FAST_SOCKET_NAME)
            try:
                s.connect(path)
            except FileNotFoundError as e:
                raise _not_beside_agent_sock(path, "fast", "pass Client(fast=False) to go through gRPC alone "
                                                           "(slower)") from e
            conn = _fastconn.FastConn(s, self._spin)
            reply = self._setup_frame(conn, token.encode(), left())
        except BaseException:  # an interrupt too: the socket is closed, not left to the traceback
            s.close()
            raise
        if reply.code:
            s.close()
            raise AgentError(reply.code, reply.message)
        arena = None
        try:
            arena = self._open_arena(conn, left)
            if self._mailbox_checked is not None:
                self._open_mailbox(conn, self._mailbox_checked, left)
        except BaseException:
            conn.close()
            if arena is not None:
                arena.close()
            raise
        if self._arena is not None:
            self._arena.close()
        self._fast, self._arena = conn, arena

    def _setup_frame(self, conn, payload: bytes, within: float) -> pb.FastReply:
        """One frame that sets a new fast connection up (its token, its arena) and the agent's reply, within
        seconds."""
        return pb.FastReply.FromString(conn.call([_HDR.pack(len(payload)), payload], time.perf_counter() + within))

    def _open_arena(self, conn, left) -> Optional["_blocks.IdArena"]:
        """Gives the fast connection an id arena when numpy is at hand and the agent takes one (an agent that
        does not answers with an error, and long id lists then travel in the frame)."""
        try:
            import numpy as np
        except ImportError:
            return None
        buf = self._pass_memory(conn, "fabricxfer-ids", ID_ARENA_BYTES,
                                lambda token: pb.FastRequest(id_arena=pb.IdArena(fd_token=token, size=ID_ARENA_BYTES)),
                                left)
        return None if buf is None else _blocks.IdArena(buf, np)

    def _open_mailbox(self, conn, checked: bool, left):
        """Gives the fast connection a mailbox where the agent takes one (an older agent answers with an error, and
        every frame then travels on the socket). A checked mailbox is used only when the agent says it seals and
        checks frames: one that ignored the request would neither."""
        size = _fastconn.MAILBOX_BYTES
        buf = self._pass_memory(conn, "fabricxfer-mailbox", size, lambda token: pb.FastRequest(
            mailbox=pb.Mailbox(fd_token=token, size=size, checked=checked)), left)
        if buf is None:
            return
        if checked and not _U32.unpack_from(buf, _fastconn.CHECKED_WORD)[0]:
            buf.close()
            return
        conn.attach_mailbox(buf, checked)

    def _pass_memory(self, conn, name: str, size: int, request, left):
        """Creates size bytes of shared memory, passes them to the agent through the fd socket and sets them up
        with request(token) on the new fast connection; returns the mapping, or None where the agent refused or
        the passing failed (the connection then works without it). Raises where the agent did not answer in time
        (DeadlineExceeded, a TimeoutError), and where the setup frame got no reply: the connection is out of
        step."""
        fd, buf = shared_memory(name, size)
        try:
            token = put_fd(self.fd_socket, fd, left())
        except TimeoutError:
            # An agent that did not answer in time (a reopen late in its call's wait, say) fails the open, as a
            # setup frame without a reply does: the connection would otherwise go on without its mailbox or
            # arena, slower for good and unseen.
            buf.close()
            raise
        except (OSError, FdSocketError, ConnectionError):
            buf.close()
            return None
        finally:
            os.close(fd)
        try:
            reply = self._setup_frame(conn, request(token).SerializeToString(), left())
        except BaseException:
            # No reply in time (an agent stopped meanwhile) or a broken socket: the late reply would be read as
            # the next call's, so the connection is out of step, and the open fails (it was used regardless).
            buf.close()
            raise
        if reply.code:
            buf.close()
            return None
        return buf

    def close(self) -> bool:
        """Ends the client's session, whose regions, layouts and pool slices the agent frees before it answers
        (waited for up to 2 s; an older agent frees them once the connection is gone), and closes the connection;
        later calls raise ClientClosed, and closing again does nothing. Returns whether the agent said the session
        ended: False when it did not within the 2 s (a transfer in flight on its memory; the names free themselves
        once it settles), or could not say (an agent older than EndSession, one that stopped, a forked child's
        copy), so a caller about to register the same names elsewhere knows they may still be taken."""
        if self._closed:
            return self._ended
        with self._lock:
            if self._closed:
                return self._ended  # another thread closes it (False until it is done)
            live = self._losses == self._session and not self._forked
            self._closed = True
            self._finalizer.detach()
            self._losses += 1  # every call's session check then looks, and raises ClientClosed
        # A call on the fast connection holds its lock until its reply: its socket is shut down first, so a call
        # the agent does not answer ends now (its wait on the socket sees the end) rather than at its deadline;
        # its mailbox and arena stay mapped until it gave the lock back.
        fast = self._fast
        # Not in a forked child: the socket is its parent's too, and a shutdown would end the parent's connection.
        if isinstance(fast, _fastconn.FastConn) and not self._forked:
            try:
                fast.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already
        held = False
        try:
            held = self._fast_lock.acquire(timeout=self.timeout + 1.0)
            if self._fast is not None:
                self._fast.close()
                self._fast = None
            if self._arena is not None:
                self._arena.close()
                self._arena = None
        finally:
            if held:
                self._fast_lock.release()
        with self._lock:
            cuts, self._cuts = self._cuts, ()
        for sock in cuts:
            sock.close()
        ended = False
        if live:
            # The agent frees the session's regions and names before it answers (once the connection is gone it
            # does so in the background, and a process registering the names again at once could find them
            # taken), and before this process lets go of the memory below.
            try:
                self.stub.EndSession(pb.EndSessionRequest(), timeout=_CLOSE_WAIT, metadata=self._session_md)
                ended = self._ended = True
            except grpc.RpcError:
                pass  # an agent older than EndSession, or one that did not answer: it frees them later
        with self._lock:
            owned, self._owned = self._owned, {}
            self._layouts = []
        for how in owned.values():
            if how is not None:
                self._drop(how, release=not self._forked)
        if self._forked:
            # The gRPC connection is the parent's: closing it here could end the parent's session. (The fast
            # socket, the mappings and the fds closed above are this process's copies: closing them sends nothing.)
            return False
        self._channel.unsubscribe(self._state_watch)
        if ended:
            # gRPC's close waits for its connectivity watch to end (up to 200 ms); the session is gone already.
            threading.Thread(target=self._channel.close, name="fabricxfer-close", daemon=True).start()
        else:
            self._channel.close()
        return ended

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def register_host(self, fd: int, offset: int, length: int, segment: str = "",
                      grants: Sequence[str] = ()) -> Region:
        """Registers [offset, offset+length) of shared memory fd (a memfd, read-write; a sealable one is sealed
        against shrinking, which the agent requires; pages of the range nobody has touched are read here, so that
        they count against this process's memory, not the agent's, which refuses them). The client keeps
        a duplicate of fd until deregister() or close(), so recover() can register it again. segment publishes
        it in this pod's namespace; grants lists other namespaces (names, such as "team-b"; "*": every namespace
        the pool admits) whose pods may then reach it as "<this namespace>/<segment>". Without Kubernetes
        (agent standalone) there are no namespaces and grants change nothing."""
        try:
            offset, length = operator.index(offset), operator.index(length)  # numpy's integers too
        except TypeError:
            raise TypeError("offset and length are integers, not %r and %r" % (offset, length)) from None
        if not (0 <= offset < 1 << 64 and 0 <= length < 1 << 64):
            # protobuf's refusal says only "Value out of range: -1"
            raise ValueError("offset and length are byte counts from 0 to 2^64-1, not %r and %r" % (offset, length))
        req = pb.RegisterMemoryRequest(kind=pb.MEMORY_KIND_HOST, handle_type=pb.HANDLE_TYPE_SHM_FD, offset=offset,
                                       length=length, segment_name=segment, segment_grants=list(grants))
        if type(fd) is not int or fd < 0:
            raise TypeError("fd is the memory's open descriptor (an int, os.memfd_create's), not %r" % (fd,))
        try:  # the agent maps only memory sealed against shrinking; a sealable memfd is sealed here
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        except AttributeError:
            pass  # no sealing here: the agent's answer says what to do
        except OSError as e:
            if e.errno == errno.EBADF:
                # Said here: the number of a closed descriptor may name another by the time it is passed on
                # (the client's own socket to the agent, which would be refused as one).
                raise ValueError("descriptor %d is not open: pass the memory's open descriptor (close it after "
                                 "registering, if at all)" % fd) from None
            # not sealable (or already sealed): the agent's answer says what to do
        _populate(fd, offset, length, time.monotonic() + self.timeout)
        region = self._register(req, fd)
        keep = os.dup(fd)
        with self._lock:
            self._owned[region] = _Owned(req=req, fd=keep)
        return region

    def _register(self, req: pb.RegisterMemoryRequest, fd=-1) -> Region:
        """RegisterMemory with req, handing fd to the fd socket first when there is one; a list of fds (the VMM
        allocations of a tensor spanning several) goes as fd_tokens."""
        self._check_session()
        if isinstance(fd, list):
            req = pb.RegisterMemoryRequest.FromString(req.SerializeToString())
            del req.fd_tokens[:]
            req.fd_tokens.extend(put_fds(self.fd_socket, fd, self.timeout))
        elif fd >= 0:
            req = pb.RegisterMemoryRequest.FromString(req.SerializeToString())
            req.fd_token = put_fd(self.fd_socket, fd, self.timeout)
        resp = self._call(self.stub.RegisterMemory, req)
        return self._region(resp.region)

    def register_tensor(self, tensor, segment: str = "", gpu_index: Optional[int] = None,
                        grants: Sequence[str] = ()) -> Region:
        """Registers the bytes of a contiguous torch CUDA tensor (its own bytes, not the allocator's whole
        segment). Memory from PyTorch's caching allocator goes as the segment's cudaIpcMemHandle_t and the
        tensor's offset in it; memory of an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)
        goes as the VMM allocation that holds it (a POSIX fd, or a fabric handle where PyTorch exported those).
        gpu_index, when given, must be the tensor's device. The region keeps a reference to the tensor until
        deregister(): do not resize it or empty PyTorch's cache of its memory meanwhile. Kernels writing the
        tensor must have finished (torch.cuda.synchronize or a stream sync) before a transfer reads it."""
        self._check_session()  # before PyTorch's IPC reference is taken
        device, start, length = _cuda.tensor_range(tensor)
        if gpu_index is not None and gpu_index != device:
            raise ValueError("the tensor is on cuda:%d, not GPU %d as given: move it with .to('cuda:%d') or pass "
                             "gpu_index=%d" % (device, gpu_index, gpu_index, device))
        share_tuple = tensor.untyped_storage()._share_cuda_()
        counter = None
        if isinstance(share_tuple, tuple) and len(share_tuple) >= 6 and isinstance(share_tuple[4], (bytes, bytearray)):
            counter = (share_tuple[4], share_tuple[5])
        fds = []
        try:
            req, fds = self._tensor_request(share_tuple, device, start, length, segment, tensor)
            req.segment_grants.extend(grants)
            region = self._register(req, fds if len(fds) > 1 else (fds[0] if fds else -1))
        except BaseException:
            for fd in fds:
                os.close(fd)
            _release_ipc_counter(counter)  # sharing took a reference on the storage; nothing holds it now
            raise
        region.keep = tensor
        region.host_memory = False
        how = _Owned(req=req, ipc_counter=counter)
        if len(fds) > 1:
            how.fds = fds
        elif fds:
            how.fd = fds[0]
        with self._lock:
            self._owned[region] = how
        return region

    @staticmethod
    def _tensor_request(share_tuple, device: int, start: int, length: int, segment: str, tensor):
        """The RegisterMemoryRequest for bytes [start, start+length) of a storage shared as share_tuple, and the
        fds to pass with it: none, one, or for a tensor spanning several VMM allocations of an expandable segment
        one per allocation in address order (req.offset then counts from the first). The caller owns them."""
        share = _cuda.parse_cuda_share(share_tuple, own_pid=os.getpid())
        if share.device != device:
            raise ValueError("PyTorch shares the storage from cuda:%d but the tensor is on cuda:%d" % (share.device,
                                                                                                      device))
        if start + length > share.storage_bytes:
            raise ValueError("the tensor's bytes [%d, +%d) lie outside its storage of %d bytes" % (
                start, length, share.storage_bytes))
        req = pb.RegisterMemoryRequest(kind=pb.MEMORY_KIND_GPU, length=length, gpu_index=device,
                                       segment_name=segment, gpu_uuid=_gpu_uuid(tensor))
        if share.kind == _cuda.KIND_IPC:
            req.handle_type = pb.HANDLE_TYPE_IPC
            req.ipc_handle = share.ipc_handle
            req.offset = share.offset + start
            return req, []
        if share.kind == _cuda.KIND_FABRIC:
            index, offset = share.locate(share.offset + start, length)
            req.offset, req.allocation_size = offset, share.segment_size
            req.handle_type = pb.HANDLE_TYPE_FABRIC
            req.fabric_handle = share.handles[index]
            return req, []
        first, count, offset = share.span(share.offset + start, length)
        req.offset, req.allocation_size = offset, share.segment_size
        req.handle_type = pb.HANDLE_TYPE_VMM_POSIX_FD
        fds = []
        try:
            for h in share.handles[first:first + count]:
                fds.append(_cuda.dup_own_fd(share.pid, h))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return req, fds

    @staticmethod
    def _region(r) -> Region:
        return Region(id=r.id, length=r.length, segment=r.segment_name, descriptor=r.desc)

    def deregister(self, region: Region):
        self._call(self.stub.DeregisterMemory, pb.DeregisterMemoryRequest(region_id=region.id))
        self._forget(region)

    def _forget(self, region: Region):
        with self._lock:
            how = self._owned.pop(region, None)
        region.keep = None
        if how is not None:
            self._drop(how)

    @staticmethod
    def _drop(how: _Owned, release: bool = True):
        """Closes the client's duplicates of a region's fds and, with release, gives PyTorch's IPC reference
        back (not in a forked child: the registration is its parent's)."""
        if how.fd >= 0:
            os.close(how.fd)
            how.fd = -1
        for fd in how.fds:
            os.close(fd)
        how.fds = []
        if release:
            _release_ipc_counter(how.ipc_counter)
        how.ipc_counter = None

    def allocate_from_pool(self, length: int, segment: str = "", grants: Sequence[str] = ()) -> PoolSlice:
        """Borrows pool memory; the returned buffer is shared with the agent. segment and grants publish it as
        register_host's do."""
        resp = self._call(self.stub.AllocateFromPool, pb.AllocateFromPoolRequest(length=length, segment_name=segment,
                                                                                 segment_grants=list(grants)))
        fd = get_fd(self.fd_socket, resp.fd_token, self.timeout)
        try:
            page = mmap.PAGESIZE
            base = resp.offset // page * page
            buf = mmap.mmap(fd, resp.length + (resp.offset - base), mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE, offset=base)
        finally:
            os.close(fd)
        region = self._region(resp.region)
        region.allocation_id = resp.allocation_id
        with self._lock:
            self._owned[region] = None
        return PoolSlice(region=region, buffer=buf, _mapping_offset=resp.offset - base, _client=self)

    def release(self, s: PoolSlice):
        try:
            if not s.region.lost:
                self._call(self.stub.Release, pb.ReleaseRequest(allocation_id=s.region.allocation_id))
        finally:
            with self._lock:
                self._owned.pop(s.region, None)
            s.buffer.close()

    def _request(self, op, items: List[Item], timeout: Optional[float], notify: Optional[bytes], wait: bool):
        req = pb.TransferRequest(op=op, wait=wait, notify=notify or b"")
        if timeout:
            req.timeout.FromNanoseconds(_blocks.nanos(timeout))
        for i, it in enumerate(items):
            if type(it.remote) is not Remote or not isinstance(it.local, Region):
                raise TypeError("an Item's local side is a Region and its remote side to_region(region), "
                                "to_segment(node, name) or to_descriptor(desc), not %s and %s (block layouts "
                                "move with transfer_blocks)" % (type(it.local).__name__, type(it.remote).__name__))
            try:
                req.items.add(local_region_id=it.local.id, local_offset=it.local_offset, remote=it.remote.ref,
                              remote_offset=it.remote_offset, length=it.length, tag=it.tag)
            except (ValueError, TypeError) as e:  # protobuf's says only "Value out of range: -1"
                raise type(e)("item %d: offsets and length are byte counts from 0 to 2^64-1 (local_offset %r, "
                              "remote_offset %r, length %r): %s" % (i, it.local_offset, it.remote_offset, it.length,
                                                                     e)) from None
        return req

    def transfer(self, op: str, items: List[Item], timeout: Optional[float] = None, notify: Optional[bytes] = None,
                 wait: bool = True):
        """op is "read" or "write". With wait (default) returns the settled status or raises TransferFailed;
        without it returns the transfer id for wait(). timeout: seconds the transfer may take (a waited one
        defaults to the client's timeout, an unwaited one to the agent's, AGENT_DEFAULT_TIMEOUT; the agent fails it
        with DEADLINE_EXCEEDED when it runs out). The call itself (resolving a peer's segment, waiting) has that
        timeout, or the client's, and half a second more: the agent answers by then, and the call waits for its
        answer a second past it; DeadlineExceeded when none came."""
        if not _seconds(timeout) and wait:
            timeout = self.timeout  # the agent ends it, and answers, before this call gives up
        if len(items) > 4096 and len(items) > (self.info.limits.max_items_per_transfer or len(items)):
            raise ValueError("%d items: the agent moves at most %d items a call (info.limits.max_items_per_transfer); "
                             "split the transfer" % (len(items), self.info.limits.max_items_per_transfer))
        if notify is not None:
            notify = self._check_notify(notify)
        req = self._request(_op(op), items, timeout, notify, wait)
        self._check_session()
        if self._fast is not None:
            payload = (pb.FastRequest(transfer=req).SerializeToString()
                       + _blocks.call_timeout_field(self._answer_within(timeout)))
            _request_fits(len(payload), len(items))
            try:
                resp = self._fast_call([_HDR.pack(len(payload)), payload], timeout, mailbox=not self._mailbox_checked)
                return self._settled(resp, wait)
            except _FastBusy:
                pass
        _request_fits(req.ByteSize(), len(items))
        resp = self._call(self.stub.Transfer, req, timeout=self._call_timeout(timeout))
        return self._settled(resp, wait)

    def _check_notify(self, notify) -> bytes:
        """notify as bytes; refuses a notify payload the agent would not deliver: an empty one travels as none (the listener would
        wait for a notification that never comes), and one past the agent's limit was refused by the agent, or,
        on the fast socket past its frame, broke the connection and read as SessionLost."""
        try:
            n = memoryview(notify).nbytes  # bytes, not items: an array of wider items or more dimensions too
        except TypeError:
            raise TypeError("notify is bytes (the listener's payload), not %s" % type(notify).__name__) from None
        most = self.info.limits.max_notify_bytes or DEFAULT_MAX_NOTIFY_BYTES
        if n == 0:
            raise ValueError("notify=b'' sends no notification: give it at least one byte (the block ids, say), "
                             "or None for none")
        if n > most:
            raise ValueError("notify is %d bytes: the agent delivers at most %d (info.limits.max_notify_bytes)"
                             % (n, most))
        return notify if type(notify) is bytes else memoryview(notify).tobytes()

    def _call_bound(self, timeout: Optional[float]) -> float:
        """What bounds the call of a transfer (or wait) of timeout seconds on the agent: that timeout, else (an
        unwaited transfer naming none) the client's, which the agent ends the call's work by (FastRequest.
        call_timeout); an agent older than that holds such a call up to its default transfer timeout, 60 s (a
        stalled peer being asked), and the call waits that long for its answer."""
        if timeout:
            return timeout
        if _FEATURE_CALL_TIMEOUT in self.info.features:
            return self.timeout
        return max(self.timeout, AGENT_DEFAULT_TIMEOUT)

    def _call_timeout(self, timeout: Optional[float]) -> float:
        """A gRPC call's deadline for a transfer of timeout seconds: the agent's answer must have time to come."""
        return max(self.timeout, self._call_bound(timeout) + 1.0)

    def _answer_within(self, timeout: Optional[float]) -> float:
        """FastRequest.call_timeout of a fast call for a transfer (or wait) of timeout seconds: the agent ends what
        it does for the call by then and answers. Half a second past the call's bound, so a transfer's own
        timeout fires first and is what the caller hears; a stalled peer held an unwaited call, and the agent's
        work for it, until the agent's default (60 s) after the caller gave up."""
        return self._call_bound(timeout) + 0.5

    def _reply_wait(self, timeout: Optional[float]) -> float:
        """How long a fast call waits for its reply: half a second past _answer_within, for the reply to travel."""
        return self._call_bound(timeout) + 1.0

    def _fast_call(self, parts, timeout: Optional[float] = None, build=None,
                   mailbox: bool = True) -> Optional[pb.TransferResponse]:
        """One frame (a list of bytes-like parts) on the fast socket and its reply's response, within timeout (the
        transfer's, else the client's) plus a second for the reply to travel. With build, the parts are
        build(conn), made under the fast lock (the id arena is written there); build returns None when the frame
        cannot be made, and so does this. mailbox=False keeps the frame on the socket (see _mailbox_for)."""
        raw = self._fast_raw(parts, timeout, build, mailbox)
        return None if raw is None else self._fast_reply(raw)

    def _fast_raw(self, parts, timeout: Optional[float], build=None, mailbox: bool = True):
        """_fast_call's round trip: the reply's bytes, undecoded."""
        wait = self._reply_wait(timeout)
        deadline = time.perf_counter() + wait
        failed = self._reopens_failed
        lock = self._fast_lock
        if lock.locked() and not _freed_soon(lock):
            raise _FastBusy
        with lock:
            conn = self._fast
            if conn is None or conn is _DROPPED:
                conn = self._fast_again(conn, failed, max(deadline - time.perf_counter(), 0.001))
            if build is not None:
                # A frame built here takes a while (ids written into the arena): an agent that stopped polling
                # (the caller was busy elsewhere for milliseconds) is rung now, and wakes meanwhile.
                if mailbox:
                    try:
                        conn.wake(deadline)
                    except (OSError, ConnectionError) as e:
                        if not _broke(e):
                            self._fast_drop(conn)  # a signal handler's error: the caller's own
                            raise
                        # a broken socket: the call below meets it too, and says so
                parts = build(conn)
                if parts is None:
                    return None
            try:
                raw = conn.call(parts, deadline, mailbox)
            except _fastconn.FastConnTimeout as e:
                raise self._fast_late(conn, wait) from e
            except (OSError, ConnectionError) as e:
                if not _broke(e):
                    self._fast_drop(conn)  # an OSError a signal handler raised (TimeoutError): the caller's own
                    raise
                raise self._fast_lost(conn, e) from e
            except BaseException:
                self._fast_drop(conn)  # interrupted (KeyboardInterrupt): the reply would be read as the next call's
                raise
        return raw

    def _fast_frame(self, frame: bytes, timeout: Optional[float], mailbox: bool):
        """_fast_raw of one built frame, the latency-bound path of a waited block call: straight to the mailbox
        (FastConn.call_frame), its deadline taken from the clock only if the call lasts."""
        failed = self._reopens_failed
        wait = (timeout or self.timeout) + 1.0
        lock = self._fast_lock
        if lock.locked() and not _freed_soon(lock):
            raise _FastBusy
        with lock:
            conn = self._fast
            if conn is None or conn is _DROPPED:
                start = time.perf_counter()
                conn = self._fast_again(conn, failed, wait)
                wait = max(wait - (time.perf_counter() - start), 0.001)  # the call's wait bounds both
            try:
                return conn.call_frame(frame, wait, mailbox)
            except _fastconn.FastConnTimeout as e:
                raise self._fast_late(conn, wait) from e
            except (OSError, ConnectionError) as e:
                if not _broke(e):
                    self._fast_drop(conn)  # an OSError a signal handler raised (TimeoutError): the caller's own
                    raise
                raise self._fast_lost(conn, e) from e
            except BaseException:
                self._fast_drop(conn)  # interrupted (KeyboardInterrupt): the reply would be read as the next call's
                raise

    def _fast_lost(self, conn, e: Exception) -> "SessionLost":
        """Drops a fast connection that broke under a call (held under the fast lock) as _fast_drop does (settle()
        still waits for the agent's end, in case it is there) and says so. It is dropped, not forgotten: the next
        fast call opens a new one if the session lives, and says SessionLost if not."""
        self._fast_drop(conn)
        if self._closed:
            return ClientClosed()  # close() ended the call
        return SessionLost("the fast connection broke (%s): call recover() and retry" % e)

    def _fast_late(self, conn, waited: float) -> DeadlineExceeded:
        """Drops a fast connection whose call's deadline passed (_fast_drop) and says so."""
        self._fast_drop(conn)
        return DeadlineExceeded("the agent did not answer within %.1f s: the call may still take effect (a transfer "
                                "may still land, under an id not known here)" % waited)

    def _fast_drop(self, conn):
        """Closes a fast connection whose call ended before its reply was read (its deadline passed, or it was
        interrupted), held under the fast lock: the agent may still be serving the frame, and replies are matched
        to calls by their order alone, so its late reply would be read as the next call's (a waited transfer
        reported as landed with another's status). The next fast call opens a new connection in the same session.
        The id arena goes too: the agent may still read the ids of the call it serves."""
        if self._forked:
            sock = None
            conn.close()
        else:
            sock = conn.cut()
        self._fast = _DROPPED
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if sock is not None:
            with self._lock:
                # Kept until the agent closes its end (settle()); those it closed already go now, and all of them
                # once close() ended the call (nobody settles then).
                if not self._closed:
                    self._cuts, sock = [c for c in self._cuts if not _close_if_ended(c)] + [sock], None
            if sock is not None:
                sock.close()

    def _fast_again(self, conn, failed: int, within: float):
        """The connection for a fast call where the client holds none (SessionLost, raised) or dropped one (a new
        one, opened now under the fast lock). One that cannot be opened stays dropped, so the next fast call tries
        again: a client that wants the fast socket never goes on through gRPC unseen (50 times slower for a
        one-block call). An agent that did not answer in time raises DeadlineExceeded (the session may be fine),
        at once for a call that waited for the lock while another's attempt failed (threads took a full timeout
        each, one after another); any other failure SessionLost. failed: _reopens_failed before the lock; within:
        what is left of the call's wait, which bounds the reopen (it took the client's whole timeout)."""
        if conn is None:
            raise SessionLost("the fast socket is closed: call recover() and retry")
        if failed != self._reopens_failed:
            raise DeadlineExceeded("the agent did not answer while another call opened the fast connection again: "
                                   "the next call tries again")
        self._check_session()
        within = min(self.timeout, within)
        try:
            self._open_fast(within)
            if not self._want_fast:  # the agent answers without a fast path now (an older agent in its place)
                self._fast = None
                raise SessionLost("the agent no longer offers the fast path (an older agent in its place?): call "
                                  "recover(), which goes on through gRPC, and retry")
        except (grpc.RpcError, OSError, ConnectionError) as e:
            self._fast = _DROPPED
            if not isinstance(e, grpc.RpcError) and not _broke(e) and type(e) not in (TimeoutError, socket.timeout) \
                    and not isinstance(e, _fastconn.FastConnTimeout):
                raise  # an error of the caller's own a signal handler raised (a TimeoutError subclass, say)
            if isinstance(e, (TimeoutError, socket.timeout, _fastconn.FastConnTimeout)) or (
                    isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
                self._reopens_failed += 1
                raise DeadlineExceeded("the agent did not answer within %.1f s while the fast connection was opened "
                                       "again: the next call tries again" % within) from e
            if isinstance(e, AgentError) and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise  # a limit of the caller's (its fast connections): the session is fine, the next call tries again
            raise SessionLost("the fast socket could not be opened again (%s): call recover() and retry" % e) from e
        return self._fast

    def _fast_reply(self, raw) -> pb.TransferResponse:
        """The response of a fast reply, or the error it carries raised."""
        reply = pb.FastReply.FromString(raw)
        if reply.code:
            if self._session_lost(_CODES.get(reply.code), reply.message, answered=True):
                raise SessionLost("agent unavailable (%s): call recover() and retry" % reply.message)
            raise AgentError(reply.code, reply.message)
        return reply.response

    @staticmethod
    def _settled(resp: pb.TransferResponse, wait: bool):
        if not wait:
            return resp.transfer_id
        st = resp.status
        if st.state != pb.TRANSFER_STATE_SUCCEEDED:
            raise TransferFailed(st)
        return st

    def register_layout(self, regions: Sequence[Region], block_bytes: int, segment: str = "",
                        grants: Sequence[str] = ()) -> Layout:
        """Groups regions of one length (a multiple of block_bytes) as numbered blocks: block i is
        [i*block_bytes, (i+1)*block_bytes) of every region; region k pairs with region k of the other layout of
        a transfer. segment publishes the layout to peers (to_layout_segment); grants as register_host's."""
        regions = list(regions)
        if not regions:
            raise ValueError("a layout needs at least one region")
        if block_bytes <= 0:
            raise ValueError("block_bytes must be positive")
        resp = self._call(self.stub.RegisterLayout, pb.RegisterLayoutRequest(
            region_ids=[r.id for r in regions], block_bytes=block_bytes, segment_name=segment,
            segment_grants=list(grants)))
        lay = Layout(resp.layout, regions, list(grants))
        with self._lock:
            self._layouts.append(lay)
        return lay

    def deregister_layout(self, layout: Layout):
        """Forgets a layout; its regions stay registered. The client forgets it even when the agent no longer
        knows it (NOT_FOUND: it went with an agent restart recover() could not bring it back from). A published
        layout's agent first tells the other nodes' agents that resolved it (within a second), so no later
        transfer of theirs reaches it."""
        try:
            self._call(self.stub.DeregisterLayout, pb.DeregisterLayoutRequest(layout_id=layout.id))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                self._forget_layout(layout)
            raise
        self._forget_layout(layout)

    def _forget_layout(self, layout: Layout):
        with self._lock:
            if layout in self._layouts:
                self._layouts.remove(layout)

    def transfer_blocks(self, op: str, layout: Layout, ids, remote: RemoteLayout, remote_ids,
                        timeout: Optional[float] = None, wait: bool = True, notify: Optional[bytes] = None,
                        id_bytes: Optional[int] = None):
        """Moves blocks between layout and remote, in every region pair: "write" copies local block ids[i] to
        remote block remote_ids[i], "read" the reverse. ids and remote_ids are numpy int32/int64 arrays, torch
        CPU int32/int64 tensors or buffers of int32/int64 (raw bytes need id_bytes=4 or 8), of equal length;
        they travel packed, never as Python objects. With wait (default) returns the settled status or raises
        TransferFailed; without it returns the transfer id for wait(). A status that says the blocks landed is
        decoded when first read: it acts as the TransferStatus (fields, methods, printing, ==, isinstance), and
        transfer_status(st) is the message itself, for protobuf calls that take one (a message's constructor,
        CopyFrom) and for a message compared with it on the left. timeout: seconds the transfer may take (a
        waited one defaults to the client's timeout, an unwaited one to the agent's, as transfer's). Ids of more
        than one dimension are refused (ValueError), not flattened. The agent refuses (INVALID_ARGUMENT, nothing
        moved) ids out of range, repeated destination ids and layouts of different geometry. Pairs run in any
        order: a block that one pair reads and another writes (a swap within one layout) gets no defined bytes;
        split such a move into two calls. A transfer that did not succeed (any failure) may still land blocks
        afterwards (copies already started finish): its destination blocks are undefined."""
        # Every step before the frame is written and after its reply shows in a waited one-block call (each
        # microsecond of the client's is about 2% of a 64 MiB copy on a GPU): the common case takes few of them.
        code = _OPS.get(op) if type(op) is str else None
        if code is None:
            code = _op(op)
        if type(remote) is not RemoteLayout or type(layout) is not Layout:
            raise TypeError(_blocks_sides_error(layout, remote))
        if id_bytes is None:
            local, width, count = _short_ids(ids) or _blocks.pack_ids(ids)
        else:
            local, width, count = _blocks.pack_ids(ids, id_bytes)
        if remote_ids is ids:  # block i to block i: one object is read once (a torch tensor's read is a microsecond)
            rids, rwidth, rcount = local, width, count
        elif id_bytes is None:
            rids, rwidth, rcount = _short_ids(remote_ids) or _blocks.pack_ids(remote_ids)
        else:
            rids, rwidth, rcount = _blocks.pack_ids(remote_ids, id_bytes)
        if count != rcount:
            raise ValueError("%d local ids but %d remote ids: they pair one to one" % (count, rcount))
        if count > 4096 and count > (self.info.limits.max_items_per_transfer or count):
            # Refused here: past 4 MiB the agent could not even read the request, and gRPC's refusal says only that.
            raise ValueError("%d block ids: the agent moves at most %d blocks a call (info.limits."
                             "max_items_per_transfer); split the transfer" % (count, self.info.limits.max_items_per_transfer))
        if timeout is not None:
            try:
                seconds = 0 <= timeout <= _MAX_TIMEOUT and type(timeout) is not bool
            except TypeError:  # a string, say (a try costs nothing until it raises)
                seconds = False
            if not seconds:
                _seconds(timeout)  # raises
        if wait and not timeout:
            timeout = self.timeout  # the agent ends it, and answers, before this call gives up
        if notify is None and width == rwidth and count < _ARENA_MIN_IDS and self._fast is not None:
            return self._short_blocks(code, layout, local, rids, width, count, remote, timeout, wait)
        if notify is not None:
            notify = self._check_notify(notify)
        # Long lists are written into the fast connection's id arena instead of the frame, from their packed
        # bytes: the ids are asked of torch or numpy once, whatever their length.
        busy = False
        if count >= _blocks.ARENA_MIN_IDS and self._arena is not None and self._fast is not None:
            self._check_session()
            try:
                resp = self._arena_call(code, layout, (local, width, rids, rwidth), remote, timeout, notify, wait)
            except _FastBusy:
                resp, busy = None, True
            if resp is not None:
                return self._settled(resp, wait)
        if width != rwidth:
            local = _blocks.widen(local) if width == 4 else local
            rids = _blocks.widen(rids) if rwidth == 4 else rids
            width = 8
        if width == 8 and id_bytes is None and count >= 1024:
            nl = _blocks.narrow_ids(ids, count)
            nr = None if nl is None else nl if remote_ids is ids else _blocks.narrow_ids(remote_ids, count)
            if nr is not None:
                local, rids, width = nl, nr, 4
        self._check_session()
        # A frame the fast socket would refuse goes by gRPC, whose refusal leaves the fast connection up.
        if not busy and self._fast is not None and len(local) + len(rids) + len(notify or b"") < FAST_FRAME_MAX - 4096:
            parts = _blocks.blocks_frame(code, layout.pb.id, remote, local, rids, width, timeout, notify, wait,
                                         self._answer_within(timeout))
            try:
                return self._settled(self._fast_call(parts, timeout, mailbox=self._mailbox_for(layout, remote)), wait)
            except _FastBusy:
                pass
        return self._grpc_blocks(code, layout, remote, local, rids, width, timeout, notify, wait)

    def _grpc_blocks(self, code, layout, remote, local, rids, width, timeout, notify, wait):
        """transfer_blocks through gRPC, of packed ids of one width: the status (waited) or the transfer id."""
        req = _blocks.blocks_request(code, layout.id, remote.ref, local, rids, width, timeout, notify, wait)
        return self._settled(self._call(self.stub.TransferBlocks, req, timeout=self._call_timeout(timeout)), wait)

    def prepare_blocks(self, op: str, layout: Layout, ids, remote: RemoteLayout, remote_ids,
                       timeout: Optional[float] = None, wait: bool = True) -> "PreparedBlocks":
        """transfer_blocks packed once, to run any number of times: PreparedBlocks.run() moves the same blocks
        each time, as transfer_blocks(op, layout, ids, remote, remote_ids, timeout, wait) would (waited, it
        returns None once they landed rather than the status, and raises as transfer_blocks does). The ids are
        copied now (changing the arrays afterwards changes nothing) and checked by the agent at each run, as
        transfer_blocks's are. For a transfer repeated as it is (a model's weights into the
        same tensors each step, one fixed staging block), a run skips what a call does before its frame is
        written: reading the ids out of numpy or torch, checking the arguments, building and joining the
        frame."""
        self._check_session()
        code = _op(op)
        if type(remote) is not RemoteLayout or type(layout) is not Layout:
            raise TypeError(_blocks_sides_error(layout, remote))
        local, width, count = _blocks.pack_ids(ids)
        rids, rwidth, rcount = _blocks.pack_ids(remote_ids)
        if count != rcount:
            raise ValueError("%d local ids but %d remote ids: they pair one to one" % (count, rcount))
        _seconds(timeout)
        if wait and not timeout:
            timeout = self.timeout
        return PreparedBlocks(self, code, layout, bytes(local), width, remote, bytes(rids), rwidth, timeout, wait)

    def _short_blocks(self, code, layout, local, rids, width, count, remote, timeout, wait):
        """transfer_blocks of a short list of ids of one width (fewer than the arena takes), packed, on the fast
        socket, with the frame's framing kept per shape: a waited one-block call is latency-bound, and every
        Python step shows in it."""
        # Keyed by the identity of the layouts' agent records (recover() replaces them, and the entry holds
        # them, so an identity is not reused while it is kept); a published layout by its node and name.
        lay = layout.pb
        other = remote._layout
        if other is not None:
            other = other.pb
            key = (code, id(lay), id(other), timeout, wait, width, count, self.timeout)
        else:
            key = (code, id(lay), remote._node, remote._segment, timeout, wait, width, count, self.timeout)
        framing = self._frames.get(key)
        if framing is None:
            parts = _blocks.blocks_frame(code, lay.id, remote, local, rids, width, timeout, None, wait,
                                         self._answer_within(timeout))
            framing = (parts[0], parts[2], parts[4], lay, other, self._mailbox_for(layout, remote))
            if len(self._frames) >= 256:
                self._frames.clear()
            self._frames[key] = framing
        if self._losses != self._session:
            self._check_session()  # raises
        # One frame: a single part goes into the mailbox as it is.
        frame = b"".join((framing[0], local, framing[1], rids, framing[2]))
        try:
            if not wait:
                return self._fast_call((frame,), timeout, mailbox=framing[5]).transfer_id
            raw = self._fast_frame(frame, timeout, framing[5])
        except _FastBusy:
            return self._grpc_blocks(code, layout, remote, local, rids, width, timeout, None, wait)
        if (len(raw) > 5 and raw[4] == 0x10 and raw[5] == 2 and raw[0] == 0x1A and raw[2] == 0x2A  # _landed(raw)
                and raw[1] == len(raw) - 2 and raw[3] < 0x80):
            st = _NEW(_LandedStatus)  # _LandedStatus(raw) without its __init__'s call
            _SET_RAW(st, raw)
            return st
        return self._waited_status(raw)

    def _waited_status(self, raw) -> pb.TransferStatus:
        """The status of a waited fast reply that _landed did not tell: decoded (its status alone when the reply
        starts with it), and raised as TransferFailed or the agent's error unless the transfer succeeded."""
        st = status_first(raw)
        if st is None:
            return self._settled(self._fast_reply(raw), True)
        if st.state != pb.TRANSFER_STATE_SUCCEEDED:
            raise TransferFailed(st)
        return st

    def _mailbox_for(self, layout: Layout, remote) -> bool:
        """Whether a block transfer may travel through a mailbox. A checked mailbox (CPUs other than x86) orders
        nothing but its own frames: this process's stores to its host memory before a call, and its loads of it
        after, could pass the mailbox's words there. So a transfer that reaches this process's host memory (its
        layout's, or that of its own layout on the other side) goes on the socket, whose system calls order them;
        one between GPU memory (and layouts other processes published) takes the mailbox."""
        if not self._mailbox_checked:
            return True
        own = getattr(remote, "_layout", None)
        return not layout._host and (own is None or not own._host)

    def _arena_call(self, code, layout, packed, remote, timeout, notify, wait):
        """A block transfer whose ids (packed: both lists as pack_ids returned them, with their widths) go
        through the fast connection's arena; None when they do not fit it."""
        def build(conn):
            count = self._arena.fill(*packed) if self._arena is not None else None
            return None if count is None else _blocks.arena_frame(code, layout.pb.id, remote, count, timeout, notify,
                                                                   wait, self._answer_within(timeout))

        # The arena is this process's memory too: in a checked mailbox its frame goes on the socket.
        return self._fast_call(None, timeout, build, mailbox=not self._mailbox_checked)

    def write(self, local: Region, local_offset: int, remote: Remote, remote_offset: int, length: int):
        return self.transfer("write", [Item(local, remote, length, local_offset, remote_offset)])

    def read(self, local: Region, local_offset: int, remote: Remote, remote_offset: int, length: int):
        return self.transfer("read", [Item(local, remote, length, local_offset, remote_offset)])

    def wait(self, transfer_id: int, timeout: Optional[float] = None) -> pb.TransferStatus:
        """Waits for a submitted transfer; raises TransferFailed if it did not succeed, and returns a PENDING
        status (it does not raise, unlike wait_all) when timeout (None or 0: the client's) passed first: the
        transfer goes on, and may be waited for again. The wait goes through the fast socket when
        the client has one (holding it meanwhile: other threads' calls go through gRPC while it does)."""
        _seconds(timeout)
        st = self._fast_wait([transfer_id], timeout)
        if st.state not in (pb.TRANSFER_STATE_SUCCEEDED, pb.TRANSFER_STATE_PENDING):
            raise TransferFailed(st)
        return st

    def cancel(self, transfer_id: int) -> pb.TransferStatus:
        """Cancels a transfer submitted with wait=False and returns its status once it settled: CANCELLED, or how
        it had already ended (copies already on the wire or queued on a device may still land); PENDING if it had
        not settled within 5 s. Ids the agent does not know as this caller's raise NOT_FOUND."""
        return self._call(self.stub.Cancel, pb.CancelRequest(transfer_id=transfer_id))

    def settle(self, timeout: Optional[float] = None) -> int:
        """Returns once every call of this client cut short before it (interrupted, or past its deadline while the
        agent served it) has stopped on the agent: the agent stops such a call's waited transfer, and nothing that
        transfer started lands in this node's memory after settle() returned. Call it before reusing memory a
        cut-short call was writing into. It also waits for every waited transfer the agent serves for this
        client when it asks (other threads' calls), within timeout (None or 0: the client's; DeadlineExceeded, a
        TimeoutError, when it ran out: the memory may then still be written to); returns how many waited
        transfers the agent waited for. Transfers submitted with wait=False are not waited for: cancel(id)
        returns once one stopped. A call interrupted while it went through gRPC (fast=False, or the fast
        connection held by another thread) is not covered reliably: its request may reach the agent after this
        one. An agent older than settle() raises AgentError (UNIMPLEMENTED)."""
        _seconds(timeout)
        deadline = time.perf_counter() + (timeout or self.timeout)
        with self._lock:
            cuts = list(self._cuts)
        # The fast connections first: once the agent closed one, it had read every frame sent on it, so none of
        # their transfers is submitted after the question below.
        for sock in cuts:
            try:
                ended = _fastconn.await_closed(sock, deadline)
            except (OSError, ValueError) as e:
                if sock.fileno() != -1 and not (isinstance(e, OSError) and _broke(e)):
                    raise  # a signal handler's error: the cut stays for the next settle()
                ended = True  # closed under this call (close(), or another thread found it ended)
            if self._closed:
                raise ClientClosed()
            if not ended:
                raise DeadlineExceeded("a call cut short had not stopped on the agent within the settle's timeout: "
                                       "its transfer may still land")
            with self._lock:
                if sock in self._cuts:
                    self._cuts.remove(sock)
            sock.close()
        left = max(deadline - time.perf_counter(), 1e-3)
        return self._call(self.stub.Settle, pb.SettleRequest(), timeout=left).waited

    def wait_all(self, transfer_ids: Sequence[int], timeout: Optional[float] = None) -> pb.TransferStatus:
        """Waits for every transfer of transfer_ids (submitted with wait=False) within timeout in all (default:
        the client's), in one round trip per 1,024 ids on the fast socket; returns the last one's status, raises
        TransferFailed for the first that did not succeed and DeadlineExceeded (a TimeoutError) when the time ran
        out first."""
        _seconds(timeout)
        ids = list(transfer_ids)
        if not ids:
            raise ValueError("no transfers to wait for")
        deadline = time.perf_counter() + (timeout or self.timeout)
        st = None
        for k in range(0, len(ids), _MAX_WAIT_IDS):
            # Each share is asked of the agent, however little time is left: transfers that ended are said so, not
            # taken for pending.
            left = max(deadline - time.perf_counter(), 1e-6)
            st = self._fast_wait(ids[k:k + _MAX_WAIT_IDS], left)
            if st.state != pb.TRANSFER_STATE_SUCCEEDED:
                break
        if st.state == pb.TRANSFER_STATE_PENDING:
            raise DeadlineExceeded("transfer %d still pending when the wait's %.3g s ran out" % (st.transfer_id,
                                                                                          timeout or self.timeout))
        if st.state != pb.TRANSFER_STATE_SUCCEEDED:
            raise TransferFailed(st)
        return st

    def _fast_wait(self, ids: List[int], timeout: Optional[float]) -> pb.TransferStatus:
        """Waits for ids within timeout (None or 0: the client's), in one FastWait frame where the fast connection
        is there and free, else through gRPC one by one: the first that did not succeed, else the last one's
        status."""
        timeout = timeout or self.timeout
        self._check_session()
        if self._fast is not None:
            parts = _blocks.wait_frame(ids, timeout, self._answer_within(timeout))
            try:
                # The transfers waited for may have written this process's host memory (see _mailbox_for).
                return self._fast_call(parts, timeout, mailbox=not self._mailbox_checked).status
            except _FastBusy:
                pass
        deadline = time.perf_counter() + timeout
        for tid in ids:
            left = max(deadline - time.perf_counter(), 1e-6)
            req = pb.WaitRequest(transfer_id=tid)
            req.timeout.FromNanoseconds(_blocks.nanos(left))
            st = self._call(self.stub.Wait, req, timeout=left + 1.0)
            if st.state != pb.TRANSFER_STATE_SUCCEEDED:
                break
        return st

    def resolve_segment(self, node: str, segment: str) -> bytes:
        """The descriptor of the region published as segment on node ("": this one)."""
        return self._call(self.stub.ResolveSegment, pb.ResolveSegmentRequest(node=node, segment=segment)).desc

    def resolve_layout(self, node: str, segment: str) -> pb.LayoutGeometry:
        """The geometry of the layout published as segment on node ("": this one), as a transfer_blocks to
        to_layout_segment(node, segment) would find it: block_bytes and regions, which your layout must match,
        and blocks, which every id must be below. Raises the agent's NOT_FOUND while nothing is published under
        the name (a consumer started before its producer can ask again until it is)."""
        resp = self._call(self.stub.ResolveSegment, pb.ResolveSegmentRequest(node=node, segment=segment, layout=True))
        if not resp.HasField("layout"):
            # An agent older than the layout field read the question as a region's, and answered as one.
            raise AgentError(grpc.StatusCode.UNIMPLEMENTED, "the agent does not look layouts up (it predates "
                             "ResolveSegment's layout field): upgrade it")
        return resp.layout

    def notifications(self, regions: Optional[List[Region]] = None,
                      timeout: Optional[float] = None) -> Iterator[pb.Notification]:
        """Streams the notifications that transfers with notify leave on regions, one per transfer naming every
        listened region it touched (region_ids) (default: every region this client registered and holds now; the agent's own filter is the caller's, which is every client of a pod,
        or of a user without Kubernetes); cancel() the returned iterator to stop. Returns once the agent listens,
        so nothing that lands afterwards is missed; raises SessionLost after an agent restart (recover() first)
        and the agent's refusal (an unknown region: NOT_FOUND) at once. A stream the agent's restart ends raises
        SessionLost where it is read. timeout (default the client's) bounds the wait for the agent to listen:
        DeadlineExceeded after it; the stream itself has no deadline."""
        self._check_session()
        timeout = _seconds(timeout) or self.timeout
        if regions is None:
            with self._lock:
                regions = [r for r, how in self._owned.items() if not r.lost]
            if not regions:
                raise ValueError("this client holds no regions to be notified about: register them first, or name "
                                 "regions")
        call = self.stub.Notifications(pb.NotificationsRequest(region_ids=[r.id for r in regions]),
                                       wait_for_ready=False, metadata=self._session_md)
        # gRPC's wait for the header has no deadline of its own: an agent that stalled held the caller for ever.
        listening = threading.Thread(target=_header_of, args=(call,), name="fabricxfer-listen", daemon=True)
        listening.start()
        listening.join(timeout)
        if listening.is_alive():
            call.cancel()
            raise DeadlineExceeded("the agent did not start listening within %.3g s (stalled, or too busy to "
                                   "answer); nothing is listening" % timeout)
        if not call.is_active() or call.done():
            code = call.code()
            if code is not None and code != grpc.StatusCode.OK:
                if self._session_lost(code, call.details(), _answered(call)):
                    raise SessionLost("agent session lost (%s): call recover() and retry" % call.details())
                raise AgentError(code.value[0], call.details() or "")
        self._check_session()
        return _NotificationStream(self, call)
