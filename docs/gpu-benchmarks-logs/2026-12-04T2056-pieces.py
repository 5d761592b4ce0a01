# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Waited 4 KiB transfer_blocks calls from Python (torch and numpy one-id lists) beside torch's own copy with its
synchronize, for one client tree and one agent binary, with the client's own share of a call (the agent's reply
replayed without a round trip): python3 THIS CLIENT_DIR AGENT [LABEL], from the repository root. The agent's
environment passes through (GOGC)."""

import os, sys, time, subprocess, tempfile
sys.path.insert(0, sys.argv[1])
import numpy as np, torch
from fabricxfer.client import Client, to_layout

label = sys.argv[3] if len(sys.argv) > 3 else ""
d = tempfile.mkdtemp()
agent = subprocess.Popen([sys.argv[2], "standalone", "--socket-dir", d, "--pool-name", "kv"] + os.environ.get("AGENT_ARGS", "").split(),
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
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

def pcts(fn, n):
    ts = []
    for i in range(n):
        t0 = time.perf_counter_ns(); fn(i); ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return tuple(ts[min(n - 1, int(n * q))] / 1e3 for q in (0.5, 0.99, 0.999))

def torch_copy(i):
    dst[i % 256].copy_(src[i % 256]); torch.cuda.synchronize()

def client_only(ids, n=20000):
    """A call whose round trip is replaced by the agent's last reply: what the client itself spends."""
    conn = c._fast
    real = conn.call
    box = {}
    def capture(parts, deadline):
        box["r"] = real(parts, deadline); return box["r"]
    conn.call = capture
    c.transfer_blocks("write", ls, ids[0], remote, ids[0], timeout=60)
    conn.call = lambda parts, deadline: box["r"]
    try:
        t0 = time.perf_counter_ns()
        for i in range(n):
            c.transfer_blocks("write", ls, ids[i % 256], remote, ids[i % 256], timeout=60)
        return (time.perf_counter_ns() - t0) / n / 1e3
    finally:
        conn.call = real

for i in range(3000):
    c.transfer_blocks("write", ls, tids[i % 256], remote, tids[i % 256], timeout=60)
for rep in range(2):
    print("%s client %s agent %s %s rep %d" % (label, sys.argv[1], sys.argv[2], os.environ.get("AGENT_ARGS", ""), rep))
    print("  full call, torch one-id   p50/p99/p99.9 us: %.1f / %.1f / %.1f" % pcts(
        lambda i: c.transfer_blocks("write", ls, tids[i % 256], remote, tids[i % 256], timeout=60), 20000))
    print("  full call, numpy one-id   p50/p99/p99.9 us: %.1f / %.1f / %.1f" % pcts(
        lambda i: c.transfer_blocks("write", ls, nids[i % 256], remote, nids[i % 256], timeout=60), 20000))
    print("  torch copy_+sync          p50/p99/p99.9 us: %.1f / %.1f / %.1f" % pcts(torch_copy, 5000))
    print("  client alone, torch ids us: %.2f   numpy ids us: %.2f" % (client_only(tids), client_only(nids)))
torch.cuda.synchronize()
assert torch.equal(src, dst)
print("  bytes checked: every block of the destination equals the source")
c.close()
agent.terminate(); agent.wait(10)
