# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Where the 4 KiB round trip's tail comes from: every call's start and duration, for ours (torch ids, numpy ids,
# a prepared run) and torch's own copy, plus how often a bare Python spin loop loses its core.
import json, os, statistics, sys, threading, time
sys.path.insert(0, "client/python")
import numpy as np
import torch
from fabricxfer.client import Client, to_layout

if os.environ.get("TAIL_SWITCH"):
    sys.setswitchinterval(float(os.environ["TAIL_SWITCH"]))
if os.environ.get("TAIL_NOSUB"):
    import grpc._channel
    grpc._channel.Channel.subscribe = lambda self, callback, try_to_connect=False: None
CASES = os.environ.get("TAIL_CASES", "t,n,p,torch").split(",")
ROUNDS = int(os.environ.get("TAIL_ROUNDS", "2"))
sock = sys.argv[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
pc = time.perf_counter


def spin_gaps(seconds, thresh=5e-6):
    gaps = []
    t0 = prev = pc()
    end = t0 + seconds
    while True:
        t = pc()
        if t - prev > thresh:
            gaps.append((prev - t0, t - prev))
        prev = t
        if t > end:
            return gaps


def timed(fn, n):
    starts, durs = [], []
    t0 = pc()
    for i in range(n):
        s = pc()
        fn(i)
        e = pc()
        starts.append(s - t0)
        durs.append(e - s)
    return starts, durs


def report(name, starts, durs):
    d = sorted(durs)
    q = lambda f: d[min(len(d) - 1, int(len(d) * f))] * 1e6  # noqa: E731
    slow = [(s, x) for s, x in zip(starts, durs) if x > 60e-6]
    gaps = [round((b[0] - a[0]) * 1e3, 2) for a, b in zip(slow, slow[1:])]
    print("%-28s n %d p50 %.1f p90 %.1f p99 %.1f p99.9 %.1f max %.1f us; >60us: %d (%.2f%%); >100us: %d" % (
        name, len(d), q(.5), q(.9), q(.99), q(.999), d[-1] * 1e6, len(slow), 100.0 * len(slow) / len(d),
        sum(1 for x in durs if x > 100e-6)))
    per = 5.17
    near = sum(1 for g in gaps if g > 1 and abs(g / per - round(g / per)) * per < 0.2)
    far = sum(1 for g in gaps if g > 1)
    print("   gaps >1ms near a multiple of %.2f ms: %d of %d; switch %.4f" % (per, near, far, sys.getswitchinterval()))
    print("   slow us:", [round(x * 1e6) for _, x in slow[:30]])
    print("   gaps between slow ms:", gaps[:30])
    sys.stdout.flush()


print("python threads:", [t.name for t in threading.enumerate()], "os threads:", len(os.listdir("/proc/self/task")))
for secs in (1.0,):
    g = spin_gaps(secs)
    big = [x for _, x in g if x > 20e-6]
    print("spin loop %.0f s: %d gaps >5us, %d >20us, max %.1f us; >20us at ms %s" % (
        secs, len(g), len(big), max([x for _, x in g] or [0]) * 1e6,
        [round(s * 1e3, 1) for s, x in g if x > 20e-6][:30]))

dev = torch.device("cuda", 0)
c = Client(sock, timeout=60, name="tail")
print("after client: python threads:", [t.name for t in threading.enumerate()], "os threads:",
      len(os.listdir("/proc/self/task")))
x = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
end = pc() + 0.5
while pc() < end:
    x.add_(1)
torch.cuda.synchronize()
del x
blocks, bs = 256, 4096
src = torch.randint(0, 256, (blocks, bs), dtype=torch.uint8, device=dev)
ours = torch.zeros_like(src)
ref = torch.zeros_like(src)
src_l = c.register_layout([c.register_tensor(src)], bs)
dst_l = c.register_layout([c.register_tensor(ours)], bs)
remote = to_layout(dst_l)
tids = [torch.tensor([i], dtype=torch.int64) for i in range(blocks)]
nids = [np.array([i], dtype=np.int64) for i in range(blocks)]
preps = [c.prepare_blocks("write", src_l, tids[i], remote, tids[i], timeout=60).run for i in range(blocks)]
ours_t = lambda i: c.transfer_blocks("write", src_l, tids[i % blocks], remote, tids[i % blocks], timeout=60)  # noqa
ours_n = lambda i: c.transfer_blocks("write", src_l, nids[i % blocks], remote, nids[i % blocks], timeout=60)  # noqa
ours_p = lambda i: preps[i % blocks]()  # noqa


def torch_fn(i):
    ref[i % blocks].copy_(src[i % blocks])
    torch.cuda.synchronize()


for rnd in range(ROUNDS):
    for name, fn in [(n, f) for k, n, f in (("t", "ours torch ids", ours_t), ("n", "ours numpy ids", ours_n),
                     ("p", "ours prepared", ours_p), ("torch", "torch copy_+sync", torch_fn)) if k in CASES]:
        timed(fn, 2000)
        report("r%d %s" % (rnd, name), *timed(fn, N))
torch.cuda.synchronize()
print("bytes ok:", torch.equal(ours, src), torch.equal(ref, src))
g = spin_gaps(1.0)
print("spin loop after: %d gaps >5us, %d >20us, max %.1f us" % (len(g), sum(1 for _, x in g if x > 20e-6),
                                                                 max([x for _, x in g] or [0]) * 1e6))
