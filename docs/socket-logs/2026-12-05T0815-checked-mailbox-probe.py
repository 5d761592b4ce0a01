#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# A probe (08:15, 2-core development VM): one process, a client with the plain mailbox and one with a checked
# (sealed) mailbox, 20,000 waited one-block 4 KiB host calls each after 20,000 untimed, alternated three times,
# against one agent. At that moment a checked mailbox carried host-memory calls; since then it sends them on the
# socket, so running this again measures the socket for the checked client. Output (p50 / p99 in us):
#   True p50 8.18 p99 22.84 / checked p50 9.06 p99 25.38
#   True p50 12.77 p99 35.06 / checked p50 9.58 p99 32.91
#   True p50 11.01 p99 35.18 / checked p50 11.83 p99 27.15
import os, sys, time
sys.path.insert(0, "client/python")
import numpy as np
from fabricxfer.client import Client, shared_memory, to_layout
from fabricxfer import fastconn
S = sys.argv[1]
loops = {"n": 0, "calls": 0}
orig = fastconn.FastConn._sealed_reply
def run(mode, n=20000):
    c = Client(S, mailbox=mode)
    fd, buf = shared_memory("p", 256*4096); fd2, buf2 = shared_memory("q", 256*4096)
    l1 = c.register_layout([c.register_host(fd, 0, 256*4096)], 4096)
    l2 = c.register_layout([c.register_host(fd2, 0, 256*4096)], 4096)
    a, b = np.array([3]), np.array([5])
    t = []
    for i in range(2*n):
        s0 = time.perf_counter()
        c.transfer_blocks("write", l1, a, to_layout(l2), b)
        t.append(time.perf_counter() - s0)
    x = sorted(t[n:])
    print(mode, "p50 %.2f p99 %.2f" % (x[len(x)//2]*1e6, x[int(len(x)*.99)]*1e6), flush=True)
    c.close()
for r in range(3):
    for m in (True, "checked"):
        run(m)
