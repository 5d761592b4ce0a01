# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Cost of reading a one-element torch CPU id tensor, ways compared (median ns of 200k, 3 passes).
import ctypes, struct, sys, time, statistics
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "client/python")
import torch, numpy as np
from fabricxfer import blocks
t = torch.zeros(1, dtype=torch.int64)
t2 = torch.arange(8, dtype=torch.int64)
a = np.zeros(1, dtype=np.int64)
def bench(name, fn, n=100000):
    r = []
    for _ in range(3):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        r.append((time.perf_counter_ns() - t0) / n)
    print("%-40s %s ns" % (name, " / ".join("%.0f" % x for x in r)), flush=True)
bench("short_ids(torch 1)", lambda: blocks.short_ids(t))
bench("short_ids(numpy 1)", lambda: blocks.short_ids(a))
bench("short_ids(torch 8)", lambda: blocks.short_ids(t2))
bench("t.dtype", lambda: t.dtype)
bench("t.is_cpu", lambda: t.is_cpu)
bench("t.numel()", lambda: t.numel())
bench("t.item()", lambda: t.item())
bench("t.data_ptr()", lambda: t.data_ptr())
bench("string_at(data_ptr, 8)", lambda: ctypes.string_at(t.data_ptr(), 8))
bench("t.numpy().tobytes()", lambda: t.numpy().tobytes())
bench("t.dim()", lambda: t.dim())
bench("t.is_contiguous()", lambda: t.is_contiguous())
bench("t.nbytes", lambda: t.nbytes)
bench("t.element_size()", lambda: t.element_size())
bench("t.shape", lambda: t.shape)
bench("t.device.type", lambda: t.device.type)
bench("type(t)", lambda: type(t))
