#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""GPU benchmark of transfer_blocks against plain torch, on any machine with a CUDA GPU and PyTorch.

    go build -o bin/agent ./cmd/agent
    python3 client/python/bench/bench_gpu.py [--agent bin/agent] [--expandable] [--json out.json]

It starts the agent binary in standalone mode (``<agent> standalone --socket-dir DIR --pool-name kv``), waits
for DIR/kv/agent.sock, and runs itself again with --client in a separate process, which registers torch tensors
on cuda:<--device> with register_tensor and times, against what torch users write:

  a  15,360 blocks of 720 B scattered between two pools of 262,144 blocks (one uint8 [262144, 720] tensor
     each), fresh random ids per iteration, vs dst[dst_ids] = src[src_ids] (ids as cuda int64 tensors made
     outside the timing)
  b  32 layers x K/V = 64 tensors per side of [1024, 16384] uint8, 1,024 random block ids in one call, vs a
     loop of indexed copies over the 64 tensors
  c  contiguous 64 MiB and 1 GiB tensor to tensor (a one-region layout of one block), vs dst.copy_(src)
  c64-prep, c1g-prep  the same copies through prepare_blocks, packed once and run each call, as a caller that
     moves the same tensors every step (weights, a fixed staging buffer) would
  d  4 KiB round trips (one 4 KiB block), p50 and p99 of 2,000, vs a 4 KiB copy_ and a synchronize
  d-idle  the same with --idle (1 ms) of idle time before each call on both sides, as a scheduler calls between
     steps: within the agent's --fast-spin the call finds it polling, past it the agent must be woken
  a-pipe, c64-pipe, c1g-pipe  the same copies --depth (8) at a time, as an inference engine overlaps the
     layers or requests it moves: ours submits --depth transfers with wait=False and then waits for all of them,
     torch queues --depth copies and synchronizes once; the time is per copy

torch is timed with torch.cuda.synchronize() around each call (each round of --depth for the -pipe cases), ours
wall-clock per call (wait=True; the -pipe rounds end when wait_all returns); each time is the median of --iters
after --warmup calls and at least --warmup-seconds of calls on each side (all of ours, then all of torch's; with
--interleave call by call, ours then torch's, and the median of each pair's own ratio beside; with --rounds R
in R rounds of a share of the calls each, ours then torch's, and the median of the rounds' own ratios beside),
after half a second of copies that bring the GPU to its clocks. Block ids are drawn ahead of time and copied (untimed) just before the call that
uses them, as a scheduler hands over ids it just computed: ids drawn seconds earlier are no longer in the CPU's
caches, and reading them from memory cost the client tens of microseconds of case a. Every destination byte is compared (torch.equal) with what torch's
own copies produced from the same ids. A failing case prints its error and the next one runs. The agent is
killed at the end whatever happens. --expandable runs the client with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. --busy runs a third process that keeps the GPU computing
(4096 x 4096 fp16 matmuls, 20 between synchronizes) for the whole run, as an inference engine keeps its GPU busy
between transfers: without MPS the GPU runs one process's work at a time, so every copy of the agent and of the
client waits for that process's timeslice. --mps makes the agent, the client and the --busy process clients of
one MPS server (a control daemon of the run's own, its pipe folder in the run's folder, so no other process of the
machine joins it): their kernels and copies then run side by side instead of taking turns, as on a node whose
GPUs are shared through MPS.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

