# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Eight 64 MiB transfers in flight from Python (wait=False, then wait_all), each submission timed on its own:
is a round bound by the submissions or by the GPU? Beside it torch's eight copy_ and one synchronize. Run from the
repository root with the agent at /tmp/agent-new; ROUNDS (default 400) rounds are timed, and the script's own
arguments go to the agent (--trace FILE for the execution trace of 09:52, with ROUNDS=30)."""

import os, statistics, subprocess, sys, tempfile, time
ROUNDS = int(os.environ.get("ROUNDS", "400"))
sys.path.insert(0, "client/python")
import torch
from fabricxfer.client import Client, to_layout

d = tempfile.mkdtemp()
agent = subprocess.Popen(["/tmp/agent-new", "standalone", "--socket-dir", d, "--pool-name", "kv"] + sys.argv[1:],
                         stdout=open(d + "/a.log", "w"), stderr=subprocess.STDOUT)
sock = d + "/kv/agent.sock"
for _ in range(600):
    if os.path.exists(sock):
        break
    time.sleep(0.1)
time.sleep(0.5)
c = Client(sock, timeout=60, name="pipeprobe")
size = 64 << 20
src = torch.randint(0, 255, (size,), dtype=torch.uint8, device="cuda:0")
dst = torch.zeros_like(src)
ref = torch.zeros_like(src)
ls = c.register_layout([c.register_tensor(src, gpu_index=0)], size)
ld = c.register_layout([c.register_tensor(dst, gpu_index=0)], size)
remote = to_layout(ld)
zero = torch.zeros(1, dtype=torch.int64)
for _ in range(200):
    c.transfer_blocks("write", ls, zero, remote, zero, timeout=60)
subs, waits, rounds, firsts = [], [], [], []
bypos = [[] for _ in range(8)]
for r in range(ROUNDS):
    t0 = time.perf_counter_ns()
    ids = []
    for k in range(8):
        s = time.perf_counter_ns()
        ids.append(c.transfer_blocks("write", ls, zero, remote, zero, timeout=60, wait=False))
        subs.append(time.perf_counter_ns() - s)
        bypos[k].append(subs[-1])
    s = time.perf_counter_ns()
    c.wait_all(ids, timeout=60)
    e = time.perf_counter_ns()
    waits.append(e - s)
    rounds.append(e - t0)
ours = []
for r in range(ROUNDS):
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for k in range(8):
        ref.copy_(src)
    torch.cuda.synchronize()
    ours.append(time.perf_counter_ns() - t0)
torch.cuda.synchronize()
med = lambda v: statistics.median(v) / 1e3
print("fabricxfer: round of 8 p50 %.1f us (%.1f per copy); one unwaited submission p50 %.1f us, p90 %.1f; wait_all after the 8th p50 %.1f us"
      % (med(rounds), med(rounds) / 8, med(subs), sorted(subs)[int(len(subs) * .9)] / 1e3, med(waits)))
print("torch: round of 8 copy_ + synchronize p50 %.1f us (%.1f per copy)" % (med(ours), med(ours) / 8))
print("bytes equal:", torch.equal(dst, src), torch.equal(ref, src))
agent.terminate()
agent.wait(10)
print("submission p50 by position in the round (us):", " ".join("%.1f" % (statistics.median(v) / 1e3) for v in bypos))
