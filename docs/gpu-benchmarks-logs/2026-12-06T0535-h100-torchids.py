# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors
#
# Variants of reading a short torch CPU id tensor into packed bytes, timed on the machine with torch.
import sys, struct, timeit
sys.path.insert(0, "client/python")
import torch
from fabricxfer import blocks

n = 300000
def tm(name, fn):
    best = min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6
    print("%-34s %.3f us" % (name, best))

T64, T32 = torch.int64, torch.int32
P1 = {8: struct.Struct("<q").pack, 4: struct.Struct("<i").pack}
SHORT = blocks._SHORT_PACKS

def v_is(t):
    dt = t.dtype
    width = 8 if dt is T64 else 4 if dt is T32 else None
    if width is None:
        raise ValueError
    if not t.is_cpu:
        raise ValueError
    n = t.numel()
    if n <= 16:
        v = t.tolist()
        if type(v) is int:
            return memoryview(P1[width](v)), width, 1
        if not v or type(v[0]) is int:
            return memoryview(SHORT[width, n](*v)), width, n
    raise NotImplementedError

def v_bytes(t):
    dt = t.dtype
    width = 8 if dt is T64 else 4 if dt is T32 else None
    if width is None:
        raise ValueError
    if not t.is_cpu:
        raise ValueError
    n = t.numel()
    if n <= 16:
        v = t.tolist()
        if type(v) is int:
            return P1[width](v), width, 1
        if not v or type(v[0]) is int:
            return SHORT[width, n](*v), width, n
    raise NotImplementedError

for shape in ((1,), (8,), ()):
    t = torch.zeros(shape, dtype=torch.int64) if shape else torch.tensor(5, dtype=torch.int64)
    print("== ids", shape)
    tm("blocks._from_torch (main)", lambda: blocks._from_torch(t, None))
    tm("blocks.short_ids (main)", lambda: blocks.short_ids(t))
    tm("dtype by identity", lambda: v_is(t))
    tm("dtype by identity, bytes", lambda: v_bytes(t))
    assert bytes(v_is(t)[0]) == bytes(blocks._from_torch(t, None)[0])
t = torch.zeros(1, dtype=torch.int64)
for name, fn in (("t.shape[0]", lambda: t.shape[0]), ("len(t)", lambda: len(t)), ("t.dim()", lambda: t.dim()),
                 ("t.dtype is T64", lambda: t.dtype is T64), ("t.device.type", lambda: t.device.type),
                 ("struct pack 1", lambda: P1[8](3)), ("memoryview(b)", lambda: memoryview(b"12345678")),
                 ("dict get dtype", lambda: blocks._TORCH_WIDTHS.get(t.dtype))):
    tm(name, fn)
