# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Case a's client side on the GPU machine: 15,360 torch int64 ids per side (fresh tensors, as the benchmark
# passes them), the agent's reply replayed (no agent time), whole call and pieces; argv: socket.
import sys, time, timeit
sys.path.insert(0, "client/python")
import numpy as np
import torch
from fabricxfer import blocks as B
from fabricxfer.client import Client, to_layout
print("numpy", np.__version__, "torch", torch.__version__)
c = Client(sys.argv[1])
blocks, bb, n = 262144, 720, 15360
src = torch.randint(0, 255, (blocks, bb), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], bb)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], bb)
rem = to_layout(ld)
s, d = torch.randperm(blocks)[:n], torch.randperm(blocks)[:n]
print("ids dtype", s.dtype)
for _ in range(50): c.transfer_blocks("write", ls, s, rem, d, timeout=5.0)
ts = []
for _ in range(300):
    t0 = time.perf_counter(); c.transfer_blocks("write", ls, s, rem, d, timeout=5.0); ts.append(time.perf_counter() - t0)
ts.sort(); print("real call p50 %.1f us p10 %.1f" % (ts[150] * 1e6, ts[30] * 1e6))
gs, gd = s.cuda(), d.cuda()
torch.cuda.synchronize()
ts = []
for _ in range(300):
    t0 = time.perf_counter(); dst[gd] = src[gs]; torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
ts.sort(); print("torch indexed p50 %.1f us" % (ts[150] * 1e6))
orig, raws = c._fast_raw, []
def rec(*a, **k):
    r = orig(*a, **k); raws.append(bytes(r)); return r
c._fast_raw = rec
c.transfer_blocks("write", ls, s, rem, d, timeout=5.0)
raw = raws[-1]
arena = c._arena
def fake(parts, timeout, build=None, mailbox=True):
    if build is not None: build(c._fast)
    return raw
c._fast_raw = fake
k = 2000
def tm(name, fn):
    best = min(timeit.repeat(fn, number=k, repeat=5)) / k * 1e6
    print("%-36s %.2f us" % (name, best), flush=True)
tm("whole call, reply replayed", lambda: c.transfer_blocks("write", ls, s, rem, d, timeout=5.0))
tm("short_ids x2 (torch)", lambda: (B.short_ids(s), B.short_ids(d)))
tm("pack_ids x2 (torch)", lambda: (B.pack_ids(s), B.pack_ids(d)))
tm("t.numpy() x2", lambda: (s.numpy(), d.numpy()))
pk, pd = B.pack_ids(s)[0], B.pack_ids(d)[0]
tm("arena.fill", lambda: arena.fill(pk, 8, pd, 8))
a = s.numpy()
tm("_fits_32 x2", lambda: (B._fits_32(a), B._fits_32(a)))
tm("or.reduce x1", lambda: np.bitwise_or.reduce(a))
tm("max x1", lambda: a.max())
u = arena._u32
tm("copyto x2", lambda: (np.copyto(u[:n], a, casting="unsafe"), np.copyto(u[n:2 * n], a, casting="unsafe")))
tm("arena_frame", lambda: B.arena_frame(1, ls.pb.id, rem, n, 5.0, None, True))
tm("_fast_reply", lambda: c._fast_reply(raw))
