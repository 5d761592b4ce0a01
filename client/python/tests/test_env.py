# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Client() without a path dials $FABRICXFER_SOCKET, the variable a prepared fabricxfer.io claim sets, else a
pod's mounted socket, else the host's one pool socket."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

from fabricxfer import client as fx
from fabricxfer.client import AgentUnreachable, Client, default_socket

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")


class DefaultSocketTest(unittest.TestCase):
    @unittest.skipUnless(SOCKET, "FABRICXFER_SOCKET not set: run through go test ./client")
    def test_no_path_dials_fabricxfer_socket(self):
        with Client(timeout=10) as c:
            self.assertEqual(c.socket_path, SOCKET)
            self.assertTrue(c.info.agent_version, "GetInfo through the default socket answered no version")

    def test_fallback_without_the_variable(self):
        class Stop(Exception):
            pass

        env = {k: v for k, v in os.environ.items() if k != "FABRICXFER_SOCKET"}
        with tempfile.TemporaryDirectory() as root:
            pod = os.path.join(root, "agent.sock")
            s = socket.socket(socket.AF_UNIX)
            s.bind(pod)
            self.addCleanup(s.close)
            with mock.patch.dict(os.environ, env, clear=True), \
                    mock.patch("fabricxfer.client.HOST_SOCKET_DIRS", (tempfile.mkdtemp(),)), \
                    mock.patch("fabricxfer.client.grpc.insecure_channel", side_effect=Stop) as channel:
                missing = os.path.join(root, "none", "agent.sock")
                with mock.patch("fabricxfer.client.DEFAULT_SOCKET", missing), \
                        self.assertRaises(AgentUnreachable) as e:
                    Client()  # nothing at the pod's default: said at once, naming it
                self.assertIn(missing, str(e.exception))
                with mock.patch("fabricxfer.client.DEFAULT_SOCKET", pod), self.assertRaises(Stop):
                    Client()
        self.assertEqual(channel.call_args[0][0], "unix:" + pod)
        self.assertEqual(fx.DEFAULT_SOCKET, "/run/fabricxfer/agent.sock")

    def test_the_one_pool_socket_of_the_host(self):
        # As the Go client (client.SocketPath) and xferctl find it: a pod's mounted socket, else the one pool
        # socket under the host's socket directories (counted once under two names), else the pod's default.
        with tempfile.TemporaryDirectory() as root:
            host, alias = os.path.join(root, "run"), os.path.join(root, "var-run")
            os.makedirs(os.path.join(host, "empty"))
            os.symlink(host, alias)
            dirs, pod = (host, alias), os.path.join(root, "pod", "agent.sock")
            listening = []

            def listen(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                s = socket.socket(socket.AF_UNIX)
                s.bind(path)
                listening.append(s)

            try:
                self.assertEqual(default_socket(pod, dirs), pod, "nothing anywhere")
                kv = os.path.join(host, "kv", "agent.sock")
                listen(kv)
                self.assertEqual(default_socket(pod, dirs), os.path.realpath(kv), "one pool's socket")
                listen(pod)
                self.assertEqual(default_socket(pod, dirs), pod, "a pod's mounted socket first")
                os.remove(pod)
                listen(os.path.join(host, "decode", "agent.sock"))
                self.assertEqual(default_socket(pod, dirs), pod, "two pools' sockets: no guess")
            finally:
                for s in listening:
                    s.close()



class NoSocketTest(unittest.TestCase):
    """Where no socket is, Client() says so at once (as the Go client does), not after its whole timeout."""

    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root, True)

    def listen(self, *parts):
        path = os.path.join(self.root, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        self.addCleanup(s.close)
        return path

    def refused_at_once(self, *args, **env):
        start = time.monotonic()
        with mock.patch.dict(os.environ, env):
            with self.assertRaises(AgentUnreachable) as e:
                Client(*args, timeout=3)
        self.assertLess(time.monotonic() - start, 1.0, "waited for readiness: %s" % e.exception)
        return str(e.exception)

    def test_a_path_with_no_socket(self):
        msg = self.refused_at_once(os.path.join(self.root, "kv", "agent.sock"))
        self.assertIn("no socket there", msg)

    def test_a_folder_names_the_sockets_in_it(self):
        kv = self.listen("kv", "agent.sock")
        msg = self.refused_at_once(self.root)
        self.assertIn("is a folder", msg)
        self.assertIn(kv, msg)

    def test_several_pools_on_the_host_are_named(self):
        # The walkthrough's host: no pod socket, two pools' sockets under the host's socket directory.
        host = os.path.join(self.root, "run")
        kv, kv2 = self.listen("run", "kv", "agent.sock"), self.listen("run", "kv2", "agent.sock")
        env = {k: v for k, v in os.environ.items() if k != "FABRICXFER_SOCKET"}
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("fabricxfer.client.DEFAULT_SOCKET", os.path.join(host, "agent.sock")), \
                mock.patch("fabricxfer.client.HOST_SOCKET_DIRS", (host,)):
            msg = self.refused_at_once()
        self.assertIn(kv, msg)
        self.assertIn(kv2, msg)


@unittest.skipUnless(SOCKET, "FABRICXFER_SOCKET not set: run through go test ./client")
class ExampleTest(unittest.TestCase):
    def test_the_example_finds_the_socket_as_client_does(self):
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, FABRICXFER_SOCKET=SOCKET, PYTHONPATH=here)
        res = subprocess.run([sys.executable, os.path.join(here, "examples", "copy_between_regions.py")], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("checksums match", res.stdout)


if __name__ == "__main__":
    unittest.main()
