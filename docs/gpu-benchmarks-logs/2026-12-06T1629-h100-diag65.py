# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# One agent start's 64 MiB waited calls as bench_gpu.py makes them (plain transfer_blocks with a one-id torch
# tensor, then prepared, then plain again), 300 timed calls a block after 50 untimed, each split by client
# stamps around the mailbox call into before posting / posting to reply seen / after; then torch's copy_ +
# synchronize. Prints p10/p50/p90 of each part per block, and the CPUs the client thread ran on. argv: socket.
import os, statistics, sys, time
sys.path.insert(0, "client/python")
import torch
from fabricxfer.client import Client, to_layout
c = Client(sys.argv[1])
size = 64 << 20
src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src); ref = torch.zeros_like(src)
sl = c.register_layout([c.register_tensor(src, gpu_index=0)], size)
dl = c.register_layout([c.register_tensor(dst, gpu_index=0)], size)
rem = to_layout(dl)
zt = torch.zeros(1, dtype=torch.int64)
run = c.prepare_blocks("write", sl, zt, rem, zt, timeout=5.0).run
conn = c._fast; inner = conn._mailbox_call; marks = []
def mc(*a, **k):
    marks.append(time.perf_counter()); r = inner(*a, **k); marks.append(time.perf_counter()); return r
conn._mailbox_call = mc
plain = lambda: c.transfer_blocks("write", sl, zt, rem, zt, timeout=5.0)
copy = lambda: (ref.copy_(src), torch.cuda.synchronize())
cpus = set()
def block(name, f):
    rows = []
    for i in range(350):
        marks.clear(); t0 = time.perf_counter(); f(); t1 = time.perf_counter()
        if i >= 50:
            rows.append((t1 - t0,) + ((marks[0] - t0, marks[1] - marks[0], t1 - marks[1]) if len(marks) == 2 else (0, 0, 0)))
        if i % 50 == 0:
            cpus.add(os.sched_getcpu() if hasattr(os, "sched_getcpu") else -1)
    q = lambda xs, p: sorted(xs)[int(p * (len(xs) - 1))] * 1e6
    parts = []
    for j, label in enumerate(("total", "before", "post->reply", "after")):
        xs = [r[j] for r in rows]
        parts.append("%s %.1f/%.1f/%.1f" % (label, q(xs, .1), q(xs, .5), q(xs, .9)))
    print("%-9s %s" % (name, "  ".join(parts)), flush=True)
    return statistics.median(r[0] for r in rows)
torch.cuda.synchronize()
m = [block("plain", plain), block("prepared", run), block("plain", plain), block("torch", copy)]
assert torch.equal(dst, src) and torch.equal(ref, src)
print("ratios plain %.3f prepared %.3f plain %.3f; client cpus %s" % (m[3] / m[0], m[3] / m[1], m[3] / m[2], sorted(cpus)))
