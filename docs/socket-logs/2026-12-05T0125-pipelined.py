#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# usage: 2026-12-05T0125-pipelined.py AGENT_SOCKET CLIENT_DIR
# p50 of one unwaited one-block submission and its wait_all, and of eight and one wait_all, from one process.
import sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np
from fabricxfer.client import Client, shared_memory, to_layout
c = Client(sys.argv[1], name="w")
size = 256*4096
fds=[shared_memory(n, size) for n in ("w-s","w-d")]
regs=[c.register_host(fd,0,size) for fd,_ in fds]
sl=c.register_layout([regs[0]],4096); dl=c.register_layout([regs[1]],4096); rem=to_layout(dl)
ids=[np.array([i],dtype=np.int64) for i in range(8)]
def q(ts,p): s=sorted(ts); return s[int(len(s)*p)]*1e6
for rnd in range(2):
    one=[]; eight=[]
    for i in range(20000):
        t0=time.perf_counter(); c.wait_all([c.transfer_blocks("write", sl, ids[0], rem, ids[0], timeout=30.0, wait=False)], timeout=30.0); one.append(time.perf_counter()-t0)
    for i in range(5000):
        t0=time.perf_counter(); c.wait_all([c.transfer_blocks("write", sl, k, rem, k, timeout=30.0, wait=False) for k in ids], timeout=30.0); eight.append(time.perf_counter()-t0)
    print("submit+wait_all of 1: p50 %.2f  | 8 submits + wait_all: p50 %.2f us" % (q(one[5000:],.5), q(eight[1000:],.5)))
