#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""GPU memory between two agents over loopback TCP, beside raw TCP between the same two hosts' processes.

    AGENT=/path/to/agent python3 client/python/bench/bench_tcp.py [--json out.json]

It brings up two agents on this machine as two nodes of one pool (hack/two-agents.sh: node-a and node-b,
static peers, the pool's certificates from `agent certs`), then runs two client processes, A on node-a's
socket and B on node-b's, which time, in one run:

  raw       1 GiB of host memory from A to B over --streams plain TCP connections on loopback (the ceiling:
            no TLS, no agent), received straight into B's buffer, in 4 MiB requests each acknowledged
  raw-tls   the same over TLS with the pool's certificates (what the agents' mTLS data path costs)
  host      1 GiB of host memory (memfd) from A's region to B's through the agents (the tcp engine, mTLS)
  gpu-1g    a 1 GiB CUDA tensor of A to one of B through the agents (staged through pinned host memory)
  blocks    15,360 blocks of 720 B between two pools of 262,144 blocks (one uint8 [262144, 720] tensor each)
  gpu-11m   the blocks' bytes (15,360 x 720 B) as one contiguous CUDA tensor: what gathering costs the blocks
  pair      gpu-11m and blocks alternating write by write (11m, blocks, blocks, 11m, ...), so that both see the
            same moments of the machine: each one's median, and the median of the ratios of the writes paired
  pair-read the same as reads: A reads node-b's 11 MB tensor and 15,360 blocks of node-b's published layout
            into its own, alternating, and checks them itself
  layers    the 32-layer layout: 32 layers x K/V = 64 tensors per side of [1024, 16384] uint8, a permutation of
            all 1,024 block ids in one call (1 GiB)
  cancel    A reads 1 GiB of B's GPU memory into its own and cancels it mid-way: A's tensor is compared right
            after Cancel returns, after Wait, and half a second later (nothing may change after Wait; what
            changed between Cancel and Wait is reported)
  kill      A writes 1 GiB to B's GPU memory and node-b's agent is killed (SIGKILL) mid-way: the transfer must
            fail within 2 s and A's region stay registered (A deregisters it afterwards). Always runs last.

