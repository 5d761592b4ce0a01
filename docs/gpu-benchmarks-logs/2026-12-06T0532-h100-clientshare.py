# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Where a plain transfer_blocks call's client time goes with torch ids, on the machine with torch: pieces of the
# id packing timed alone, then waited one-block host calls (plain with numpy ids, plain with torch ids, prepared)
# through a running agent, alternated in rounds.
import os, sys, time, timeit
sys.path.insert(0, "client/python")
import numpy as np
import torch
from fabricxfer import blocks
from fabricxfer.client import Client, shared_memory, to_layout, status_first

t = torch.zeros(1, dtype=torch.int64)
n = 200000
def tm(name, fn):
    best = min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6
    print("%-28s %.3f us" % (name, best))
tm("t.dtype", lambda: t.dtype)
tm("t.is_cpu", lambda: t.is_cpu)
tm("t.numel()", lambda: t.numel())
tm("t.tolist()", lambda: t.tolist())
tm("t.item()", lambda: t.item())
tm("t.data_ptr()", lambda: t.data_ptr())
tm("t.numpy()", lambda: t.numpy())
tm("t.numpy().tobytes()", lambda: t.numpy().tobytes())
tm("type(t)", lambda: type(t))
tm("blocks._from_torch(t)", lambda: blocks._from_torch(t, None))
tm("blocks.short_ids(t)", lambda: blocks.short_ids(t))
a = np.zeros(1, dtype=np.int64)
tm("blocks.short_ids(numpy)", lambda: blocks.short_ids(a))

sock = sys.argv[1]
c = Client(sock)
def lay():
    fd, buf = shared_memory("cs", 256 * 4096)
    r = c.register_host(fd, 0, 256 * 4096)
    return c.register_layout([r], 4096)
x, y = lay(), lay()
rem = to_layout(y)
ti, tr = torch.tensor([3], dtype=torch.int64), torch.tensor([9], dtype=torch.int64)
ni, nr = np.array([3], dtype=np.int64), np.array([9], dtype=np.int64)
p = c.prepare_blocks("write", x, ti, rem, tr)
calls = {"plain numpy ids": lambda: c.transfer_blocks("write", x, ni, rem, nr),
         "plain torch ids": lambda: c.transfer_blocks("write", x, ti, rem, tr),
         "prepared": p.run}
res = {k: [] for k in calls}
for rnd in range(5):
    for k, fn in calls.items():
        for _ in range(500): fn()
        ts = []
        for _ in range(5000):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        ts.sort()
        res[k].append(ts[len(ts) // 2] * 1e6)
for k, v in res.items():
    print("%-18s p50 by round: %s" % (k, " ".join("%.2f" % x for x in v)))