from bench_tcp import pair_ratio

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("a", "b", "c64", "c1g", "c64-prep", "c1g-prep", "d", "d-idle", "a-pipe", "c64-pipe", "c1g-pipe")
MIB = 1 << 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="GPU benchmark of fabricxfer transfer_blocks against torch",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--agent", default="bin/agent", help="agent binary (default bin/agent)")
    p.add_argument("--socket-dir", help="socket directory for the agent (default: a fresh temporary one)")
    p.add_argument("--pool-name", default="kv", help="pool name, the socket's folder (default kv)")
    p.add_argument("--agent-arg", action="append", default=[], help="one more argument for the agent (repeatable)")
    p.add_argument("--expandable", action="store_true", help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    p.add_argument("--busy", action="store_true",
                   help="keep the GPU computing from a third process during the run (as an inference engine would)")
    p.add_argument("--mps", action="store_true",
                   help="run the agent, the client and the --busy process as clients of an MPS control daemon "
                        "started for this run (nvidia-cuda-mps-control, its pipe and log folders in the run's "
                        "folder; quit at the end)")
    p.add_argument("--no-mailbox", action="store_true",
                   help="frames on the fast socket only, without the shared-memory mailbox (Client(mailbox=False))")
    p.add_argument("--interleave", action="store_true",
                   help="time the two sides call by call, alternating (ours, then torch's), instead of all of ours "
                        "and then all of torch's; each case also reports the median of the pairs' own ratios. On a GPU "
                        "without MPS every call then switches the GPU between the two processes, which adds about "
                        "150 us to both sides' calls on an H200: use it for throughput cases, not for latency")
    p.add_argument("--rounds", type=int, default=1,
                   help="time the two sides in this many rounds, each a share of the calls: ours, then torch's, so a "
                        "machine whose speed drifts during a case weighs on both sides; the first --warmup calls of "
                        "each round's side are untimed (the GPU switching processes, the agent waking). Each case "
                        "also reports the median of the rounds' own ratios. Default 1: all of ours, then all of "
                        "torch's")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of %s" % ",".join(CASES))
    p.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per case (default 50)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument("--warmup-seconds", type=float, default=0.2,
                   help="and untimed iterations until this many seconds have passed (default 0.2)")
    p.add_argument("--rtt-iters", type=int, default=2000, help="round trips of case d (default 2000)")
    p.add_argument("--depth", type=int, default=8, help="copies in flight in the -pipe cases (default 8)")
    p.add_argument("--idle", type=float, default=1e-3, help="seconds idle before each call of d-idle (default 0.001)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="seconds to wait for the agent socket")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds the client process may run in all")
    p.add_argument("--call-timeout", type=float, default=60.0, help="seconds one agent call may take")
    # Internal: the client half, and the process that keeps the GPU busy.
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--busy-loop", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error("unknown cases %s (known: %s)" % (",".join(unknown), ",".join(CASES)))
    a.cases = cases
    if a.iters < 1 or a.warmup < 0 or a.rtt_iters < 1 or a.warmup_seconds < 0 or a.depth < 1 or a.idle < 0:
        p.error("--iters, --rtt-iters and --depth must be positive, --warmup, --warmup-seconds and --idle not negative")
    if a.rounds < 1 or (a.rounds > 1 and a.interleave):
        p.error("--rounds must be positive, and --interleave times call by call: pass one of them")
    if a.client and not a.socket:
        p.error("--client needs --socket")
    return a


# ---- results and the table (pure: tested without a GPU) ----

def gbps(nbytes, ms):
    return nbytes / (ms * 1e6) if ms and ms > 0 else None


def result(case, nbytes, ours_ms=None, torch_ms=None, verified=None, error="", **extra):
    r = {"case": case, "bytes": nbytes, "fabricxfer_ms": ours_ms, "fabricxfer_gbps": gbps(nbytes, ours_ms),
         "torch_ms": torch_ms, "torch_gbps": gbps(nbytes, torch_ms),
         "ratio": (torch_ms / ours_ms) if ours_ms and torch_ms else None, "verified": verified, "error": error}
    r.update(extra)
    return r


def _num(v, fmt):
    return fmt % v if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def format_table(results):
    """The results as a text table: case, fabricxfer ms and GB/s, torch ms and GB/s, ratio (torch time / ours)."""
    head = ("case", "fabricxfer ms", "GB/s", "torch ms", "GB/s", "ratio", "check")
    rows = []
    for r in results:
        check = "ok" if r.get("verified") else ("ERROR" if r.get("error") else "DIFFERS")
        rows.append((r["case"], _num(r.get("fabricxfer_ms"), "%.4f"), _num(r.get("fabricxfer_gbps"), "%.2f"),
                     _num(r.get("torch_ms"), "%.4f"), _num(r.get("torch_gbps"), "%.2f"), _num(r.get("ratio"), "%.2f"),
                     check))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    for r in results:
        if r.get("error"):
            out.append("%s: %s" % (r["case"], r["error"]))
        if r.get("note"):
            out.append("%s: %s" % (r["case"], r["note"]))
        if r.get("pair_ratio") is not None:
            out.append("%s: interleaved, median of the pairs' ratios %.2f (lowest %.2f, highest %.2f)" % (
                r["case"], r["pair_ratio"], r["pair_low"], r["pair_high"]))
        if r.get("round_ratio") is not None:
            out.append("%s: in %d rounds, median of the rounds' ratios %.2f (lowest %.2f, highest %.2f)" % (
                r["case"], r["rounds"], r["round_ratio"], r["round_low"], r["round_high"]))
    return "\n".join(out)


def client_command(a, socket_path):
    """The command line of the client half."""
    cmd = [sys.executable, os.path.abspath(__file__), "--client", "--socket", socket_path, "--cases", ",".join(a.cases),
           "--device", str(a.device), "--iters", str(a.iters), "--warmup", str(a.warmup),
           "--warmup-seconds", str(a.warmup_seconds), "--rtt-iters",
           str(a.rtt_iters), "--depth", str(a.depth), "--idle", repr(a.idle), "--call-timeout", str(a.call_timeout)]
    if a.json:
        cmd += ["--json", os.path.abspath(a.json)]
    if a.expandable:
        cmd.append("--expandable")
    if a.no_mailbox:
        cmd.append("--no-mailbox")
    if a.interleave:
        cmd.append("--interleave")
    if a.rounds > 1:
        cmd += ["--rounds", str(a.rounds)]
    return cmd


def busy_command(a):
    """The command line of the process --busy starts: it computes on --device until it is stopped, at most
    --timeout seconds."""
    return [sys.executable, os.path.abspath(__file__), "--busy-loop", "--device", str(a.device), "--timeout",
            str(a.timeout)]


def run_busy(a) -> int:
    """Keeps the GPU computing: 4096 x 4096 fp16 matmuls, synchronizing every 20, until stopped or --timeout."""
    import torch

    dev = torch.device("cuda", a.device)
    x = torch.randn(4096, 4096, device=dev, dtype=torch.float16)
    end = time.monotonic() + a.timeout
    while time.monotonic() < end:
        for _ in range(20):
            torch.mm(x, x)
        torch.cuda.synchronize(dev)
    return 0


def mps_env(sock_dir):
    """The environment that makes CUDA processes clients of the run's MPS control daemon (--mps)."""
    d = os.path.join(sock_dir, "mps")
    return {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(d, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(d, "log")}


def start_mps(env, timeout=30.0):
    """Starts an MPS control daemon whose folders env names; returns the command that stops it."""
    for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
        os.makedirs(env[k], exist_ok=True)
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise RuntimeError("--mps: nvidia-cuda-mps-control is not on PATH")
    subprocess.run([control, "-d"], env=dict(os.environ, **env), check=True, timeout=timeout)
    return lambda: subprocess.run([control], input=b"quit\n", env=dict(os.environ, **env), timeout=timeout)


def client_env(a, base=None):
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    conf = [c for c in env.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")
            if c and not c.startswith("expandable_segments")]
    conf.append("expandable_segments:%s" % ("True" if a.expandable else "False"))
    env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(conf)
    src = os.path.dirname(HERE)  # client/python, for a fabricxfer that is not installed
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ---- the driver: agent up, client run, agent down ----

def find_agent(path):
    candidates = [path]
    if not os.path.isabs(path):
        candidates.append(os.path.join(HERE, "..", "..", "..", path))  # the repository root
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    raise SystemExit("agent binary %s not found: build it with `go build -o bin/agent ./cmd/agent` or pass --agent"
                     % path)


def wait_for_socket(path, proc, timeout):
    """Waits until the agent answers on path (a connect succeeds) or timeout passes or the agent exits."""
    deadline = time.monotonic() + timeout
    fd_sock = os.path.join(os.path.dirname(path), "agent.fd.sock")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the agent exited with %s before serving" % proc.returncode)
        if os.path.exists(path) and os.path.exists(fd_sock):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1.0)
            try:
                s.connect(path)
                return
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    raise TimeoutError("no agent socket at %s after %.0f s" % (path, timeout))


def stop(proc, grace=10.0):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace)


