# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Client() without a path dials $FABRICXFER_SOCKET, the variable a prepared fabricxfer.io claim sets."""

import os
import unittest
from unittest import mock

from fabricxfer.client import Client

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
                mock.patch("fabricxfer.client.grpc.insecure_channel", side_effect=Stop) as channel:
            with self.assertRaises(Stop):
                Client()
        self.assertEqual(channel.call_args[0][0], "unix:/run/fabricxfer/agent.sock")


if __name__ == "__main__":
    unittest.main()
