# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Client() without a path dials $FABRICXFER_SOCKET, the variable a prepared fabricxfer.io claim sets, else a
pod's mounted socket, else the host's one pool socket."""

import os
import socket
import tempfile
import unittest
from unittest import mock

from fabricxfer.client import Client, default_socket

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
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("fabricxfer.client.HOST_SOCKET_DIRS", (tempfile.mkdtemp(),)), \
                mock.patch("fabricxfer.client.grpc.insecure_channel", side_effect=Stop) as channel:
            with self.assertRaises(Stop):
                Client()
        self.assertEqual(channel.call_args[0][0], "unix:/run/fabricxfer/agent.sock")

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


if __name__ == "__main__":
    unittest.main()
