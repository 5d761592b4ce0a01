#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Host benchmark of transfer_blocks: scattered blocks between two memfd pools through a running agent, against
numpy's fancy-index copy (dst[ids] = src[ids]) on the same mapped memory, in this process.

    agent standalone --socket-dir /tmp/fx &          # or xferctl local-agent --socket-dir /tmp/fx --pool kv
    PYTHONPATH=client/python /usr/bin/python3 client/python/bench/bench_host.py --socket /tmp/fx/kv/agent.sock

Two pools of --blocks blocks of --block-bytes (one region, one layout each); every iteration moves --ids
random distinct blocks to random distinct blocks (ids drawn before the timing). Prints the median time and
bandwidth of both, their ratio (numpy time / ours) and how long building the request takes.

Then --round-trips waited calls of one 4 KiB block (between two pools of 256 such blocks, one-id int64 arrays as a
scheduler hands them over) against numpy's own dst[ids] = src[ids] with the same arrays: p50, p99 and p99.9 of
each, the fixed cost of a call through the socket that a small copy cannot hide.
"""

import argparse
import json
import os
import statistics
import sys
import time

try:
    import fabricxfer  # noqa: F401
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from fabricxfer import blocks
from fabricxfer.agent.v1 import agent_pb2 as pb
from fabricxfer.client import Client, shared_memory, to_layout


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="agent socket (<socket dir>/<pool>/agent.sock)")
    p.add_argument("--blocks", type=int, default=262144, help="blocks per pool (default 262144)")
    p.add_argument("--block-bytes", type=int, default=720, help="bytes per block (default 720)")
    p.add_argument("--ids", type=int, default=15360, help="blocks moved per call (default 15360)")
    p.add_argument("--iters", type=int, default=30, help="timed iterations (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument("--round-trips", type=int, default=2000,
                   help="timed one-block 4 KiB calls after the scattered case (default 2000; 0: none)")
    p.add_argument("--mailbox", choices=("on", "checked", "off"), default="on",
                   help="frames through the shared-memory mailbox (on: the client's default, sealed on CPUs other "
                        "than x86; checked: sealed here too), or off: on the fast socket only")
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    if a.ids > a.blocks:
        p.error("--ids (%d) exceeds --blocks (%d)" % (a.ids, a.blocks))
    return a


def median_ms(times):
    return statistics.median(times) * 1e3


def quantile_us(times, q):
    s = sorted(times)
    return s[min(len(s) - 1, int(len(s) * q))] * 1e6


ROUND_TRIP_BLOCKS, ROUND_TRIP_BYTES = 256, 4096


def round_trips(c, n):
    """n waited one-block calls between two pools of ROUND_TRIP_BLOCKS blocks of 4 KiB, after as many untimed
    ones, against numpy's indexed copy of the same block; returns the figures and whether the bytes agree."""
    size = ROUND_TRIP_BLOCKS * ROUND_TRIP_BYTES
    fds, views, regions = [], [], []
    try:
        for name in ("bench-rt-src", "bench-rt-dst", "bench-rt-ref"):
            fd, buf = shared_memory(name, size)
            fds.append(fd)
            views.append(np.frombuffer(buf, dtype=np.uint8).reshape(ROUND_TRIP_BLOCKS, ROUND_TRIP_BYTES))
        src, dst, ref = views
        src[:] = np.random.default_rng(2).integers(0, 256, src.shape, dtype=np.uint8)
        regions = [c.register_host(fds[i], 0, size) for i in range(2)]
        src_l = c.register_layout([regions[0]], ROUND_TRIP_BYTES)
        dst_l = c.register_layout([regions[1]], ROUND_TRIP_BYTES)
        remote = to_layout(dst_l)
        ids = [np.array([i], dtype=np.int64) for i in range(ROUND_TRIP_BLOCKS)]
        ours, theirs = [], []
        for i in range(2 * n):
            k = ids[i % ROUND_TRIP_BLOCKS]
            t0 = time.perf_counter()
            c.transfer_blocks("write", src_l, k, remote, k, timeout=30.0)
            if i >= n:
                ours.append(time.perf_counter() - t0)
        for i in range(2 * n):
            k = ids[i % ROUND_TRIP_BLOCKS]
            t0 = time.perf_counter()
            ref[k] = src[k]
            if i >= n:
                theirs.append(time.perf_counter() - t0)
        m = min(2 * n, ROUND_TRIP_BLOCKS)  # the blocks the calls wrote
        ok = np.array_equal(dst[:m], src[:m]) and not dst[m:].any()
        c.deregister_layout(src_l)
        c.deregister_layout(dst_l)
        for r in regions:
            c.deregister(r)
    finally:
        for fd in fds:
            os.close(fd)
    out = {"round_trips": n, "verified": bool(ok)}
    for who, ts in (("fabricxfer", ours), ("numpy", theirs)):
        for q, name in ((0.5, "p50"), (0.99, "p99"), (0.999, "p999")):
            out["%s_%s_us" % (who, name)] = quantile_us(ts, q)
    return out


