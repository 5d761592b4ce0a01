# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""A process outside the socket's group gets PermissionError at once, naming the fix, not a readiness timeout."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

from fabricxfer.client import Client

NOBODY = 65534
GROUP = 4242


class SocketPermissionTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run a client under another uid")
        # The agent's layout: <dir>/<pool>/ 0750 in the socket group, the socket 0660 in it.
        self.base = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.base)
        os.chmod(self.base, 0o755)
        pool = os.path.join(self.base, "kv")
        os.mkdir(pool)
        os.chown(pool, -1, GROUP)
        os.chmod(pool, 0o750)
        self.path = os.path.join(pool, "agent.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(self.listener.close)
        self.listener.bind(self.path)
        self.listener.listen(8)
        os.chown(self.path, -1, GROUP)
        os.chmod(self.path, 0o660)

    def run_as(self, groups):
        """Builds a Client in a fresh interpreter (no gRPC threads forked) running as uid 65534 with the given
        supplementary groups and returns what it raised: class name, seconds taken and message."""
        code = """
import sys, time
from fabricxfer.client import Client
start = time.monotonic()
try:
    Client(sys.argv[1], timeout=2, fast=False).close()
    print("none")
except Exception as e:
    print("%s %.1f %s" % (type(e).__name__, time.monotonic() - start, e))
"""
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        res = subprocess.run([sys.executable, "-c", code, self.path], user=NOBODY, group=NOBODY,
                             extra_groups=groups, cwd="/", env={"PYTHONPATH": pkg, "PATH": "/usr/bin:/bin"},
                             capture_output=True, text=True, timeout=60, check=False)
        if res.returncode != 0:
            self.fail("client process failed: %s%s" % (res.stdout, res.stderr))
        return res.stdout.strip()

    def test_outside_the_group_is_refused_at_once(self):
        got = self.run_as([])
        name, seconds, message = got.split(" ", 2)
        self.assertEqual(name, "PermissionError", got)
        self.assertLess(float(seconds), 1.0, "the refusal waited for readiness: " + got)
        self.assertIn("uid 65534", message)
        self.assertIn("spec.socketGroup in its securityContext.supplementalGroups", message)
        # Outside Kubernetes: the agent's --socket-gid, or the agent's user; the socket's group is named.
        self.assertIn("agent standalone --socket-gid <gid>", message)
        self.assertIn("the agent's user", message)
        self.assertIn("socket group %d" % GROUP, message)
        self.assertIn(self.path, message)

    def test_a_member_gets_past_the_check(self):
        # The listener speaks no gRPC: a member gets as far as the call, which times out, not a PermissionError.
        got = self.run_as([GROUP])
        self.assertFalse(got.startswith("PermissionError"), got)


if __name__ == "__main__":
    unittest.main()
