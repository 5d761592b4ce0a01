#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""NCCL send/recv bandwidth between GPU 0 and GPU 1 of one host, with PyTorch.

The peer figure to put beside the xgmi engine's P2P copies (gpubench prints
those). Needs two visible GPUs; run as:

    python3 hack/bench/nccl_sendrecv.py [--sizes 1MiB,64MiB,1GiB] [--iters 20]

It starts one process per GPU, moves a buffer from rank 0 to rank 1 with
dist.send/dist.recv, and prints the median one-way GB/s (10^9 bytes counted
once) per size. NVLink multicast stays off (NCCL_NVLS_ENABLE=0): it is not
what a point-to-point copy uses, and it must not be turned on here.
"""
import argparse
import os
import statistics

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[: -len(u)]) * m
    return int(s)


def worker(rank, sizes, iters, port):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.cuda.set_device(rank)
    for size in sizes:
        buf = torch.empty(size, dtype=torch.uint8, device=f"cuda:{rank}")
        if rank == 0:
            buf.random_(0, 255)
        times = []
        for i in range(iters + 3):
            dist.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if rank == 0:
                dist.send(buf, dst=1)
            else:
                dist.recv(buf, src=0)
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end) / 1e3)
        if rank == 1:
            med = statistics.median(times)
            print(f"nccl send/recv GPU0->GPU1 {size:>12} B  median {med * 1e3:8.3f} ms  {size / med / 1e9:8.2f} GB/s", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1MiB,64MiB,1GiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"needs two GPUs, {torch.cuda.device_count()} visible")
    mp.spawn(worker, args=([parse_size(s) for s in a.sizes.split(",")], a.iters, a.port), nprocs=2)


if __name__ == "__main__":
    main()
