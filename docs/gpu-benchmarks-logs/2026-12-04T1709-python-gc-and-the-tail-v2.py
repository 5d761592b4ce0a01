# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Does Python's cyclic garbage collector make the slow 1% of 4 KiB round trips? Waited one-block calls and torch's
own 4 KiB copy with its synchronize, in blocks of 5,000 with the collector on and off in turn; per mode p50, p99,
p99.9 and the slowest of both, and how many young-generation collections ran per 1,000 calls. Run from the repository root with the agent at
/tmp/agent."""

import gc, os, statistics, subprocess, sys, tempfile, time
sys.path.insert(0, "client/python")
import torch
from fabricxfer.client import Client, to_layout

d = tempfile.mkdtemp()
agent = subprocess.Popen(["/tmp/agent", "standalone", "--socket-dir", d, "--pool-name", "kv"],
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
sock = d + "/kv/agent.sock"
for _ in range(600):
    if os.path.exists(sock) and os.path.exists(d + "/kv/agent.fd.sock"):
        break
    time.sleep(0.1)
time.sleep(0.5)
c = Client(sock, timeout=60, name="gcprobe")
src = torch.randint(0, 255, (256, 4096), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src)
ref = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], 4096)
remote = to_layout(c.register_layout([c.register_tensor(dst, gpu_index=0)], 4096))
ids = [torch.tensor([i], dtype=torch.int64) for i in range(256)]
print("python", sys.version.split()[0], "gc thresholds", gc.get_threshold(), flush=True)
for i in range(5000):
    c.transfer_blocks("write", ls, ids[i % 256], remote, ids[(i * 7) % 256], timeout=60)
ours = {True: [], False: []}
theirs = {True: [], False: []}
young = {True: 0, False: 0}
for block in range(8):
    on = block % 2 == 0
    gc.enable() if on else gc.disable()
    before = gc.get_stats()[0]["collections"]
    for i in range(5000):
        t0 = time.perf_counter_ns()
        c.transfer_blocks("write", ls, ids[i % 256], remote, ids[(i * 7) % 256], timeout=60)
        ours[on].append(time.perf_counter_ns() - t0)
    young[on] += gc.get_stats()[0]["collections"] - before
    for i in range(5000):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        ref[(i * 7) % 256].copy_(src[i % 256])
        torch.cuda.synchronize()
        theirs[on].append(time.perf_counter_ns() - t0)
gc.enable()
q = lambda v, f: sorted(v)[int(len(v) * f)] / 1e3
for on in (True, False):
    print("collector %-3s: fabricxfer p50 %.1f p99 %.1f p99.9 %.1f max %.1f us; torch p50 %.1f p99 %.1f p99.9 %.1f max %.1f us; young collections per 1,000 calls %.1f"
          % ("on" if on else "off", q(ours[on], .5), q(ours[on], .99), q(ours[on], .999), max(ours[on]) / 1e3,
             q(theirs[on], .5), q(theirs[on], .99), q(theirs[on], .999), max(theirs[on]) / 1e3,
             1000 * young[on] / len(ours[on])), flush=True)
torch.cuda.synchronize()
print("bytes equal:", torch.equal(dst, ref))
agent.terminate()
agent.wait(10)
log = open(d + "/a.log", errors="replace").read().splitlines()
gcs = [l for l in log if l.startswith("gc ")]
print("agent GOGC=%s: %d collections in its log (GODEBUG=gctrace=1)%s" % (
    os.environ.get("GOGC", "100 (default)"), len(gcs), "; last: " + gcs[-1] if gcs else ""))