Each figure is the median of --iters writes after --warmup; every destination byte is compared by B with what
it computes itself from the same seeds (torch generators on the same device). The table gives GB/s and the
ratios the acceptance asks for: gpu-1g / raw, blocks / gpu-1g, layers / gpu-1g, host / raw, and blocks / gpu-11m
(the blocks against the same bytes in one piece; from pair, the paired figure). The agents are
stopped at the end whatever happens (their logs stay in the state directory).
"""

import argparse
import json
import os
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MIB, GIB = 1 << 20, 1 << 30
CASES = ("raw", "raw-tls", "host", "gpu-1g", "blocks", "gpu-11m", "layers", "pair", "pair-read", "cancel", "kill")
# The paired cases' two halves, timed alternately: (node-b's setup, the name of the result), contiguous first; and
# the name of their ratio.
PAIRS = {"pair": ((("gpu-11m", "gpu-11m paired"), ("blocks", "blocks paired")), "blocks / gpu-11m paired"),
         "pair-read": ((("gpu-11m-src", "gpu-11m read paired"), ("blocks-src", "blocks read paired")),
                       "blocks / gpu-11m read paired")}
BLOCKS_BYTES = 15360 * 720
RAW_HDR = struct.Struct(">QQ")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__)
    p.add_argument("--agent", default=os.environ.get("AGENT", "bin/agent"), help="agent binary (default $AGENT or bin/agent)")
    p.add_argument("--state-dir", default="/tmp/fabricxfer-bench-tcp", help="the two agents' state (sockets, logs)")
    p.add_argument("--port-base", type=int, default=17570, help="first of the agents' loopback ports")
    p.add_argument("--agent-arg", action="append", default=[], help="one more flag for both agents (repeatable)")
    p.add_argument("--trace-dir", help="each agent writes an execution trace here (a.trace, b.trace; hack/trace-tcp.py)")
    p.add_argument("--profile-dir", help="each agent writes a CPU profile of its run here (a.pprof, b.pprof)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of %s" % ",".join(CASES))
    p.add_argument("--device", type=int, default=0, help="CUDA device of both clients (default 0)")
    p.add_argument("--iters", type=int, default=5, help="timed writes per case (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed writes first (default 2)")
    p.add_argument("--streams", type=int, default=4, help="raw TCP connections (default 4, as the tcp engine's)")
    p.add_argument("--call-timeout", type=float, default=120.0, help="seconds one agent call may take")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--role", choices=("a", "b"), help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--peer-socket", help=argparse.SUPPRESS)
    p.add_argument("--node-b", default="node-b", help=argparse.SUPPRESS)
    p.add_argument("--tls-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    if "kill" in a.cases:  # node-b's agent is gone afterwards
        a.cases = [c for c in a.cases if c != "kill"] + ["kill"]
    bad = [c for c in a.cases if c not in CASES]
    if bad:
        p.error("unknown cases %s (known: %s)" % (",".join(bad), ",".join(CASES)))
    if a.iters < 1 or a.warmup < 0 or a.streams < 1:
        p.error("--iters and --streams must be positive, --warmup not negative")
    return a


# ---- results (pure: tested without a GPU) ----

def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9 if seconds else None


def ratios(results):
    """The acceptance ratios from the cases' GB/s: gpu-1g / raw, blocks / gpu-1g, layers / gpu-1g, host / raw."""
    by = {r["case"]: r.get("gbps") for r in results if r.get("verified")}
    out = {}
    for name, num, den in (("gpu-1g / raw", "gpu-1g", "raw"), ("blocks / gpu-1g", "blocks", "gpu-1g"),
                           ("layers / gpu-1g", "layers", "gpu-1g"), ("host / raw", "host", "raw"),
                           ("gpu-1g / raw-tls", "gpu-1g", "raw-tls"), ("gpu-1g / host", "gpu-1g", "host"),
                           ("blocks / gpu-11m", "blocks", "gpu-11m")):
        if by.get(num) and by.get(den):
            out[name] = by[num] / by[den]
    for ((_, contiguous), (_, blocks)), name in PAIRS.values():
        paired = [r for r in results if r.get("case") == blocks and r.get("verified") and r.get("pair_ratio")]
        halves = [r for r in results if r.get("case") == contiguous]
        if paired and halves and all(r.get("verified") for r in halves):
            out[name] = paired[0]["pair_ratio"]
    return out


def pair_ratio(contiguous, blocks):
    """The median over paired writes of contiguous time / blocks time (above 1: the blocks were faster), and the
    lowest and highest of them."""
    rs = sorted(c / b for c, b in zip(contiguous, blocks))
    return statistics.median(rs), rs[0], rs[-1]


def format_table(results):
    head = ("case", "bytes", "median ms", "GB/s", "check")
    rows = [(r["case"], str(r.get("bytes", 0)), "%.2f" % (r["seconds"] * 1e3) if r.get("seconds") else "-",
             "%.2f" % r["gbps"] if r.get("gbps") else "-",
             "ok" if r.get("verified") else ("ERROR" if r.get("error") else "DIFFERS")) for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(head), line(["-" * w for w in widths])] + [line(r) for r in rows]
    for name, v in ratios(results).items():
        out.append("%-16s %.2f" % (name, v))
    out += ["%s: %s" % (r["case"], r["error"]) for r in results if r.get("error")]
    out += ["%s: %s" % (r["case"], r["note"]) for r in results if r.get("note")]
    return "\n".join(out)


# ---- the driver: two agents up, client A (which starts B), agents down ----

