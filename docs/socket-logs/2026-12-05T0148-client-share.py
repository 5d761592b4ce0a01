#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# usage: 2026-12-05T0148-client-share.py AGENT_SOCKET CLIENT_DIR
# p50 of a waited one-block call, and of the same call with its round trip replaced by the agent's last reply (what the
# client itself spends), from one process through the mailbox.
import sys, time, statistics
sys.path.insert(0, sys.argv[2] if len(sys.argv) > 2 else "client/python")
import numpy as np
from fabricxfer.client import Client, shared_memory, to_layout
c = Client(sys.argv[1], name="alone")
size = 256*4096
fds=[shared_memory(n, size) for n in ("a-s","a-d")]
regs=[c.register_host(fd,0,size) for fd,_ in fds]
sl=c.register_layout([regs[0]],4096); dl=c.register_layout([regs[1]],4096); rem=to_layout(dl)
k=np.array([1],dtype=np.int64)
fc=c._fast
orig=fc.call
last=[None]
def rec(parts, deadline):
    r=orig(parts, deadline); last[0]=r; return r
fc.call=rec
c.transfer_blocks("write", sl, k, rem, k, timeout=30.0)
raw=last[0]
def q(ts,p): s=sorted(ts); return s[int(len(s)*p)]*1e6
for rnd in range(3):
    fc.call=orig
    w=[]
    for i in range(30000):
        t0=time.perf_counter(); c.transfer_blocks("write", sl, k, rem, k, timeout=30.0); w.append(time.perf_counter()-t0)
    fc.call=lambda parts, deadline: raw
    a=[]
    for i in range(30000):
        t0=time.perf_counter(); c.transfer_blocks("write", sl, k, rem, k, timeout=30.0); a.append(time.perf_counter()-t0)
    print("full p50 %.2f | client alone p50 %.2f" % (q(w[10000:],.5), q(a[10000:],.5)))
