#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Registers two shared-memory regions with the agent, copies one into the other and checks the bytes.

    PYTHONPATH=client/python /usr/bin/python3 client/python/examples/copy_between_regions.py [SOCKET]

Without SOCKET the client finds the agent as Client() does: $FABRICXFER_SOCKET, else a pod's
/run/fabricxfer/agent.sock, else the host's one pool socket (/run/fabricxfer/<pool>/agent.sock).
"""

import hashlib
import os
import sys
from typing import Optional

from fabricxfer.client import Client, shared_memory, to_segment


def main(socket_path: Optional[str] = None) -> int:
    size = 4 << 20
    with Client(socket_path, name="example") as c:
        print("agent %s on node %s, pool %s/%s, engines: %s" % (
            c.info.agent_version, c.info.node_name, c.info.pool_namespace, c.info.pool_name,
            ", ".join("%s%s" % (e.name, "" if e.available else " (unavailable: %s)" % e.reason)
                      for e in c.info.engines)))
        src_fd, src = shared_memory("example-src", size)
        dst_fd, dst = shared_memory("example-dst", size)
        src[:] = os.urandom(size)
        a = c.register_host(src_fd, 0, size)
        b = c.register_host(dst_fd, 0, size, segment="example-dst-%d" % os.getpid())
        st = c.write(a, 0, to_segment("", b.segment), 0, size)
        same = hashlib.sha256(src).digest() == hashlib.sha256(dst).digest()
        print("copied %d bytes in %.3f ms; checksums %s" % (
            st.bytes, st.elapsed.ToNanoseconds() / 1e6, "match" if same else "DIFFER"))
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
