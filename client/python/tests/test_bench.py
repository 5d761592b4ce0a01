# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""The benchmarks' pure parts, without a GPU or torch: arguments, the client command and environment, the
table; and bench_host.py end to end at a small size against the test agent."""

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest
from unittest import mock
from contextlib import redirect_stderr

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)

import bench_gpu  # noqa: E402

SOCKET = os.environ.get("FABRICXFER_SOCKET", "")


class GPUBenchPureTest(unittest.TestCase):
    def test_arguments(self):
        a = bench_gpu.parse_args([])
        self.assertEqual((a.agent, a.pool_name, a.cases, a.expandable, a.client), ("bin/agent", "kv",
                                                                                     list(bench_gpu.CASES), False,
                                                                                     False))
        a = bench_gpu.parse_args(["--cases", "a, d", "--expandable", "--iters", "5"])
        self.assertEqual((a.cases, a.expandable, a.iters), (["a", "d"], True, 5))
        for bad in (["--cases", "a,z"], ["--iters", "0"], ["--depth", "0"], ["--idle", "-1"], ["--client"]):
            with self.subTest(bad), redirect_stderr(io.StringIO()):
                with self.assertRaises(SystemExit):
                    bench_gpu.parse_args(bad)
        self.assertEqual(set(bench_gpu.CASE_NAMES), set(bench_gpu.CASES))
        for c in bench_gpu.CASES:
            self.assertTrue(hasattr(bench_gpu.Bench, "case_" + c.replace("-", "_")), c)
        self.assertEqual(bench_gpu.case_name("c64-pipe", bench_gpu.parse_args(["--depth", "4"])),
                         "c 64 MiB 4 in flight, per copy")
        self.assertEqual(bench_gpu.case_name("d-idle", bench_gpu.parse_args(["--idle", "0.005"])),
                         "d 4 KiB after 5 ms idle, p50")

    def test_busy_process_command(self):
        a = bench_gpu.parse_args(["--busy", "--device", "1", "--timeout", "300"])
        self.assertTrue(a.busy)
        self.assertFalse(bench_gpu.parse_args([]).busy)
        cmd = bench_gpu.busy_command(a)
        self.assertEqual(cmd[:3], [sys.executable, os.path.abspath(bench_gpu.__file__), "--busy-loop"])
        back = bench_gpu.parse_args(cmd[2:])
        # The busy process computes on the benchmark's GPU and stops by itself after the run's bound.
        self.assertEqual((back.busy_loop, back.client, back.device, back.timeout), (True, False, 1, 300.0))

    def test_mps_folders_are_the_runs_own(self):
        self.assertFalse(bench_gpu.parse_args([]).mps)
        self.assertTrue(bench_gpu.parse_args(["--mps"]).mps)
        env = bench_gpu.mps_env("/tmp/fxbench1")
        # Only processes given these folders join the run's MPS server; nothing of the machine's default one.
        self.assertEqual(env, {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/fxbench1/mps/pipe",
                               "CUDA_MPS_LOG_DIRECTORY": "/tmp/fxbench1/mps/log"})

    def test_mps_without_control_daemon_fails_before_anything_runs(self):
        with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {"PATH": d}):  # no control daemon here
            with self.assertRaisesRegex(RuntimeError, "nvidia-cuda-mps-control is not on PATH"):
                bench_gpu.start_mps(bench_gpu.mps_env(d))

    def test_client_command_and_environment(self):
        a = bench_gpu.parse_args(["--expandable", "--json", "out.json", "--cases", "b", "--warmup-seconds", "0.5",
                                  "--idle", "0.005", "--no-mailbox", "--interleave"])
        cmd = bench_gpu.client_command(a, "/tmp/x/kv/agent.sock")
        self.assertEqual(cmd[:3], [sys.executable, os.path.abspath(bench_gpu.__file__), "--client"])
        back = bench_gpu.parse_args(cmd[2:])
        self.assertEqual((back.client, back.socket, back.cases, back.expandable, back.json, back.warmup_seconds,
                          back.idle, back.no_mailbox, back.interleave),
                         (True, "/tmp/x/kv/agent.sock", ["b"], True, os.path.abspath("out.json"), 0.5, 0.005, True,
                          True))
        self.assertFalse(bench_gpu.parse_args(bench_gpu.client_command(bench_gpu.parse_args([]), "s")[2:]).interleave)
        env = bench_gpu.client_env(a, {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:False"})
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "max_split_size_mb:64,expandable_segments:True")
        self.assertTrue(env["PYTHONPATH"].startswith(os.path.dirname(BENCH)))
        env = bench_gpu.client_env(bench_gpu.parse_args([]), {})
        self.assertEqual(env["PYTORCH_CUDA_ALLOC_CONF"], "expandable_segments:False")

    def test_table(self):
        rs = [bench_gpu.result("a scattered", 11059200, 2.0, 4.0, True),
              bench_gpu.result("b layers", 1 << 30, None, None, error="ValueError: spans 9 VMM allocations"),
              bench_gpu.result("d rtt", 4096, 0.05, 0.01, False, note="p99 ...")]
        self.assertAlmostEqual(rs[0]["ratio"], 2.0)
        self.assertAlmostEqual(rs[0]["fabricxfer_gbps"], 11059200 / 2e6)
        self.assertIsNone(rs[1]["ratio"])
        text = bench_gpu.format_table(rs)
        lines = text.splitlines()
        self.assertIn("fabricxfer ms", lines[0])
        self.assertIn("ratio", lines[0])
        self.assertRegex(lines[2], r"^a scattered\s+2\.0000\s+5\.53\s+4\.0000\s+2\.76\s+2\.00\s+ok$")
        self.assertRegex(lines[3], r"^b layers(\s+-){5}\s+ERROR$")
        self.assertTrue(lines[4].endswith("DIFFERS"))
        self.assertIn("b layers: ValueError: spans 9 VMM allocations", text)
        self.assertIn("d rtt: p99", text)
        json.dumps(rs)
        self.assertIn("case", bench_gpu.format_table([]))

    def test_interleaved_timing(self):
        # Both sides' calls in the order they run, with a clock that moves only in the calls: ours take 2, torch's 1.
        def bench(*argv):
            b = bench_gpu.Bench.__new__(bench_gpu.Bench)
            b.a = bench_gpu.parse_args(list(argv) + ["--warmup", "2", "--iters", "3", "--warmup-seconds", "0"])
            b.log, b.now = [], 0.0
            b.sync = lambda: b.log.append("sync")
            return b

        def run(b):
            def call(side, cost):
                def fn(i):
                    b.log.append("%s%d" % (side, i))
                    b.now += cost
                return fn
            with mock.patch.object(bench_gpu.time, "perf_counter", lambda: b.now):
                return bench_gpu.Bench.time_pair(b, call("ours", 2.0), call("torch", 1.0),
                                                 prepare=lambda i: b.log.append("prep%d" % i))

        b = bench("--interleave")
        ours_t, torch_t = run(b)
        self.assertEqual((ours_t, torch_t), ([2.0] * 3, [1.0] * 3))
        timed = b.log[b.log.index("ours2", b.log.index("torch1") + 1) - 1:]
        self.assertEqual(timed, ["prep2", "ours2", "prep2", "sync", "torch2", "sync",
                                 "prep3", "ours3", "prep3", "sync", "torch3", "sync",
                                 "prep4", "ours4", "prep4", "sync", "torch4", "sync"])
        extras = bench_gpu.Bench.paired(b, [2.0, 4.0, 2.0], [1.0, 1.0, 3.0])
        self.assertEqual(extras, {"pair_ratio": 0.5, "pair_low": 0.25, "pair_high": 1.5})
        text = bench_gpu.format_table([bench_gpu.result("c 64 MiB", 1 << 26, 2.0, 1.0, True, **extras)])
        self.assertIn("c 64 MiB: interleaved, median of the pairs' ratios 0.50 (lowest 0.25, highest 1.50)", text)

        b = bench()  # all of ours, then all of torch's
        ours_t, torch_t = run(b)
        self.assertEqual((ours_t, torch_t), ([2.0] * 3, [1.0] * 3))
        calls = [x for x in b.log if x.startswith(("ours", "torch"))]
        last_ours = max(i for i, x in enumerate(calls) if x.startswith("ours"))
        self.assertTrue(all(x.startswith("torch") for x in calls[last_ours + 1:]) and calls[-1] == "torch4")
        self.assertEqual(bench_gpu.Bench.paired(b, ours_t, torch_t), {})

    def test_timing_in_rounds(self):
        # A clock that moves only in the calls, on a machine that slows down: every call costs a little more than
        # the one before it, and ours cost twice what torch's cost at the same moment.
        def run(*argv):
            b = bench_gpu.Bench.__new__(bench_gpu.Bench)
            b.a = bench_gpu.parse_args(["--warmup", "1", "--warmup-seconds", "0"] + list(argv))
            b.log, b.now, b.cost = [], 0.0, 1.0
            b.sync = lambda: b.log.append("sync")

            def call(side, share):
                def fn(i):
                    b.log.append("%s%d" % (side, i))
                    b.now += b.cost * share
                    b.cost += 0.1
                return fn

            with mock.patch.object(bench_gpu.time, "perf_counter", lambda: b.now):
                ours_t, torch_t = bench_gpu.Bench.time_pair(b, call("ours", 2.0), call("torch", 1.0))
            return [x for x in b.log if x.startswith(("ours", "torch"))], ours_t, torch_t, bench_gpu.Bench.paired(
                b, ours_t, torch_t)

        calls, ours_t, torch_t, extras = run("--iters", "5", "--rounds", "2")
        # Warm-up (one call a side), then two rounds of three and two calls, each side's first call of a round
        # repeated untimed first.
        self.assertEqual(calls[2:], ["ours1", "ours1", "ours2", "ours3", "torch1", "torch1", "torch2", "torch3",
                                     "ours4", "ours4", "ours5", "torch4", "torch4", "torch5"])
        self.assertEqual((len(ours_t), len(torch_t)), (5, 5))
        self.assertEqual(extras["rounds"], 2)
        self.assertTrue(extras["round_low"] <= extras["round_ratio"] <= extras["round_high"], extras)
        text = bench_gpu.format_table([bench_gpu.result("c 64 MiB", 1 << 26, 2.0, 1.0, True, **extras)])
        self.assertRegex(text, r"c 64 MiB: in 2 rounds, median of the rounds' ratios \d\.\d\d \(lowest")

        # The true ratio is 0.5: all of ours and then all of torch's lays the drift on torch's side; rounds spread it.
        _, ours_t, torch_t, _ = run("--iters", "40")
        sequential = statistics.median(torch_t) / statistics.median(ours_t)
        _, ours_t, torch_t, extras = run("--iters", "40", "--rounds", "8")
        self.assertLess(abs(statistics.median(torch_t) / statistics.median(ours_t) - 0.5), abs(sequential - 0.5) / 3)
        self.assertLess(abs(extras["round_ratio"] - 0.5), abs(sequential - 0.5) / 3)

        with self.assertRaises(SystemExit), mock.patch("sys.stderr"):
            bench_gpu.parse_args(["--rounds", "2", "--interleave"])
        back = bench_gpu.parse_args(bench_gpu.client_command(bench_gpu.parse_args(["--rounds", "3"]), "s")[2:])
        self.assertEqual(back.rounds, 3)

    def test_missing_agent_says_how_to_build_it(self):
        with self.assertRaises(SystemExit) as e:
            bench_gpu.find_agent("/nonexistent/agent")
        self.assertIn("go build -o bin/agent ./cmd/agent", str(e.exception))


@unittest.skipUnless(SOCKET, "FABRICXFER_SOCKET not set: run through go test ./client")
class HostBenchTest(unittest.TestCase):
    def test_host_bench_runs_small(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy not installed (apt-get install python3-numpy)")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "host.json")
            p = subprocess.run([sys.executable, os.path.join(BENCH, "bench_host.py"), "--socket", SOCKET, "--blocks",
                                "2048", "--ids", "512", "--iters", "3", "--warmup", "1", "--round-trips", "300", "--mailbox", "checked",
                                "--json", out],
                               capture_output=True, text=True, timeout=120,
                               env=dict(os.environ, PYTHONPATH=os.path.dirname(BENCH)))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            self.assertIn("ratio (numpy time / ours)", p.stdout)
            with open(out) as f:
                r = json.load(f)
            self.assertTrue(r["verified"])
            self.assertTrue(r["frames"].startswith("sealed mailbox"), r["frames"])
            self.assertEqual((r["ids"], r["blocks"], r["bytes"]), (512, 2048, 512 * 720))
            self.assertGreater(r["fabricxfer_ms"], 0)
            rt = r["round_trip"]
            self.assertTrue(rt["verified"])
            self.assertEqual(rt["round_trips"], 300)
            for who in ("fabricxfer", "numpy"):
                self.assertGreater(rt[who + "_p50_us"], 0)
                self.assertLessEqual(rt[who + "_p50_us"], rt[who + "_p99_us"])
            self.assertIn("one 4 KiB block a call", p.stdout)


if __name__ == "__main__":
    unittest.main()


import bench_tcp  # noqa: E402


class TCPBenchPureTest(unittest.TestCase):
    def test_arguments(self):
        a = bench_tcp.parse_args([])
        self.assertEqual((a.cases, a.iters, a.streams, a.role), (list(bench_tcp.CASES), 5, 4, None))
        with redirect_stderr(io.StringIO()):
            for bad in (["--cases", "raw,nope"], ["--iters", "0"], ["--streams", "0"], ["--warmup", "-1"]):
                with self.assertRaises(SystemExit, msg=bad):
                    bench_tcp.parse_args(bad)

    def test_ratios_only_from_verified_cases(self):
        rs = [{"case": "raw", "gbps": 10.0, "verified": True}, {"case": "gpu-1g", "gbps": 8.5, "verified": True},
              {"case": "blocks", "gbps": 7.0, "verified": True}, {"case": "layers", "gbps": 9.0, "verified": False},
              {"case": "host", "gbps": 9.0, "verified": True}, {"case": "gpu-11m", "gbps": 7.7, "verified": True}]
        r = bench_tcp.ratios(rs)
        self.assertAlmostEqual(r["blocks / gpu-11m"], 7.0 / 7.7)
        self.assertAlmostEqual(r["gpu-1g / raw"], 0.85)
        self.assertAlmostEqual(r["blocks / gpu-1g"], 7.0 / 8.5)
        self.assertAlmostEqual(r["host / raw"], 0.9)
        self.assertNotIn("layers / gpu-1g", r)  # a case whose bytes differ gives no figure

    def test_paired_ratio(self):
        # Writes paired in time: the machine slowed both in the second pair, which the ratio of medians would
        # fold in unevenly; the paired ratio is the median of each pair's own.
        contiguous, blocks = [2.0, 4.0, 2.2], [2.5, 4.4, 2.0]
        ratio, low, high = bench_tcp.pair_ratio(contiguous, blocks)
        self.assertAlmostEqual(ratio, 4.0 / 4.4)
        self.assertAlmostEqual(low, 0.8)
        self.assertAlmostEqual(high, 1.1)
        rs = [{"case": "gpu-11m paired", "gbps": 5.0, "verified": True},
              {"case": "blocks paired", "gbps": 4.0, "verified": True, "pair_ratio": ratio}]
        self.assertAlmostEqual(bench_tcp.ratios(rs)["blocks / gpu-11m paired"], ratio)
        # Either half unchecked: no figure.
        self.assertNotIn("blocks / gpu-11m paired", bench_tcp.ratios([dict(rs[0], verified=False), rs[1]]))
        self.assertNotIn("blocks / gpu-11m paired", bench_tcp.ratios([rs[0], dict(rs[1], verified=False)]))
        self.assertNotIn("blocks / gpu-11m paired", bench_tcp.ratios([rs[1]]))
        # The read pair has its own figure, from its own halves only.
        reads = [{"case": "gpu-11m read paired", "gbps": 5.0, "verified": True},
                 {"case": "blocks read paired", "gbps": 4.5, "verified": True, "pair_ratio": 0.9}]
        both = bench_tcp.ratios(rs + reads)
        self.assertAlmostEqual(both["blocks / gpu-11m read paired"], 0.9)
        self.assertAlmostEqual(both["blocks / gpu-11m paired"], ratio)
        self.assertNotIn("blocks / gpu-11m read paired", bench_tcp.ratios(rs + reads[1:]))
        self.assertEqual(bench_tcp.parse_args(["--cases", "pair,pair-read"]).cases, ["pair", "pair-read"])

    def test_table(self):
        rs = [{"case": "raw", "bytes": 1 << 30, "seconds": 0.1, "gbps": 10.7, "verified": True},
              {"case": "gpu-1g", "error": "TransferFailed: peer lost"}]
        t = bench_tcp.format_table(rs)
        self.assertIn("raw", t)
        self.assertIn("10.70", t)
        self.assertIn("ERROR", t)
        self.assertIn("gpu-1g: TransferFailed: peer lost", t)
