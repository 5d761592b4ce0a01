# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Where a waited call's time goes, agent and client: an agent in standalone mode writing an execution trace
(--trace) serves, in this order, 3,000 one-block 4 KiB calls, 300 of 64 MiB and 60 of 1 GiB from one PyTorch
process (numpy one-id lists), each timed by the client; torch's own copy_ with its synchronize of the same sizes
beside them. python3 THIS AGENT TRACE_FILE; hack/trace-phases.py --last N then splits the trace per case."""

import os, sys, time, subprocess, tempfile
sys.path.insert(0, "client/python")
import numpy as np, torch
from fabricxfer.client import Client, to_layout

d = tempfile.mkdtemp()
agent = subprocess.Popen([sys.argv[1], "standalone", "--socket-dir", d, "--pool-name", "kv", "--trace", sys.argv[2]] + os.environ.get("AGENT_ARGS", "").split(),
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
sock = d + "/kv/agent.sock"
for _ in range(600):
    if os.path.exists(sock): break
    time.sleep(0.1)
time.sleep(0.5)
c = Client(sock, timeout=60, name="traced")
dev = torch.device("cuda:0")
one = np.array([0], dtype=np.int64)

def pct(ts, q):
    ts = sorted(ts)
    return ts[min(len(ts) - 1, int(len(ts) * q))] / 1e3

def case(name, size, n, warm):
    blocks = max(1, (256 * 4096) // size)
    src = torch.randint(0, 255, (blocks, size), dtype=torch.uint8, device=dev)
    dst = torch.zeros_like(src)
    ls = c.register_layout([c.register_tensor(src, gpu_index=0)], size)
    ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], size)
    remote = to_layout(ld)
    ids = [np.array([i % blocks], dtype=np.int64) for i in range(blocks)]
    for i in range(warm):
        c.transfer_blocks("write", ls, ids[i % blocks], remote, ids[i % blocks], timeout=60)
    ours = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        c.transfer_blocks("write", ls, ids[i % blocks], remote, ids[i % blocks], timeout=60)
        ours.append(time.perf_counter_ns() - t0)
    theirs, gpu = [], []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(n):
        t0 = time.perf_counter_ns()
        e0.record(); dst[i % blocks].copy_(src[i % blocks]); e1.record(); torch.cuda.synchronize()
        theirs.append(time.perf_counter_ns() - t0)
        gpu.append(e0.elapsed_time(e1) * 1e6)
    ok = torch.equal(src, dst)
    print("%-8s ours p50 %.1f p99 %.1f us; torch copy_+sync p50 %.1f p99 %.1f us, its GPU time by events p50 %.1f us; "
          "ratio %.3f; bytes %s (last %d requests of the trace)" % (
              name, pct(ours, .5), pct(ours, .99), pct(theirs, .5), pct(theirs, .99), pct(gpu, .5),
              pct(theirs, .5) / pct(ours, .5), "ok" if ok else "DIFFER", n), flush=True)

case("4KiB", 4096, 3000, 2000)
case("64MiB", 64 << 20, 300, 30)
case("1GiB", 1 << 30, 60, 10)
c.close()
agent.terminate(); agent.wait(20)