def drive(a) -> int:
    agent = a.agent if os.path.isabs(a.agent) else os.path.join(ROOT, a.agent) if not os.path.exists(a.agent) else a.agent
    if not (os.path.isfile(agent) and os.access(agent, os.X_OK)):
        raise SystemExit("agent binary %s not found: pass --agent or set AGENT" % a.agent)
    env = dict(os.environ, AGENT=os.path.abspath(agent), TWO_AGENTS_DIR=a.state_dir, PORT_BASE=str(a.port_base),
               AGENT_ARGS=" ".join(a.agent_arg))
    if a.trace_dir:
        env["TRACE_DIR"] = os.path.abspath(a.trace_dir)
    if a.profile_dir:
        env["PROFILE_DIR"] = os.path.abspath(a.profile_dir)
    script = os.path.join(ROOT, "hack", "two-agents.sh")
    up = subprocess.run([script, "up"], env=env)
    try:
        if up.returncode != 0:
            print("bench_tcp: the agents did not come up", flush=True)
            return 1
        cmd = [sys.executable, os.path.abspath(__file__), "--role", "a", "--socket",
               os.path.join(a.state_dir, "a", "kv", "agent.sock"), "--peer-socket",
               os.path.join(a.state_dir, "b", "kv", "agent.sock"), "--cases", ",".join(a.cases), "--device",
               str(a.device), "--iters", str(a.iters), "--warmup", str(a.warmup), "--streams", str(a.streams),
               "--call-timeout", str(a.call_timeout), "--tls-dir", os.path.join(a.state_dir, "tls"),
               "--state-dir", a.state_dir]
        if a.json:
            cmd += ["--json", os.path.abspath(a.json)]
        return subprocess.call(cmd, env=client_env())
    finally:
        subprocess.run([script, "down"], env=env)


def client_env():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    src = os.path.dirname(HERE)  # client/python, for a fabricxfer that is not installed
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ---- what both clients compute the same way ----

SEED = {"raw": 11, "raw-tls": 11, "host": 12, "gpu-1g": 13, "blocks": 14, "layers": 15, "cancel": 16, "kill": 17,
        "gpu-11m": 18, "gpu-11m-src": 19, "blocks-src": 20}


def host_bytes(torch, n, seed, out=None):
    """n random bytes from a CPU generator (into out, a uint8 tensor, when given)."""
    g = torch.Generator().manual_seed(seed)
    t = out if out is not None else torch.empty(n, dtype=torch.uint8)
    t.random_(0, 256, generator=g)
    return t


def gpu_bytes(torch, dev, shape, seed):
    g = torch.Generator(device=dev).manual_seed(seed)
    return torch.randint(0, 256, shape, dtype=torch.uint8, device=dev, generator=g)


