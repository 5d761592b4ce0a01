# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Two agents (old, new) serving one PyTorch process, their calls interleaved in random order: waited 4 KiB,
64 MiB and 1 GiB block copies on the same tensors, each call timed; per size the p50 / p99 of each agent and the
median of the paired differences (new - old), so a change of a few microseconds is seen beside the machine's
drift. Run from the repository root with the agents at /tmp/agent-old and /tmp/agent."""

import os, random, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, "client/python")
import torch
from fabricxfer.client import Client, to_layout

def start(binary):
    d = tempfile.mkdtemp()
    p = subprocess.Popen([binary, "standalone", "--socket-dir", d, "--pool-name", "kv"],
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
    sock = d + "/kv/agent.sock"
    for _ in range(600):
        if os.path.exists(sock) and os.path.exists(d + "/kv/agent.fd.sock"):
            break
        time.sleep(0.1)
    time.sleep(0.5)
    return p, Client(sock, timeout=60, name="abpair")

agents = {"old": start("/tmp/agent-old"), "new": start("/tmp/agent")}
rng = random.Random(7)
zero = torch.zeros(1, dtype=torch.int64)
x, y = (torch.empty(256 << 20, dtype=torch.uint8, device="cuda:0") for _ in range(2))
until = time.monotonic() + 0.5  # an idle H200 sits at 345 MHz: bring it to its clocks first
while time.monotonic() < until:
    y.copy_(x)
    torch.cuda.synchronize()
del x, y
for size, n in ((4096, 20000), (64 << 20, 2000), (1 << 30, 300)):
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda:0")
    dst = {k: torch.zeros_like(src) for k in agents}
    lay = {}
    for k, (_, c) in agents.items():
        lay[k] = (c.register_layout([c.register_tensor(src, gpu_index=0)], size),
                  to_layout(c.register_layout([c.register_tensor(dst[k], gpu_index=0)], size)))
    call = {k: (lambda c=agents[k][1], l=lay[k]: c.transfer_blocks("write", l[0], zero, l[1], zero, timeout=60))
            for k in agents}
    ref = torch.zeros_like(src)
    torch.cuda.synchronize()
    for _ in range(max(200, n // 10)):
        for k in agents:
            call[k]()
    t = {k: [] for k in agents}
    tt = []
    for i in range(n):
        order = ["old", "new"] if rng.random() < 0.5 else ["new", "old"]
        for k in order:
            t0 = time.perf_counter_ns()
            call[k]()
            t[k].append(time.perf_counter_ns() - t0)
        if i % 10 == 0:
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            ref.copy_(src)
            torch.cuda.synchronize()
            tt.append(time.perf_counter_ns() - t0)
    diffs = sorted(b - a for a, b in zip(t["old"], t["new"]))
    q = lambda v, f: sorted(v)[int(len(v) * f)] / 1e3
    faster = sum(1 for d in diffs if d < 0) / len(diffs)
    print("%8d B x %5d pairs: old p50 %8.1f p99 %8.1f us | new p50 %8.1f p99 %8.1f us | new-old paired median %+6.2f us"
          " (p25 %+6.2f, p75 %+6.2f), new faster in %.0f%% | torch copy_+sync p50 %.1f us | equal %s" % (
              size, n, q(t["old"], .5), q(t["old"], .99), q(t["new"], .5), q(t["new"], .99),
              diffs[len(diffs) // 2] / 1e3, diffs[len(diffs) // 4] / 1e3, diffs[3 * len(diffs) // 4] / 1e3,
              100 * faster, q(tt, .5), all(torch.equal(d, src) for d in dst.values())), flush=True)
    del src, dst, ref
for p, c in agents.values():
    p.terminate()
    p.wait(10)
