# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""A 4 KiB transfer_blocks call from Python beside the same frame sent prebuilt (through the client and straight
on its connection), interleaved, and the client's steps alone; run from the repository root with the agent at
/tmp/agent."""

import os, sys, time, subprocess, tempfile
sys.path.insert(0, "client/python")
import numpy as np, torch
from google.protobuf.internal import api_implementation
import google.protobuf
print("protobuf", google.protobuf.__version__, api_implementation.Type(), "python", sys.version.split()[0])
from fabricxfer.client import Client, to_layout
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
src = torch.randint(0, 255, (256, 4096), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], 4096)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], 4096)
remote = to_layout(ld)
tids = [torch.tensor([i], dtype=torch.int64) for i in range(256)]
def per_call(fn, n=20000):
    t0 = time.perf_counter_ns()
    for i in range(n): fn(i)
    return (time.perf_counter_ns() - t0) / n / 1e3
l, w, _ = B.pack_ids(tids[3]); r, _, _ = B.pack_ids(tids[4])
parts = B.blocks_frame(1, ls.pb.id, remote, l, r, 8, 60, None, True)
conn = c._fast
raw = conn.call(parts, time.perf_counter() + 60)
for _ in range(3000): c.transfer_blocks("write", ls, tids[_ % 256], remote, tids[_ % 256], timeout=60)
fs = {
  "full transfer_blocks": lambda i: c.transfer_blocks("write", ls, tids[i % 256], remote, tids[i % 256], timeout=60),
  "_fast_call prebuilt": lambda i: c._fast_call(parts, 60),
  "conn.call prebuilt": lambda i: conn.call(parts, time.perf_counter() + 60),
}
ts = {k: [] for k in fs}
for i in range(30000):
    for k, f in fs.items():
        t0 = time.perf_counter_ns(); f(i); ts[k].append(time.perf_counter_ns() - t0)
for k, v in ts.items():
    v.sort(); print("%-22s p50 %6.2f p99 %6.2f us" % (k, v[len(v)//2]/1e3, v[int(len(v)*.99)]/1e3))
print("pack_ids(torch) x2 us: %.2f" % per_call(lambda i: (B.pack_ids(tids[i % 256]), B.pack_ids(tids[(i+1) % 256]))))
print("blocks_frame us: %.2f" % per_call(lambda i: B.blocks_frame(1, ls.pb.id, remote, l, r, 8, 60, None, True)))
print("FromString+response+settled us: %.2f" % per_call(lambda i: c._settled(pb.FastReply.FromString(raw).response, True)))
print("_check_session us: %.2f" % per_call(lambda i: c._check_session()))
print("layout.pb.id us: %.2f" % per_call(lambda i: ls.pb.id))
torch.cuda.synchronize(); assert torch.equal(src, dst)
agent.terminate(); agent.wait(10)
