# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""A 4 KiB transfer_blocks call from Python (torch and numpy one-id lists) beside torch's own copy with its
synchronize, for one client tree and one agent binary: python3 THIS CLIENT_DIR AGENT, from the repository root."""

import os, sys, time, subprocess, tempfile
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from fabricxfer.client import Client, to_layout
from fabricxfer import blocks as B

d = tempfile.mkdtemp()
agent = subprocess.Popen([sys.argv[2], "standalone", "--socket-dir", d, "--pool-name", "kv"], stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
sock = d + "/kv/agent.sock"
for _ in range(600):
    if os.path.exists(sock): break
    time.sleep(0.1)
time.sleep(0.5)
c = Client(sock, timeout=60, name="pieces")
dev = torch.device("cuda:0")
src = torch.randint(0, 255, (256, 4096), dtype=torch.uint8, device=dev)
dst = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], 4096)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], 4096)
remote = to_layout(ld)
tids = [torch.tensor([i], dtype=torch.int64) for i in range(256)]
nids = [np.array([i], dtype=np.int64) for i in range(256)]

def per_call(fn, n=20000):
    t0 = time.perf_counter_ns()
    for i in range(n):
        fn(i)
    return (time.perf_counter_ns() - t0) / n / 1e3

def p50(fn, n=4000):
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(i); ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return ts[n // 2] / 1e3, ts[int(n * 0.99)] / 1e3

def torch_copy(i):
    dst[i % 256].copy_(src[i % 256]); torch.cuda.synchronize()
for _ in range(3000):
    c.transfer_blocks("write", ls, tids[_ % 256], remote, tids[_ % 256], timeout=60)
for rep in range(2):
    print("client %s rep %d" % (sys.argv[1], rep))
    print("  full call, torch one-id   p50/p99 us: %.1f / %.1f" % p50(lambda i: c.transfer_blocks("write", ls, tids[i % 256], remote, tids[i % 256], timeout=60)))
    print("  full call, numpy one-id   p50/p99 us: %.1f / %.1f" % p50(lambda i: c.transfer_blocks("write", ls, nids[i % 256], remote, nids[i % 256], timeout=60)))
    print("  torch copy_+sync          p50/p99 us: %.1f / %.1f" % p50(torch_copy))
    print("  pack_ids(torch) us: %.2f" % per_call(lambda i: B.pack_ids(tids[i % 256])))
    print("  pack_ids(numpy) us: %.2f" % per_call(lambda i: B.pack_ids(nids[i % 256])))
torch.cuda.synchronize()
assert torch.equal(src, dst)
agent.terminate(); agent.wait(10)
