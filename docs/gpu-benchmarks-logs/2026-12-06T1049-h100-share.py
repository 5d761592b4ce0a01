# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The Python client's own work around a waited one-block call with torch ids (the agent's reply replayed: no
# agent time), then the same calls through the agent for real; argv: socket, client root.
import sys, time, timeit, statistics
sys.path.insert(0, sys.argv[2])
import numpy as np
import torch
from fabricxfer.client import Client, shared_memory, to_layout
c = Client(sys.argv[1])
def lay():
    fd, buf = shared_memory("cs", 256 * 4096)
    return c.register_layout([c.register_host(fd, 0, 256 * 4096)], 4096)
x, y = lay(), lay()
rem = to_layout(y)
ti = torch.zeros(1, dtype=torch.int64)
ni = np.zeros(1, dtype=np.int64)
p = c.prepare_blocks("write", x, ti, rem, ti, timeout=5.0)
real = {"plain torch": lambda: c.transfer_blocks("write", x, ti, rem, ti, timeout=5.0),
        "plain numpy": lambda: c.transfer_blocks("write", x, ni, rem, ni, timeout=5.0),
        "prepared": p.run}
for k, fn in real.items():
    for _ in range(3000): fn()
    ts = []
    for _ in range(20000):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    ts.sort()
    print("%-6s real %-12s p50 %.2f us p10 %.2f" % (sys.argv[3], k, ts[len(ts) // 2] * 1e6, ts[len(ts) // 10] * 1e6), flush=True)
raws, orig = [], c._fast_raw
def rec(*a, **k):
    r = orig(*a, **k); raws.append(bytes(r)); return r
c._fast_raw = rec
c.transfer_blocks("write", x, ti, rem, ti, timeout=5.0)
raw = raws[-1]
c._fast_raw = lambda parts, timeout, build=None, mailbox=True: raw
n = 100000
for k, fn in real.items():
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print("%-6s replayed %-12s %.3f us" % (sys.argv[3], k, best), flush=True)
