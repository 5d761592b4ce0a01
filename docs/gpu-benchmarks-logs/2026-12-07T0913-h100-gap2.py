# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# The plain call's extra microseconds against prepared, variant by variant in rotation (call by call, so drift
# weighs on all alike), on GPU layouts (64 MiB, one block) and host layouts (4 KiB blocks).
import array, os, statistics, sys, time
sys.path.insert(0, 'client/python')
import numpy as np, torch
from fabricxfer.client import Client, to_layout, shared_memory
dev = torch.device("cuda:0")
c = Client(os.environ["FABRICXFER_SOCKET"])
def sync(): torch.cuda.synchronize(dev)
def variants(ls, rl, ref_copy):
    zt = torch.zeros(1, dtype=torch.int64); zn = np.zeros(1, dtype=np.int64); zb = bytes(8)
    prep = c.prepare_blocks("write", ls, zt, rl, zt, timeout=10).run
    v = {"torch": lambda: c.transfer_blocks("write", ls, zt, rl, zt, timeout=10),
         "numpy": lambda: c.transfer_blocks("write", ls, zn, rl, zn, timeout=10),
         "bytes8": lambda: c.transfer_blocks("write", ls, zb, rl, zb, timeout=10, id_bytes=8),
         "prepared": prep}
    if ref_copy: v["copy_"] = ref_copy
    return v
def rotate(v, n, gpu):
    res = {k: [] for k in v}
    for f in v.values():
        for _ in range(300): f()
    for _ in range(n):
        for k, f in v.items():
            if gpu: sync()
            s = time.perf_counter_ns(); f()
            if gpu: sync()
            res[k].append(time.perf_counter_ns() - s)
    for k, x in res.items():
        x.sort()
        print("  %-9s p50 %7.2f us  p25 %7.2f  p75 %7.2f" % (k, x[len(x)//2] / 1e3, x[len(x)//4] / 1e3, x[3*len(x)//4] / 1e3))
N = 64 << 20
src = torch.empty(N, dtype=torch.uint8, device=dev); src.random_(0, 256)
dst = torch.zeros_like(src); ref = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], N)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], N)
print("GPU 64 MiB, sync around each call")
rotate(variants(ls, to_layout(ld), lambda: ref.copy_(src)), 1000, True)
print("bytes ok", torch.equal(dst, src), torch.equal(ref, src))
fa, ba = shared_memory("a", 1 << 16); fb, bb = shared_memory("b", 1 << 16)
ha = c.register_layout([c.register_host(fa, 0, 1 << 16)], 4096)
hb = c.register_layout([c.register_host(fb, 0, 1 << 16)], 4096)
print("host 4 KiB")
rotate(variants(ha, to_layout(hb), None), 20000, False)