def block_ids(torch, n, k, seed):
    """k distinct source and k distinct destination block ids out of n."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=g)[:k].contiguous(), torch.randperm(n, generator=g)[:k].contiguous()


def layer_ids(torch, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(1024, generator=g), torch.randperm(1024, generator=g)


# ---- client B: destinations on node-b, checks, the raw TCP receiver ----

class RoleB:
    def __init__(self, a):
        import torch

        from fabricxfer.client import Client

        self.a, self.torch = a, torch
        self.dev = torch.device("cuda", a.device)
        if torch.cuda.is_available():  # the host cases run without a GPU
            torch.cuda.set_device(self.dev)
        self.c = Client(a.socket, timeout=a.call_timeout, name="bench-tcp-b")
        self.held = {}
        self.raw = None

    def setup(self, case):
        torch, c = self.torch, self.c
        from fabricxfer.client import shared_memory
        if case in ("raw", "raw-tls"):
            self.raw = bytearray(GIB)
            return {"port": self.serve_raw(case == "raw-tls")}
        # held[case]: the destination (what check reads), its regions, its layout, what to close.
        if case == "host":
            fd, mm = shared_memory("bench-b", GIB)
            r = c.register_host(fd, 0, GIB, segment="host-1g")
            self.held[case] = {"dst": mm, "regions": [r], "close": [mm.close, lambda: os.close(fd)]}
        elif case in ("gpu-1g", "kill", "gpu-11m"):
            t = torch.zeros(BLOCKS_BYTES if case == "gpu-11m" else GIB, dtype=torch.uint8, device=self.dev)
            r = c.register_tensor(t, segment=case, gpu_index=self.a.device)
            self.held[case] = {"dst": t, "regions": [r]}
        elif case == "cancel":
            t = gpu_bytes(torch, self.dev, (GIB,), SEED[case])
            r = c.register_tensor(t, segment="cancel-src", gpu_index=self.a.device)
            self.held[case] = {"dst": t, "regions": [r]}
        elif case == "gpu-11m-src":
            t = gpu_bytes(torch, self.dev, (BLOCKS_BYTES,), SEED[case])
            r = c.register_tensor(t, segment=case, gpu_index=self.a.device)
            self.held[case] = {"dst": t, "regions": [r]}
        elif case == "blocks-src":
            t = gpu_bytes(torch, self.dev, (262144, 720), SEED[case])
            r = c.register_tensor(t, gpu_index=self.a.device)
            lay = c.register_layout([r], 720, segment="kv-blocks-src")
            self.held[case] = {"dst": t, "regions": [r], "layout": lay}
        elif case == "blocks":
            t = torch.zeros(262144, 720, dtype=torch.uint8, device=self.dev)
            r = c.register_tensor(t, gpu_index=self.a.device)
            lay = c.register_layout([r], 720, segment="kv-blocks")
            self.held[case] = {"dst": t, "regions": [r], "layout": lay}
        elif case == "layers":
            ts = [torch.zeros(1024, 16384, dtype=torch.uint8, device=self.dev) for _ in range(64)]
            rs = [c.register_tensor(t, gpu_index=self.a.device) for t in ts]
            lay = c.register_layout(rs, 16384, segment="kv-layers")
            self.held[case] = {"dst": ts, "regions": rs, "layout": lay}
        sync(torch, self.dev)
        return {}

    def serve_raw(self, tls):
        ln = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ln.bind(("127.0.0.1", 0))
        ln.listen(64)
        view = memoryview(self.raw)
        ctx = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(os.path.join(self.a.tls_dir, "tls.crt"), os.path.join(self.a.tls_dir, "tls.key"))

        def conn(s):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * MIB)
            if ctx is not None:
                s = ctx.wrap_socket(s, server_side=True)
            with s:
                while True:
                    hdr = bytearray(RAW_HDR.size)
                    if not recv_exactly(s, memoryview(hdr)):
                        return
                    off, n = RAW_HDR.unpack(hdr)
                    if off + n > len(view) or not recv_exactly(s, view[off:off + n]):
                        return
                    s.sendall(b"k")

        def accept():
            while True:
                s, _ = ln.accept()
                threading.Thread(target=conn, args=(s,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return ln.getsockname()[1]

    def check(self, case):
        torch = self.torch
        sync(torch, self.dev)
        if case in ("raw", "raw-tls"):
            return bool(torch.equal(torch.frombuffer(self.raw, dtype=torch.uint8), host_bytes(torch, GIB, SEED[case])))
        if case == "host":
            got = torch.frombuffer(self.held[case]["dst"], dtype=torch.uint8)
            ok = bool(torch.equal(got, host_bytes(torch, GIB, SEED[case])))
            del got  # the mapping closes at release
            return ok
        if case in ("gpu-1g", "gpu-11m"):
            n = GIB if case == "gpu-1g" else BLOCKS_BYTES
            return bool(torch.equal(self.held[case]["dst"], gpu_bytes(torch, self.dev, (n,), SEED[case])))
        if case == "blocks":
            src = gpu_bytes(torch, self.dev, (262144, 720), SEED[case])
            s, d = block_ids(torch, 262144, 15360, SEED[case])
            want = torch.zeros_like(src)
            want[d.to(self.dev)] = src[s.to(self.dev)]
            return bool(torch.equal(self.held[case]["dst"], want))
        if case == "layers":
            s, d = layer_ids(torch, SEED[case])
            s, d = s.to(self.dev), d.to(self.dev)
            for k, t in enumerate(self.held[case]["dst"]):
                src = gpu_bytes(torch, self.dev, (1024, 16384), SEED[case] * 100 + k)
                want = torch.zeros_like(src)
                want[d] = src[s]
                if not torch.equal(t, want):
                    return False
            return True
        return False

    def release(self, case):
        held = self.held.pop(case, None)
        if case in ("raw", "raw-tls"):
            self.raw = None
        if held is None:
            return {}
        if held.get("layout") is not None:
            self.c.deregister_layout(held["layout"])
        for r in held["regions"]:
            self.c.deregister(r)
        held.pop("dst")
        for close in held.get("close", []):
            close()
        if self.torch.cuda.is_available():
            self.torch.cuda.empty_cache()
        return {}

    def serve(self):
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            try:
                if req["cmd"] == "quit":
                    break
                out = getattr(self, req["cmd"])(req["case"])
                resp = {"ok": True, "result": out}
            except Exception as e:
                traceback.print_exc()
                resp = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
            print(json.dumps(resp), flush=True)
        self.c.close()
        return 0


def sync(torch, dev):
    if torch.cuda.is_available():
        torch.cuda.synchronize(dev)


def recv_exactly(s, view):
    while len(view):
        n = s.recv_into(view)
        if n == 0:
            return False
        view = view[n:]
    return True


# ---- client A: sources on node-a, the timing ----

class RoleA:
    def __init__(self, a):
        import torch

        from fabricxfer.client import Client

        self.a, self.torch = a, torch
        self.dev = torch.device("cuda", a.device)
        if torch.cuda.is_available():  # the host cases run without a GPU
            torch.cuda.set_device(self.dev)
        self.c = Client(a.socket, timeout=a.call_timeout, name="bench-tcp-a")
        self.b = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--role", "b", "--socket", a.peer_socket,
                                   "--device", str(a.device), "--call-timeout", str(a.call_timeout),
                                   "--tls-dir", a.tls_dir or ""],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=client_env(), text=True)
        if json.loads(self.b.stdout.readline() or "{}").get("ready") is not True:
            raise RuntimeError("client B did not start (its error is above)")

    def ask(self, cmd, case):
        self.b.stdin.write(json.dumps({"cmd": cmd, "case": case}) + "\n")
        self.b.stdin.flush()
        resp = json.loads(self.b.stdout.readline() or '{"ok": false, "error": "client B exited"}')
        if not resp["ok"]:
            raise RuntimeError("client B, %s %s: %s" % (cmd, case, resp["error"]))
        return resp["result"]

    def close(self):
        try:
            self.b.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.b.stdin.flush()
            self.b.wait(30)
        except Exception:
            self.b.kill()
        self.c.close()

    def timed(self, fn):
        for i in range(self.a.warmup):
            fn(i)
        times = []
        for i in range(self.a.iters):
            t0 = time.perf_counter()
            fn(i)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def timed_pair(self, first, second):
        """Times of first and second, alternating first-second, second-first, ... after the warm-up of both."""
        for i in range(self.a.warmup):
            first(i)
            second(i)
        times = ([], [])
        for i in range(self.a.iters):
            for k in ((0, 1) if i % 2 == 0 else (1, 0)):
                fn = first if k == 0 else second
                t0 = time.perf_counter()
                fn(i)
                times[k].append(time.perf_counter() - t0)
        return times

    def run_pair(self, case):
        """A paired case: both halves set up on node-b, their transfers alternating, both checked."""
        ((c11, name11), (cb, nameb)), _ = PAIRS[case]
        halves = []
        try:
            for half in (c11, cb):
                self.ask("setup", half)
                halves.append(getattr(self, "mover_" + half.replace("-", "_"))())
            (w11, n11, _, check11), (wb, nb, _, checkb) = halves
            t11, tb = self.timed_pair(w11, wb)
            ratio, low, high = pair_ratio(t11, tb)
            out = []
            for name, check, ts, n in ((name11, check11, t11, n11), (nameb, checkb, tb, nb)):
                sec = statistics.median(ts)
                out.append({"case": name, "bytes": n, "seconds": sec, "gbps": gbps(n, sec), "verified": check(),
                            "error": "", "times_ms": [round(t * 1e3, 3) for t in ts]})
            out[1]["pair_ratio"] = ratio
            out[1]["note"] = "gpu-11m / blocks time over %d paired transfers: median %.2f, lowest %.2f, highest %.2f" % (
                len(tb), ratio, low, high)
            return out
        finally:
            sync(self.torch, self.dev)
            for _, _, release, _ in halves:
                release()
            for half in (c11, cb):
                try:
                    self.ask("release", half)
                except Exception:
                    traceback.print_exc()

    def run(self, case):
        if case in PAIRS:
            return self.run_pair(case)
        torch = self.torch
        info = self.ask("setup", case)
        try:
            if case in ("cancel", "kill"):  # checked here: facts of node-a's side
                return dict(getattr(self, "case_" + case)(), case=case, error="")
            seconds, nbytes = getattr(self, "case_" + case.replace("-", "_"))(info)
            return {"case": case, "bytes": nbytes, "seconds": seconds, "gbps": gbps(nbytes, seconds),
                    "verified": self.ask("check", case), "error": ""}
        finally:
            if case != "kill":
                try:
                    sync(torch, self.dev)
                    self.ask("release", case)
                except Exception:
                    traceback.print_exc()

    def case_cancel(self):
        from fabricxfer.agent.v1 import agent_pb2 as pb
        from fabricxfer.client import Item, TransferFailed, to_segment
        torch = self.torch
        dst = torch.zeros(GIB, dtype=torch.uint8, device=self.dev)
        sync(torch, self.dev)
        r = self.c.register_tensor(dst, gpu_index=self.a.device)
        try:
            tid = self.c.transfer("read", [Item(r, to_segment(self.a.node_b, "cancel-src"), GIB)], wait=False)
            time.sleep(0.03)
            t0 = time.perf_counter()
            self.c._call(self.c.stub.Cancel, pb.CancelRequest(transfer_id=tid))
            cancel_s = time.perf_counter() - t0
            at_cancel = dst.clone()
            sync(torch, self.dev)
            try:
                st = self.c.wait(tid, timeout=30)
                outcome = ("succeeded before the cancellation took effect"
                           if st.state == pb.TRANSFER_STATE_SUCCEEDED else "still pending 30 s after Cancel")
            except TransferFailed as e:
                outcome = str(e).splitlines()[0]
            at_wait = dst.clone()
            time.sleep(0.5)
            later = dst.clone()
            sync(torch, self.dev)
            landed = int((at_wait != 0).sum().item())
            changed_after_cancel = not torch.equal(at_cancel, at_wait)
            changed_after_wait = not torch.equal(at_wait, later)
            note = ("cancel call %.1f ms; %d of %d bytes landed; changed between Cancel and Wait: %s; "
                    "after Wait: %s; %s" % (cancel_s * 1e3, landed, GIB, changed_after_cancel, changed_after_wait,
                                            outcome))
            print("cancel: " + note, flush=True)
            return {"bytes": landed, "verified": not changed_after_wait and "CANCEL" in outcome.upper(),
                    "note": note, "changed_after_cancel": changed_after_cancel,
                    "changed_after_wait": changed_after_wait}
        finally:
            self.c.deregister(r)

    def case_kill(self):
        import signal as sig
        from fabricxfer.client import Item, TransferFailed, to_segment
        torch = self.torch
        src = gpu_bytes(torch, self.dev, (GIB,), SEED["kill"])
        sync(torch, self.dev)
        r = self.c.register_tensor(src, gpu_index=self.a.device)
        tid = self.c.transfer("write", [Item(r, to_segment(self.a.node_b, "kill"), GIB)], wait=False)
        time.sleep(0.03)
        with open(os.path.join(self.a.state_dir, "b.pid")) as f:
            os.kill(int(f.read().strip()), sig.SIGKILL)
        t0 = time.perf_counter()
        try:
            st = self.c.wait(tid, timeout=30)
            outcome, failed = ("succeeded: it finished before the kill"
                               if st.state == 2 else "still pending 30 s after the kill"), False
        except TransferFailed as e:
            outcome, failed = str(e).splitlines()[0], True
        took = time.perf_counter() - t0
        registered = True
        try:
            self.c.deregister(r)  # it is still registered, or this fails
        except Exception as e:
            registered, outcome = False, outcome + "; deregistering afterwards: %s" % e
        note = "failed %.3f s after the kill (%s); region still registered: %s" % (took, outcome, registered)
        print("kill: " + note, flush=True)
        return {"bytes": GIB, "seconds": took, "verified": failed and took <= 2.0 and registered, "note": note}

    def case_raw_tls(self, info):
        return self.case_raw(info, tls=True)

    def case_raw(self, info, tls=False):
        torch = self.torch
        raw = bytearray(GIB)
        host_bytes(torch, GIB, SEED["raw"], out=torch.frombuffer(raw, dtype=torch.uint8))
        buf = memoryview(raw)
        n, k = GIB, self.a.streams
        socks = []
        for _ in range(k):
            s = socket.create_connection(("127.0.0.1", info["port"]))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 * MIB)
            if tls:
                ctx = ssl.create_default_context(cafile=os.path.join(self.a.tls_dir, "ca.crt"))
                ctx.check_hostname = False  # the pool's name is checked by the agents; here only the cost counts
                s = ctx.wrap_socket(s)
            socks.append(s)
        chunk = 4 * MIB  # the tcp engine's chunk: each stream sends its share in requests of this size

        def stream(j, errs):
            try:
                s = socks[j]
                for off in range(j * chunk, n, k * chunk):
                    ln = min(chunk, n - off)
                    s.sendall(RAW_HDR.pack(off, ln))
                    s.sendall(buf[off:off + ln])
                for off in range(j * chunk, n, k * chunk):
                    if s.recv(1) != b"k":
                        raise RuntimeError("raw receiver closed")
            except Exception as e:
                errs.append(e)

        def once(_):
            errs = []
            ts = [threading.Thread(target=stream, args=(j, errs)) for j in range(k)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if errs:
                raise errs[0]

        try:
            return self.timed(once), n
        finally:
            for s in socks:
                s.close()

    def case_host(self, info):
        from fabricxfer.client import shared_memory, to_segment
        torch = self.torch
        fd, mm = shared_memory("bench-a", GIB)
        host_bytes(torch, GIB, SEED["host"], out=torch.frombuffer(mm, dtype=torch.uint8))
        r = self.c.register_host(fd, 0, GIB, segment="")
        try:
            remote = to_segment(self.a.node_b, "host-1g")
            return self.timed(lambda i: self.c.write(r, 0, remote, 0, GIB)), GIB
        finally:
            self.c.deregister(r)
            os.close(fd)

    def mover_gpu(self, case, n):
        """(write(i), bytes, release, check): a contiguous tensor of node-a written over node-b's segment named
        case; check asks node-b whether it holds the bytes."""
        from fabricxfer.client import to_segment
        torch = self.torch
        src = gpu_bytes(torch, self.dev, (n,), SEED[case])
        sync(torch, self.dev)
        r = self.c.register_tensor(src, gpu_index=self.a.device)
        remote = to_segment(self.a.node_b, case)
        return (lambda i: self.c.write(r, 0, remote, 0, n)), n, (lambda: self.c.deregister(r)), \
            (lambda: self.ask("check", case))

    def mover_gpu_11m(self):
        return self.mover_gpu("gpu-11m", BLOCKS_BYTES)

    def mover_blocks(self):
        """The 15,360 blocks of node-a's pool written into node-b's published layout."""
        from fabricxfer.client import to_layout_segment
        torch = self.torch
        src = gpu_bytes(torch, self.dev, (262144, 720), SEED["blocks"])
        sync(torch, self.dev)
        s, d = block_ids(torch, 262144, 15360, SEED["blocks"])
        r = self.c.register_tensor(src, gpu_index=self.a.device)
        lay = self.c.register_layout([r], 720)
        remote = to_layout_segment(self.a.node_b, "kv-blocks")

        def release():
            self.c.deregister_layout(lay)
            self.c.deregister(r)

        return (lambda i: self.c.transfer_blocks("write", lay, s, remote, d, timeout=self.a.call_timeout)), \
            15360 * 720, release, (lambda: self.ask("check", "blocks"))

    def mover_gpu_11m_src(self):
        """A read of node-b's 11 MB tensor into one of node-a, checked here."""
        from fabricxfer.client import to_segment
        torch = self.torch
        dst = torch.zeros(BLOCKS_BYTES, dtype=torch.uint8, device=self.dev)
        r = self.c.register_tensor(dst, gpu_index=self.a.device)
        remote = to_segment(self.a.node_b, "gpu-11m-src")
        check = lambda: bool(torch.equal(dst, gpu_bytes(torch, self.dev, (BLOCKS_BYTES,), SEED["gpu-11m-src"])))  # noqa: E731
        return (lambda i: self.c.read(r, 0, remote, 0, BLOCKS_BYTES)), BLOCKS_BYTES, (lambda: self.c.deregister(r)), check

    def mover_blocks_src(self):
        """A read of 15,360 blocks of node-b's published layout into node-a's pool, checked here."""
        from fabricxfer.client import to_layout_segment
        torch = self.torch
        dst = torch.zeros(262144, 720, dtype=torch.uint8, device=self.dev)
        s, d = block_ids(torch, 262144, 15360, SEED["blocks-src"])
        r = self.c.register_tensor(dst, gpu_index=self.a.device)
        lay = self.c.register_layout([r], 720)
        remote = to_layout_segment(self.a.node_b, "kv-blocks-src")

        def check():
            sync(torch, self.dev)
            src = gpu_bytes(torch, self.dev, (262144, 720), SEED["blocks-src"])
            want = torch.zeros_like(src)
            want[d.to(self.dev)] = src[s.to(self.dev)]
            return bool(torch.equal(dst, want))

        def release():
            self.c.deregister_layout(lay)
            self.c.deregister(r)

        return (lambda i: self.c.transfer_blocks("read", lay, d, remote, s, timeout=self.a.call_timeout)), \
            15360 * 720, release, check

    # A mover is (move(i), bytes, release, check): one case's transfer from node-a's side, its size, what undoes
    # its registrations, and what says whether the destination holds the bytes.
    def timed_mover(self, mover):
        move, n, release, _ = mover
        try:
            return self.timed(move), n
        finally:
            release()

    def case_gpu_1g(self, info):
        return self.timed_mover(self.mover_gpu("gpu-1g", GIB))

    def case_gpu_11m(self, info):
        return self.timed_mover(self.mover_gpu_11m())

    def case_blocks(self, info):
        return self.timed_mover(self.mover_blocks())

    def case_layers(self, info):
        from fabricxfer.client import to_layout_segment
        torch = self.torch
        srcs = [gpu_bytes(torch, self.dev, (1024, 16384), SEED["layers"] * 100 + k) for k in range(64)]
        sync(torch, self.dev)
        s, d = layer_ids(torch, SEED["layers"])
        rs = [self.c.register_tensor(t, gpu_index=self.a.device) for t in srcs]
        lay = self.c.register_layout(rs, 16384)
        try:
            remote = to_layout_segment(self.a.node_b, "kv-layers")
            t = self.timed(lambda i: self.c.transfer_blocks("write", lay, s, remote, d, timeout=self.a.call_timeout))
            return t, 64 * 1024 * 16384
        finally:
            self.c.deregister_layout(lay)
            for r in rs:
                self.c.deregister(r)


