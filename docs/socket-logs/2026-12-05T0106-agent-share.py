#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# usage: 2026-12-05T0106-agent-share.py AGENT_SOCKET CLIENT_DIR
# p50 of a waited one-block call, of the same frame built once (the agent and the crossing) and of a FastWait of a
# settled transfer (the crossing and a trivial request), from one process through the mailbox.
import sys, time
sys.path.insert(0, sys.argv[2])
import numpy as np
from fabricxfer.client import Client, shared_memory, to_layout, _HDR
from fabricxfer import blocks as _blocks
from fabricxfer.agent.v1 import agent_pb2 as pb
c = Client(sys.argv[1], name="floor")
size = 256*4096
fds=[shared_memory(n, size) for n in ("f-s","f-d")]
regs=[c.register_host(fd,0,size) for fd,_ in fds]
sl=c.register_layout([regs[0]],4096); dl=c.register_layout([regs[1]],4096); rem=to_layout(dl)
k=np.array([1],dtype=np.int64)
r=c.transfer_blocks("write", sl, k, rem, k, timeout=30.0)
last = r.transfer_id if hasattr(r,'transfer_id') else r
req = pb.FastWait(transfer_ids=[last]); req.timeout.FromNanoseconds(10**10)
payload = pb.FastRequest(wait=req).SerializeToString()
wparts=[_HDR.pack(len(payload)), payload]
local, width, count = _blocks.short_ids(k) or _blocks.pack_ids(k)
bparts = _blocks.blocks_frame(pb.OP_WRITE, sl.pb.id, rem, local, local, width, 30.0, None, True)
fc=c._fast
def q(ts,p): s=sorted(ts); return s[int(len(s)*p)]*1e6
for rnd in range(2):
    res={}
    for name, fn in (("full", lambda: c.transfer_blocks("write", sl, k, rem, k, timeout=30.0)),
                     ("raw blocks", lambda: fc.call(bparts, time.perf_counter()+10)),
                     ("raw wait", lambda: fc.call(wparts, time.perf_counter()+10))):
        w=[]
        for i in range(30000):
            t0=time.perf_counter(); fn(); w.append(time.perf_counter()-t0)
        res[name]=q(w[10000:],.5)
    print("  ".join("%s %.2f" % kv for kv in res.items()))
