# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Is a copy between memory another process shared (CUDA IPC, as the agent maps an inference process's tensors)
slower on the GPU than the same copy between the process's own memory? Process A allocates a source and a
destination and shares them through torch.multiprocessing (cudaIpcGetMemHandle / cudaIpcOpenMemHandle); process
B times copy_ between the imported pair and between a pair of its own, alternating, by CUDA events."""

import statistics
import sys

import torch
import torch.multiprocessing as mp

SIZES = {"64 MiB": 64 << 20, "1 GiB": 1 << 30}


def timed(dst, src, reps=50):
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts), min(ts)


def consumer(q, done):
    torch.cuda.set_device(0)
    shared = q.get()
    for name, n in SIZES.items():
        src, dst = shared[name]
        own_src, own_dst = torch.empty_like(src).copy_(src), torch.empty_like(dst)
        for _ in range(10):
            dst.copy_(src)
            own_dst.copy_(own_src)
        torch.cuda.synchronize()
        for rnd in range(3):
            imp = timed(dst, src)
            own = timed(own_dst, own_src)
            print("%-7s round %d: imported pair median %.1f us (min %.1f), own pair %.1f us (min %.1f), ratio %.4f"
                  % (name, rnd, imp[0], imp[1], own[0], own[1], own[0] / imp[0]), flush=True)
        torch.cuda.synchronize()
        if not torch.equal(dst, own_dst):
            print("BYTES DIFFER", name)
    done.set()


if __name__ == "__main__":
    mp.set_start_method("spawn")
    torch.cuda.set_device(0)
    shared = {name: (torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda"),
                     torch.zeros(n, dtype=torch.uint8, device="cuda")) for name, n in SIZES.items()}
    q, done = mp.Queue(), mp.Event()
    p = mp.Process(target=consumer, args=(q, done))
    p.start()
    q.put(shared)
    done.wait(300)
    p.join(60)
    sys.exit(p.exitcode or 0)
