# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# 64 MiB waited block call: plain with torch ids, plain with numpy ids, prepared, and torch's copy_+synchronize,
# in interleaved blocks of 50 calls; client stamps around the mailbox call split each into before posting / posting
# to reply seen / after. argv: socket.
import os, statistics, sys, time, timeit
sys.path.insert(0, "client/python")
import numpy as np
import torch
from fabricxfer import blocks
from fabricxfer.client import Client, to_layout
c = Client(sys.argv[1])
size = 64 << 20
src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src); ref = torch.zeros_like(src)
sl = c.register_layout([c.register_tensor(src, gpu_index=0)], size)
dl = c.register_layout([c.register_tensor(dst, gpu_index=0)], size)
rem = to_layout(dl)
zt = torch.zeros(1, dtype=torch.int64); zn = np.zeros(1, dtype=np.int64)
run = c.prepare_blocks("write", sl, zt, rem, zt, timeout=5.0).run
conn = c._fast; inner = conn._mailbox_call; marks = []
def mc(*a, **k):
    marks.append(time.perf_counter()); r = inner(*a, **k); marks.append(time.perf_counter()); return r
conn._mailbox_call = mc
V = {"plain-torch": lambda: c.transfer_blocks("write", sl, zt, rem, zt, timeout=5.0),
     "plain-numpy": lambda: c.transfer_blocks("write", sl, zn, rem, zn, timeout=5.0),
     "prepared": run,
     "torch-copy": lambda: (ref.copy_(src), torch.cuda.synchronize())}
rows = {k: [] for k in V}
for w in range(300):
    for f in V.values(): f()
torch.cuda.synchronize()
for rnd in range(10):
    for k, f in V.items():
        for i in range(60):
            marks.clear(); t0 = time.perf_counter(); f(); t1 = time.perf_counter()
            if i >= 10:
                rows[k].append((t1 - t0, marks[0] - t0, marks[1] - marks[0], t1 - marks[1]) if len(marks) == 2 else (t1 - t0, 0, 0, 0))
assert torch.equal(dst, src) and torch.equal(ref, src)
tc = statistics.median(r[0] for r in rows["torch-copy"])
for k, rs in rows.items():
    m = [statistics.median(r[j] for r in rs) * 1e6 for j in range(4)]
    print("%-12s total %6.1f us (ratio %.3f)  before post %5.2f  post->reply %6.1f  after %5.2f" % (k, m[0], tc * 1e6 / m[0], m[1], m[2], m[3]))
for name, stmt in (("short_ids torch", lambda: blocks.short_ids(zt)), ("short_ids numpy", lambda: blocks.short_ids(zn)),
                   ("zt.tolist", zt.tolist), ("zt.dtype", lambda: zt.dtype), ("zt.is_cpu", lambda: zt.is_cpu), ("zt.numel", zt.numel)):
    print("%-16s %.3f us" % (name, min(timeit.repeat(stmt, number=20000, repeat=5)) / 20000 * 1e6))
