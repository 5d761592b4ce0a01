#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
import sys, time, statistics
sys.path.insert(0, "client/python")
import numpy as np
from fabricxfer.client import Client, shared_memory, to_layout
def setup(sock):
    c = Client(sock, timeout=10)
    size = 256 * 4096
    fds = [shared_memory(n, size)[0] for n in ("a", "b")]
    regs = [c.register_host(fd, 0, size) for fd in fds]
    ls, ld = c.register_layout([regs[0]], 4096), c.register_layout([regs[1]], 4096)
    return c, ls, to_layout(ld)
sides = {v: setup("/tmp/fxab/%s/kv/agent.sock" % v) for v in ("old", "new")}
ids = [np.array([i], dtype=np.int64) for i in range(256)]
res = {"old": [], "new": []}
for rnd in range(12):
    for v in ("old", "new") if rnd % 2 == 0 else ("new", "old"):
        c, ls, remote = sides[v]
        ts = []
        for i in range(6000):
            k = ids[i % 256]
            t0 = time.perf_counter_ns()
            c.transfer_blocks("write", ls, k, remote, k, timeout=30.0)
            ts.append(time.perf_counter_ns() - t0)
        res[v].append(statistics.median(ts[1000:]) / 1e3)
for v in res:
    print(v, " ".join("%.2f" % x for x in res[v]), "median %.2f" % statistics.median(res[v]))
print("paired new/old:", " ".join("%.3f" % (n / o) for n, o in zip(res["new"], res["old"])))
