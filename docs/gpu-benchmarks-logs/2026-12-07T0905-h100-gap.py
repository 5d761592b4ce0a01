# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Where the plain 64 MiB call's extra microseconds go: the same call with ids as a torch tensor, a numpy array,
# an array.array, and prepared, pair by pair against torch's copy_, and the torch calls short_ids makes, alone.
import array, os, statistics, sys, time
sys.path.insert(0, 'client/python')
import numpy as np, torch
from fabricxfer.client import Client, to_layout
from fabricxfer import blocks
dev = torch.device("cuda:0")
c = Client(os.environ["FABRICXFER_SOCKET"])
N = 64 << 20
src = torch.empty(N, dtype=torch.uint8, device=dev); src.random_(0, 256)
dst = torch.zeros_like(src); ref = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], N)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], N)
rl = to_layout(ld)
zt = torch.zeros(1, dtype=torch.int64); zn = np.zeros(1, dtype=np.int64); za = array.array("q", [0])
prep = c.prepare_blocks("write", ls, zt, rl, zt, timeout=10).run
def sync(): torch.cuda.synchronize(dev)
def timed(fn, n):
    out = []
    for _ in range(n):
        sync(); s = time.perf_counter_ns(); fn(); sync(); out.append(time.perf_counter_ns() - s)
    return out
cases = {"torch-ids": lambda: c.transfer_blocks("write", ls, zt, rl, zt, timeout=10),
         "numpy-ids": lambda: c.transfer_blocks("write", ls, zn, rl, zn, timeout=10),
         "array-ids": lambda: c.transfer_blocks("write", ls, za, rl, za, timeout=10),
         "prepared": prep, "copy_": lambda: ref.copy_(src)}
for f in cases.values():
    for _ in range(300): f()
res = {k: [] for k in cases}
for rnd in range(10):
    for k, f in cases.items():
        res[k] += timed(f, 100)
sync()
for k, v in res.items():
    print("%-10s p50 %7.2f us  p10 %7.2f" % (k, statistics.median(v) / 1e3, sorted(v)[len(v) // 10] / 1e3))
print("bytes ok", torch.equal(dst, src), torch.equal(ref, src))
def micro(name, fn, n=20000):
    for _ in range(1000): fn()
    s = time.perf_counter_ns()
    for _ in range(n): fn()
    print("%-22s %6.3f us" % (name, (time.perf_counter_ns() - s) / n / 1e3))
micro("short_ids(torch)", lambda: blocks.short_ids(zt))
micro("short_ids(numpy)", lambda: blocks.short_ids(zn))
micro("t.dtype", lambda: zt.dtype)
micro("t.is_cpu", lambda: zt.is_cpu)
micro("t.numel()", lambda: zt.numel())
micro("t.tolist()", lambda: zt.tolist())
micro("t.data_ptr()", lambda: zt.data_ptr())
micro("t.numpy()", lambda: zt.numpy())
micro("t.item()", lambda: zt.item())
