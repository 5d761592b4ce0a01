# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Where a 4 KiB transfer_blocks call from Python spends its time: the whole call beside torch's own copy with
its synchronize, then each step of the client alone. Run from the repository root on the GPU machine with the
agent binary at /tmp/agent: python3 2026-12-04T0107-python-pieces.py"""

import os, sys, time, subprocess, tempfile, statistics
sys.path.insert(0, "client/python")  # run from the repository root
import numpy as np, torch
from fabricxfer.client import Client, to_layout, _length
from fabricxfer import blocks as B
from fabricxfer.agent.v1 import agent_pb2 as pb

d = tempfile.mkdtemp()
agent = subprocess.Popen(["/tmp/agent", "standalone", "--socket-dir", d, "--pool-name", "kv"], stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
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

def p50(fn, n=3000):
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(i); ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return ts[n // 2] / 1e3, ts[int(n * 0.99)] / 1e3

for rep in range(2):
    print("rep", rep)
    print("  full call, torch one-id   p50/p99 us: %.1f / %.1f" % p50(lambda i: c.transfer_blocks("write", ls, tids[i % 256], remote, tids[i % 256], timeout=60)))
    print("  full call, numpy one-id   p50/p99 us: %.1f / %.1f" % p50(lambda i: c.transfer_blocks("write", ls, nids[i % 256], remote, nids[i % 256], timeout=60)))
    def torch_copy(i):
        dst[i % 256].copy_(src[i % 256]); torch.cuda.synchronize()
    print("  torch copy_+sync          p50/p99 us: %.1f / %.1f" % p50(torch_copy))
    print("  _length(torch) us: %.2f" % per_call(lambda i: _length(tids[i % 256])))
    print("  pack_ids(torch) us: %.2f" % per_call(lambda i: B.pack_ids(tids[i % 256])))
    print("  pack_ids(numpy) us: %.2f" % per_call(lambda i: B.pack_ids(nids[i % 256])))
    print("  t.item() us: %.2f" % per_call(lambda i: tids[i % 256].item()))
    print("  t.dtype+is_cpu+numel us: %.2f" % per_call(lambda i: (tids[i % 256].dtype, tids[i % 256].is_cpu, tids[i % 256].numel())))
    l, w, _ = B.pack_ids(tids[3]); r, _, _ = B.pack_ids(tids[4])
    print("  blocks_frame us: %.2f" % per_call(lambda i: B.blocks_frame(pb.OP_WRITE if hasattr(pb, 'OP_WRITE') else 1, ls.pb.id, remote, l, r, 8, 60, None, True)))
    parts = B.blocks_frame(1, ls.pb.id, remote, l, r, 8, 60, None, True)
    print("  prebuilt frame round trip p50/p99 us: %.1f / %.1f" % p50(lambda i: c._fast_call(parts, 60)))
    raw = c._fast.call(parts, time.perf_counter() + 60)
    print("  FastReply.FromString us: %.2f" % per_call(lambda i: pb.FastReply.FromString(raw)))
    print("  _check_session us: %.2f" % per_call(lambda i: c._check_session()))
torch.cuda.synchronize()
assert torch.equal(src, dst)
agent.terminate(); agent.wait(10)