def frames(c) -> str:
    """How the client's frames travel: "mailbox", "socket", or for a checked mailbox (which carries no call that
    reaches this process's host memory, as every call here does) "sealed mailbox, host memory on the socket"."""
    fast = c._fast
    if fast is None or fast.mailbox is None:
        return "socket"
    return "sealed mailbox, host memory on the socket" if fast._checked else "mailbox"


def main(argv=None) -> int:
    a = parse_args(argv)
    size = a.blocks * a.block_bytes
    moved = a.ids * a.block_bytes
    rng = np.random.default_rng(1)
    mailbox = {"on": True, "checked": "checked", "off": False}[a.mailbox]
    with Client(a.socket, name="bench-host", mailbox=mailbox) as c:
        fds, views, regions = [], [], []
        for name in ("bench-src", "bench-dst"):
            fd, buf = shared_memory(name, size)
            fds.append((fd, buf))
            views.append(np.frombuffer(buf, dtype=np.uint8).reshape(a.blocks, a.block_bytes))
            regions.append(c.register_host(fd, 0, size))
        src, dst = views
        src[:] = (np.arange(a.blocks * a.block_bytes, dtype=np.uint32) % 251).astype(np.uint8).reshape(src.shape)
        src_l = c.register_layout([regions[0]], a.block_bytes)
        dst_l = c.register_layout([regions[1]], a.block_bytes)
        remote = to_layout(dst_l)
        n = a.warmup + a.iters
        pairs = [(rng.choice(a.blocks, a.ids, replace=False).astype(np.int64),
                  rng.choice(a.blocks, a.ids, replace=False).astype(np.int64)) for _ in range(min(n, 8))]

        ours = []
        for i in range(n):
            sids, dids = pairs[i % len(pairs)]
            t0 = time.perf_counter()
            c.transfer_blocks("write", src_l, sids, remote, dids, timeout=30.0)
            if i >= a.warmup:
                ours.append(time.perf_counter() - t0)
        sids, dids = pairs[(n - 1) % len(pairs)]
        ok = np.array_equal(dst[dids], src[sids])

        dst[:] = 0
        theirs = []
        for i in range(n):
            sids, dids = pairs[i % len(pairs)]
            t0 = time.perf_counter()
            dst[dids] = src[sids]
            if i >= a.warmup:
                theirs.append(time.perf_counter() - t0)

        build = []
        for _ in range(200):
            t0 = time.perf_counter()
            lm, w, _ = blocks.pack_ids(sids)
            rm, _, _ = blocks.pack_ids(dids)
            blocks.blocks_frame(pb.OP_WRITE, src_l.id, remote.ref, lm, rm, w)
            build.append(time.perf_counter() - t0)

        ours_ms, numpy_ms = median_ms(ours), median_ms(theirs)
        result = {
            "blocks": a.blocks, "block_bytes": a.block_bytes, "ids": a.ids, "iters": a.iters, "bytes": moved,
            "fabricxfer_ms": ours_ms, "fabricxfer_gbps": moved / ours_ms / 1e6,
            "numpy_ms": numpy_ms, "numpy_gbps": moved / numpy_ms / 1e6,
            "ratio": numpy_ms / ours_ms, "build_us": statistics.median(build) * 1e6, "verified": bool(ok),
            "engines": [e.name for e in c.info.engines if e.available],
            "frames": frames(c),
        }
        for fd, _ in fds:
            os.close(fd)  # the mappings stay, the client keeps its own duplicate until close
        c.deregister_layout(src_l)
        c.deregister_layout(dst_l)
        if a.round_trips > 0:
            result["round_trip"] = rt = round_trips(c, a.round_trips)
            ok = ok and rt["verified"]
            result["verified"] = bool(ok)
    print("%d x %d B blocks of %d-block pools (%.1f MiB per call), median of %d, frames %s:" % (
        a.ids, a.block_bytes, a.blocks, moved / (1 << 20), a.iters, result["frames"]))
    print("  fabricxfer transfer_blocks  %8.3f ms  %7.2f GB/s" % (result["fabricxfer_ms"], result["fabricxfer_gbps"]))
    print("  numpy dst[ids] = src[ids]   %8.3f ms  %7.2f GB/s" % (result["numpy_ms"], result["numpy_gbps"]))
    print("  ratio (numpy time / ours)   %8.2f" % result["ratio"])
    print("  request build               %8.1f us (pack 2 x %d ids + frame)" % (result["build_us"], a.ids))
    rt = result.get("round_trip")
    if rt:
        print("one 4 KiB block a call, %d waited calls after as many untimed (us):" % rt["round_trips"])
        for who, label in (("fabricxfer", "fabricxfer transfer_blocks"), ("numpy", "numpy dst[ids] = src[ids]")):
            print("  %-27s p50 %7.1f  p99 %7.1f  p99.9 %7.1f" % (
                label, rt[who + "_p50_us"], rt[who + "_p99_us"], rt[who + "_p999_us"]))
    print("  bytes verified: %s" % ("yes" if ok else "NO, THEY DIFFER"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
