# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
# torch's own copy_ with its synchronize (wall clock) and by CUDA events, 16 MiB to 1 GiB, beside the copier's benchmark

import statistics, time, torch
dev = torch.device("cuda", 0)
for mib in (16, 64, 256, 1024):
    n = mib << 20
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    iters = 2000 if mib <= 64 else 300
    for _ in range(200):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); dst.copy_(src); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gs = []
    for _ in range(50):
        s.record(); dst.copy_(src); e.record(); e.synchronize(); gs.append(s.elapsed_time(e) * 1e3)
    med = statistics.median(ts) * 1e6
    print(f"torch copy_+sync {mib} MiB: median {med:.1f} us ({n/med/1e3:.0f} GB/s), gpu by events {statistics.median(gs):.1f} us")