def run_a(a) -> int:
    results, header = [], {}
    bench = None
    try:
        bench = RoleA(a)
        torch = bench.torch
        header = {"torch": torch.__version__,
                  "device": torch.cuda.get_device_name(bench.dev) if torch.cuda.is_available() else "no GPU",
                  "agent": bench.c.info.agent_version, "node": bench.c.info.node_name,
                  "engines": ["%s: %s%s" % (e.name, "" if e.available else "unavailable: ", e.reason)
                              for e in bench.c.info.engines]}
        print("torch %s on %s; agent %s; %s" % (header["torch"], header["device"], header["agent"],
                                                "; ".join(header["engines"])), flush=True)
        for case in a.cases:
            try:
                rs = bench.run(case)
            except Exception as e:
                traceback.print_exc()
                rs = {"case": case, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else "")}
            for r in rs if isinstance(rs, list) else [rs]:
                print("%s: %s" % (r["case"], r.get("error") or "%.2f GB/s" % (r.get("gbps") or 0)), flush=True)
                results.append(r)
    except Exception as e:
        traceback.print_exc()
        results.append({"case": "setup", "error": "%s: %s" % (type(e).__name__, e)})
    finally:
        if bench is not None:
            bench.close()
    print()
    print(format_table(results), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(header, cases=results, ratios=ratios(results)), f, indent=2)
    return 0 if results and all(r.get("verified") for r in results) else 1


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.role == "a":
        return run_a(a)
    if a.role == "b":
        return RoleB(a).serve()
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())
