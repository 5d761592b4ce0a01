# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Why a waited 1 GiB call's agent-side steps run slower than a 64 MiB call's: a traced agent (--trace) serves,
in this order, 60 back-to-back waited 1 GiB calls (M1), 60 with 1 ms idle between them (M2), 60 pairs of a
1 GiB then a 64 MiB call (M3), 60 back-to-back 64 MiB calls (M4) and 60 unwaited 1 GiB calls each followed by
its wait (M5). python3 THIS AGENT TRACE_FILE."""

import os, sys, time, subprocess, tempfile
sys.path.insert(0, "client/python")
import numpy as np, torch
from fabricxfer.client import Client, to_layout

d = tempfile.mkdtemp()
agent = subprocess.Popen([sys.argv[1], "standalone", "--socket-dir", d, "--pool-name", "kv", "--trace", sys.argv[2]],
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
sock = d + "/kv/agent.sock"
for _ in range(600):
    if os.path.exists(sock): break
    time.sleep(0.1)
time.sleep(0.5)
c = Client(sock, timeout=60, name="bigwait")
dev = torch.device("cuda:0")
zero = np.array([0], dtype=np.int64)

def pair(size):
    src = torch.randint(0, 255, (1, size), dtype=torch.uint8, device=dev)
    dst = torch.zeros_like(src)
    ls = c.register_layout([c.register_tensor(src, gpu_index=0)], size)
    ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], size)
    return src, dst, ls, to_layout(ld)

g = pair(1 << 30)
m = pair(64 << 20)
call = lambda p: c.transfer_blocks("write", p[2], zero, p[3], zero, timeout=60)

def timed(name, fn, n):
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(i); ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    print("%-44s client p50 %8.1f us  p90 %8.1f us" % (name, ts[n // 2] / 1e3, ts[int(n * .9)] / 1e3), flush=True)

for _ in range(10):
    call(g); call(m)
timed("M1 1 GiB back to back", lambda i: call(g), 60)
def idle(i):
    t = time.perf_counter() + 1e-3
    while time.perf_counter() < t: pass
    call(g)
timed("M2 1 GiB after 1 ms idle (idle included)", idle, 60)
timed("M3 1 GiB then 64 MiB (the pair)", lambda i: (call(g), call(m)), 60)
timed("M4 64 MiB back to back", lambda i: call(m), 60)
timed("M5 1 GiB unwaited, then wait", lambda i: c.wait(c.transfer_blocks("write", g[2], zero, g[3], zero, timeout=60, wait=False)), 60)
torch.cuda.synchronize()
print("bytes", "ok" if torch.equal(g[0], g[1]) and torch.equal(m[0], m[1]) else "DIFFER")
c.close()
agent.terminate(); agent.wait(20)
