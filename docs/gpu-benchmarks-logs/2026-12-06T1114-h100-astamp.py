# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Client-side stamps (CLOCK_MONOTONIC, as the agent's trace) around each waited call of case a (15,360 fresh
# torch int64 ids a side) and of the 64 MiB copy, to align with the agent's trace marks; argv: socket, out.
import json, os, sys, time
sys.path.insert(0, os.environ.get("CLIENT", "client/python"))
import os
import numpy as np
import torch
from fabricxfer.client import Client, to_layout
MODE = os.environ.get("MODE", "torch")
if MODE == "torch1":
    torch.set_num_threads(1)
rng = np.random.default_rng(1)
def perm():
    if MODE == "numpy":
        return torch.from_numpy(rng.permutation(262144)[:15360].astype(np.int64))
    return torch.randperm(262144)[:15360].clone()
c = Client(sys.argv[1])
blocks, bb, n = 262144, 720, 15360
src = torch.randint(0, 255, (blocks, bb), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], bb)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], bb)
rem = to_layout(ld)
big = 64 << 20
bs = torch.randint(0, 255, (big,), dtype=torch.uint8, device="cuda:0")
bd = torch.zeros_like(bs)
bls = c.register_layout([c.register_tensor(bs, gpu_index=0)], big)
bld = c.register_layout([c.register_tensor(bd, gpu_index=0)], big)
brem = to_layout(bld)
zero = torch.zeros(1, dtype=torch.int64)
conn = c._fast
inner = conn.call
marks = []
def call(*a, **k):
    marks.append(("posting", time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
    r = inner(*a, **k)
    marks.append(("reply seen", time.clock_gettime_ns(time.CLOCK_MONOTONIC)))
    return r
conn.call = call
out = {}
for name, fn, prep in (
        ("a", lambda ids: c.transfer_blocks("write", ls, ids[0], rem, ids[1], timeout=5.0),
         lambda: (perm(), perm())),
        ("c64", lambda ids: c.transfer_blocks("write", bls, zero, brem, zero, timeout=5.0), lambda: None)):
    rows = []
    for i in range(160):
        ids = prep()
        marks.clear()
        t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        fn(ids)
        t1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if i >= 40:
            rows.append([t0] + [t for _, t in marks] + [t1])
        time.sleep(50e-6)
    out[name] = rows
json.dump(out, open(sys.argv[2], "w"))
print("done", MODE, torch.get_num_threads(), {k: len(v) for k, v in out.items()})