def drive(a) -> int:
    agent = find_agent(a.agent)
    own_dir = a.socket_dir is None
    sock_dir = a.socket_dir or tempfile.mkdtemp(prefix="fxbench")
    log_path = os.path.join(sock_dir, "agent.log")
    proc = child = busy = stop_mps = None
    try:
        if a.mps:
            # Every process started below inherits the run's MPS folders.
            os.environ.update(mps_env(sock_dir))
            stop_mps = start_mps(mps_env(sock_dir))
            print("MPS control daemon for this run: %s" % os.environ["CUDA_MPS_PIPE_DIRECTORY"], flush=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([agent, "standalone", "--socket-dir", sock_dir, "--pool-name", a.pool_name]
                                    + a.agent_arg, stdout=log, stderr=subprocess.STDOUT)
        sock = os.path.join(sock_dir, a.pool_name, "agent.sock")
        wait_for_socket(sock, proc, a.start_timeout)
        print("agent %s serving %s (log %s)" % (agent, sock, log_path), flush=True)
        if a.busy:
            busy = subprocess.Popen(busy_command(a), env=client_env(a))
            print("process %d keeps GPU %d computing for the whole run" % (busy.pid, a.device), flush=True)
        child = subprocess.Popen(client_command(a, sock), env=client_env(a))
        try:
            return child.wait(a.timeout)
        except subprocess.TimeoutExpired:
            print("the client ran past --timeout %.0f s: stopped" % a.timeout, flush=True)
            return 124
    except Exception as e:
        print("bench_gpu: %s" % e, flush=True)
        return 1
    finally:
        stop(child, 5.0)
        stop(busy, 5.0)
        stop(proc)
        if stop_mps is not None:
            try:
                stop_mps()
            except (OSError, subprocess.SubprocessError) as e:
                print("bench_gpu: stopping the MPS control daemon: %s" % e, flush=True)
        if proc is not None and proc.returncode not in (0, -signal.SIGTERM, None):
            print("agent exit status %s; the end of its log:" % proc.returncode, flush=True)
        if proc is not None:
            try:
                with open(log_path, "rb") as f:
                    tail = f.read()[-4000:].decode(errors="replace")
                if proc.returncode not in (0, -signal.SIGTERM) or os.environ.get("FXBENCH_AGENT_LOG"):
                    print(tail, flush=True)
            except OSError:
                pass
        if own_dir:
            shutil.rmtree(sock_dir, ignore_errors=True)


# ---- the client half (needs torch and a GPU) ----

class Bench:
    def __init__(self, a):
        import torch

        from fabricxfer.client import Client

        self.a, self.torch = a, torch
        self.dev = torch.device("cuda", a.device)
        torch.cuda.set_device(self.dev)
        self.c = Client(a.socket, timeout=a.call_timeout, name="bench-gpu", mailbox=not a.no_mailbox)
        self.gen = torch.Generator().manual_seed(1)
        self.warm_gpu()

    def warm_gpu(self, seconds=0.5):
        """Copies for a moment first: an idle H200 reports 345 MHz and needs thousands of calls to reach its
        clocks, and whichever side ran first would pay for it."""
        torch = self.torch
        x = torch.empty(256 * MIB, dtype=torch.uint8, device=self.dev)
        y = torch.empty_like(x)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            y.copy_(x)
            self.sync()
        del x, y

    def sync(self):
        self.torch.cuda.synchronize(self.dev)

    def warm(self, fn, before=None):
        """--warmup calls, then more until --warmup-seconds have passed (the first calls on fresh memory and
        after a pause run slower, on both sides)."""
        w = max(1, self.a.warmup)
        until = time.monotonic() + self.a.warmup_seconds
        while time.monotonic() < until:
            for i in range(w):
                if before:
                    before(i)
                fn(i)
        # Both sides end their warm-up with the same calls in the same order, so blocks that only warm-up calls
        # wrote hold the same bytes on both sides.
        for i in range(w):
            if before:
                before(i)
            fn(i)

    def timed_calls(self, n=None):
        """The indices of the timed calls, after the warm-up's."""
        return range(self.a.warmup, self.a.warmup + (n or self.a.iters))

    def torch_before(self, prepare):
        """What runs untimed before each of torch's calls: prepare(i), then a synchronize."""
        def before(i):
            if prepare:
                prepare(i)
            self.sync()
        return before

    def call_torch(self, fn, i, prepare):
        """Torch's call i, timed with a synchronize at its end."""
        self.torch_before(prepare)(i)
        t0 = time.perf_counter()
        fn(i)
        self.sync()
        return time.perf_counter() - t0

    def call_ours(self, fn, i, prepare):
        """Our call i, timed by the wall clock (a waited call returns with its transfer settled)."""
        if prepare:
            prepare(i)
        t0 = time.perf_counter()
        fn(i)
        return time.perf_counter() - t0

    def time_torch(self, fn, n=None, prepare=None):
        self.warm(fn, self.torch_before(prepare))
        return [self.call_torch(fn, i, prepare) for i in self.timed_calls(n)]

    def time_ours(self, fn, n=None, prepare=None):
        """prepare(i), untimed, runs before call i on both sides (fresh ids)."""
        self.sync()  # what torch wrote must be there before the agent reads it
        self.warm(fn, prepare)
        return [self.call_ours(fn, i, prepare) for i in self.timed_calls(n)]

    def time_pair(self, ours, theirs, n=None, prepare=None):
        """Times ours and theirs (torch's) over the same calls: with --interleave call by call, alternating
        (ours i, then torch's i), so drift of the machine during a case falls on both alike; otherwise all of ours,
        then all of torch's. prepare(i), untimed, runs before call i on both sides. Returns both lists of
        seconds, in call order."""
        if self.a.rounds > 1:
            return self.time_rounds(ours, theirs, n, prepare)
        if not self.a.interleave:
            return self.time_ours(ours, n, prepare), self.time_torch(theirs, n, prepare)
        self.sync()  # what torch wrote must be there before the agent reads it
        self.warm(ours, prepare)
        self.warm(theirs, self.torch_before(prepare))
        ours_t, torch_t = [], []
        for i in self.timed_calls(n):
            ours_t.append(self.call_ours(ours, i, prepare))
            torch_t.append(self.call_torch(theirs, i, prepare))
        return ours_t, torch_t

    def time_rounds(self, ours, theirs, n=None, prepare=None):
        """time_pair in --rounds rounds: each round times its share of the calls on our side, then the same calls
        on torch's, after --warmup of them untimed on each side (copies again what they copy, so the bytes
        compared at the end do not change). Returns both lists of seconds, in call order."""
        self.sync()
        self.warm(ours, prepare)
        self.warm(theirs, self.torch_before(prepare))
        ours_t, torch_t = [], []
        for chunk in self.round_calls(n):
            self.sync()
            for i in chunk[:self.a.warmup]:
                self.call_ours(ours, i, prepare)
            ours_t += [self.call_ours(ours, i, prepare) for i in chunk]
            for i in chunk[:self.a.warmup]:
                self.call_torch(theirs, i, prepare)
            torch_t += [self.call_torch(theirs, i, prepare) for i in chunk]
        return ours_t, torch_t

    def round_calls(self, n=None):
        """The timed calls' indices cut into --rounds shares (fewer when there are fewer calls)."""
        calls = list(self.timed_calls(n))
        k = -(-len(calls) // min(self.a.rounds, len(calls)))
        return [calls[s:s + k] for s in range(0, len(calls), k)]

    def paired(self, ours_t, torch_t):
        """The result's extras of an interleaved case: the median of each pair's own ratio (torch / ours), with
        the lowest and highest; of a case in rounds, the same of each round's medians."""
        if self.a.rounds > 1:
            k = len(self.round_calls(len(ours_t))[0])
            ratios = sorted(statistics.median(torch_t[s:s + k]) / statistics.median(ours_t[s:s + k])
                            for s in range(0, len(ours_t), k))
            return {"rounds": len(ratios), "round_ratio": statistics.median(ratios), "round_low": ratios[0],
                    "round_high": ratios[-1]}
        if not self.a.interleave:
            return {}
        ratio, low, high = pair_ratio(torch_t, ours_t)
        return {"pair_ratio": ratio, "pair_low": low, "pair_high": high}

    def layout(self, tensors, block_bytes):
        regions = [self.c.register_tensor(t, gpu_index=self.a.device) for t in tensors]
        return self.c.register_layout(regions, block_bytes)

    def release(self, *layouts):
        for lay in layouts:
            if lay is None:
                continue
            try:
                self.c.deregister_layout(lay)
            except Exception:
                pass
            for r in lay.regions:
                try:
                    self.c.deregister(r)
                except Exception:
                    pass

    def randperm(self, n, k):
        return self.torch.randperm(n, generator=self.gen)[:k].contiguous()

    def random_bytes(self, *shape):
        t = self.torch.empty(shape, dtype=self.torch.uint8, device=self.dev)
        t.random_(0, 256)
        return t

    def submit_all(self, calls):
        """Each call submits one transfer without waiting (wait=False); then waits for them all."""
        self.c.wait_all([call() for call in calls], timeout=self.a.call_timeout)

    def scattered(self, name, pools, blocks, block_bytes, ids, iters, depth=1):
        """Ids drawn per call between pools of blocks x block_bytes: pools tensors per side; depth calls a
        round (one at a time with depth 1)."""
        torch, to_layout = self.torch, __import__("fabricxfer.client", fromlist=["to_layout"]).to_layout
        src = [self.random_bytes(blocks, block_bytes) for _ in range(pools)]
        ours = [torch.zeros(blocks, block_bytes, dtype=torch.uint8, device=self.dev) for _ in range(pools)]
        ref = [torch.zeros_like(t) for t in ours]
        n = (self.a.warmup + iters) * depth
        sets = [(self.randperm(blocks, ids), self.randperm(blocks, ids)) for _ in range(n)]
        gpu_sets = [(s.to(self.dev), d.to(self.dev)) for s, d in sets]
        fresh = []

        def prepare(i):  # round i's ids, written just now
            fresh[:] = [(s.clone(), d.clone()) for s, d in sets[i * depth:(i + 1) * depth]]

        src_l = dst_l = None
        try:
            src_l, dst_l = self.layout(src, block_bytes), self.layout(ours, block_bytes)
            remote = to_layout(dst_l)
            if depth == 1:
                fn = lambda i: self.c.transfer_blocks(  # noqa: E731
                    "write", src_l, fresh[0][0], remote, fresh[0][1], timeout=self.a.call_timeout)
            else:
                fn = lambda i: self.submit_all([  # noqa: E731
                    lambda s=s, d=d: self.c.transfer_blocks("write", src_l, s, remote, d, timeout=self.a.call_timeout,
                                                            wait=False) for s, d in fresh])
            def torch_copy(i):
                for s, d in gpu_sets[i * depth:(i + 1) * depth]:
                    for k in range(pools):
                        ref[k][d] = src[k][s]

            ours_t, torch_t = self.time_pair(fn, torch_copy, iters, prepare)
            self.sync()
            ok = all(torch.equal(x, y) for x, y in zip(ours, ref))
            moved = pools * ids * block_bytes
            return result(name, moved, statistics.median(ours_t) * 1e3 / depth,
                          statistics.median(torch_t) * 1e3 / depth, ok, **self.paired(ours_t, torch_t))
        finally:
            self.release(src_l, dst_l)
            del src, ours, ref

    def case_a(self):
        return self.scattered(CASE_NAMES["a"], 1, 262144, 720, 15360, self.a.iters)

    def case_a_pipe(self):
        return self.scattered(CASE_NAMES["a-pipe"] % self.a.depth, 1, 262144, 720, 15360, self.a.iters,
                              self.a.depth)

    def case_b(self):
        return self.scattered(CASE_NAMES["b"], 64, 1024, 16384, 1024, self.a.iters)

    def contiguous(self, name, size, depth=1, prepared=False):
        torch = self.torch
        from fabricxfer.client import to_layout

        src = self.random_bytes(size)
        ours = torch.zeros(size, dtype=torch.uint8, device=self.dev)
        ref = torch.zeros_like(ours)
        src_l = dst_l = None
        zero = torch.zeros(1, dtype=torch.int64)
        try:
            src_l, dst_l = self.layout([src], size), self.layout([ours], size)
            remote = to_layout(dst_l)
            one = lambda wait=True: self.c.transfer_blocks("write", src_l, zero, remote, zero,  # noqa: E731
                                                           timeout=self.a.call_timeout, wait=wait)
            if prepared:
                run = self.c.prepare_blocks("write", src_l, zero, remote, zero, timeout=self.a.call_timeout).run
                ours_fn = lambda i: run()  # noqa: E731
            elif depth == 1:
                ours_fn = lambda i: one()  # noqa: E731
            else:
                ours_fn = lambda i: self.submit_all([lambda: one(False)] * depth)  # noqa: E731
            ours_t, torch_t = self.time_pair(ours_fn, lambda i: [ref.copy_(src) for _ in range(depth)])
            self.sync()
            ok = torch.equal(ours, src) and torch.equal(ref, src)
            return result(name, size, statistics.median(ours_t) * 1e3 / depth, statistics.median(torch_t) * 1e3 / depth,
                          ok, **self.paired(ours_t, torch_t))
        finally:
            self.release(src_l, dst_l)
            del src, ours, ref

    def case_c64(self):
        return self.contiguous(CASE_NAMES["c64"], 64 * MIB)

    def case_c1g(self):
        return self.contiguous(CASE_NAMES["c1g"], 1024 * MIB)

    def case_c64_prep(self):
        return self.contiguous(CASE_NAMES["c64-prep"], 64 * MIB, prepared=True)

    def case_c1g_prep(self):
        return self.contiguous(CASE_NAMES["c1g-prep"], 1024 * MIB, prepared=True)

    def case_c64_pipe(self):
        return self.contiguous(CASE_NAMES["c64-pipe"] % self.a.depth, 64 * MIB, self.a.depth)

    def case_c1g_pipe(self):
        return self.contiguous(CASE_NAMES["c1g-pipe"] % self.a.depth, 1024 * MIB, self.a.depth)

    def case_d(self):
        return self.round_trips(CASE_NAMES["d"], 0.0)

    def case_d_idle(self):
        return self.round_trips(case_name("d-idle", self.a), self.a.idle)

    def round_trips(self, name, idle):
        torch = self.torch
        from fabricxfer.client import to_layout

        blocks, bs, n = 256, 4096, self.a.rtt_iters
        src = self.random_bytes(blocks, bs)
        ours = torch.zeros_like(src)
        ref = torch.zeros_like(src)
        ids = [torch.tensor([i % blocks], dtype=torch.int64) for i in range(blocks)]
        src_l = dst_l = None
        try:
            src_l, dst_l = self.layout([src], bs), self.layout([ours], bs)
            remote = to_layout(dst_l)
            # The idle time is spent before the timer starts, as a caller does other work between calls.
            wait = (lambda i: _idle(idle)) if idle else None
            ours_t, torch_t = self.time_pair(
                lambda i: self.c.transfer_blocks("write", src_l, ids[i % blocks], remote, ids[i % blocks],
                                                 timeout=self.a.call_timeout),
                lambda i: ref[i % blocks].copy_(src[i % blocks]), n, prepare=wait)
            self.sync()
            ok = torch.equal(ours, src) and torch.equal(ref, src)
            p = lambda ts, q: sorted(ts)[min(len(ts) - 1, int(len(ts) * q))] * 1e3  # noqa: E731
            r = result(name, bs, p(ours_t, 0.5), p(torch_t, 0.5), ok,
                       fabricxfer_p99_ms=p(ours_t, 0.99), torch_p99_ms=p(torch_t, 0.99), **self.paired(ours_t, torch_t))
            r["note"] = "p99 fabricxfer %.4f ms, torch %.4f ms (of %d)" % (r["fabricxfer_p99_ms"], r["torch_p99_ms"], n)
            return r
        finally:
            self.release(src_l, dst_l)
            del src, ours, ref


CASE_NAMES = {"a": "a 15360x720B of 2x262144", "b": "b 64x1024x16KiB perm", "c64": "c 64 MiB contiguous",
              "c1g": "c 1 GiB contiguous", "c64-prep": "c 64 MiB prepared", "c1g-prep": "c 1 GiB prepared",
              "d": "d 4 KiB round trip p50",
              "d-idle": "d 4 KiB after %g ms idle, p50", "a-pipe": "a %d in flight, per copy",
              "c64-pipe": "c 64 MiB %d in flight, per copy", "c1g-pipe": "c 1 GiB %d in flight, per copy"}


def case_name(case, a):
    """The table's name of a case (the -pipe ones say how many copies were in flight, d-idle how long it idled)."""
    name = CASE_NAMES[case]
    if "%g" in name:
        return name % (a.idle * 1e3)
    return name % a.depth if "%d" in name else name


def _idle(seconds: float):
    """Busy for seconds, as a caller computing between calls (a sleep would idle this core as well)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def run_client(a) -> int:
    results, header = [], {}
    try:
        bench = Bench(a)
        torch = bench.torch
        header = {"mode": "expandable_segments" if a.expandable else "caching allocator (cudaMalloc segments)",
                  "torch": torch.__version__, "device": torch.cuda.get_device_name(bench.dev),
                  "agent": bench.c.info.agent_version, "node": bench.c.info.node_name,
                  # The same-node engine's reason says how the GPU is shared with other processes (MPS or not).
                  "engines": ["%s%s" % (e.name, " (%s)" % e.reason if e.name == "xgmi" else
                                        "" if e.available else " (unavailable: %s)" % e.reason)
                              for e in bench.c.info.engines],
                  "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                  "frames": "mailbox" if bench.c._fast is not None and bench.c._fast.mailbox is not None else "socket"}
        print("torch %s on %s, %s; agent %s on %s; fast frames through the %s; engines: %s" % (
            header["torch"], header["device"], header["mode"], header["agent"], header["node"], header["frames"],
            ", ".join(header["engines"])), flush=True)
    except Exception as e:
        traceback.print_exc()
        results = [result(case_name(c, a), 0, error="setup: %s: %s" % (type(e).__name__, e)) for c in a.cases]
        bench = None
    if bench is not None:
        for c in a.cases:
            t0 = time.monotonic()
            try:
                r = getattr(bench, "case_" + c.replace("-", "_"))()
            except Exception as e:  # report and go on with the next case
                traceback.print_exc()
                r = result(case_name(c, a), 0, error="%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e)
                                                               else ""))
            finally:
                try:
                    bench.sync()
                    bench.torch.cuda.empty_cache()
                except Exception:
                    pass
            r["seconds"] = time.monotonic() - t0
            results.append(r)
            print("%s: %s" % (r["case"], "done" if not r["error"] else r["error"]), flush=True)
        bench.c.close()
    print()
    print(format_table(results), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header, cases=results), f, indent=2)
    return 0 if results and all(r.get("verified") for r in results) else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.busy_loop:
        return run_busy(a)
    return run_client(a) if a.client else drive(a)


if __name__ == "__main__":
    sys.exit(main())
