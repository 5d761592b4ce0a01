# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

# Copies back to back on one stream with a marker after each: does a marker keep the copy engine from
# overlapping consecutive copies? CUDA events around each round of 8 copies, median of 50 rounds, per copy.
import ctypes, statistics, torch

lib = ctypes.CDLL("libcuda.so.1")
dev = torch.device("cuda:0")
torch.cuda.init()
word = torch.zeros(16, dtype=torch.int32, pin_memory=True)
dptr = ctypes.c_uint64(0)
rc = lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(word.data_ptr()), 0)
if rc != 0:
    dptr = ctypes.c_uint64(word.data_ptr())
print("cuMemHostGetDevicePointer rc", rc)
write = lib.cuStreamWriteValue32_v2
write.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
stream = torch.cuda.current_stream()
sh = ctypes.c_void_p(stream.cuda_stream)
seq = [0]

def marker(kind):
    if kind == "event":
        torch.cuda.Event().record(stream)
    elif kind in ("word", "word-nobarrier"):
        seq[0] += 1
        r = write(sh, dptr.value, seq[0], 0 if kind == "word" else 1)
        if r != 0:
            raise RuntimeError("cuStreamWriteValue32 flags %d: CUresult %d" % (0 if kind == "word" else 1, r))

for size in (64 << 20, 1 << 30):
    src = torch.randint(0, 255, (size,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    for kind in ("none", "event", "word", "word-nobarrier", "last-only", "none", "word"):
        times = []
        try:
            marker(kind)
            torch.cuda.synchronize()
        except RuntimeError as err:
            print("%5d MiB  marker %s refused: %s" % (size >> 20, kind, err))
            continue
        for r in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream)
            for i in range(8):
                dst.copy_(src)
                if kind in ("event", "word", "word-nobarrier") or (kind == "last-only" and i == 7):
                    marker("word" if kind == "last-only" else kind)
            e.record(stream)
            e.synchronize()
            times.append(s.elapsed_time(e) * 1000 / 8)
        single = []
        for r in range(50):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(stream); dst.copy_(src); e.record(stream); e.synchronize()
            single.append(s.elapsed_time(e) * 1000)
        ok = torch.equal(dst, src)
        print("%5d MiB  8 copies, marker %-15s %8.1f us per copy (p10 %.1f, p90 %.1f); one copy alone %.1f us; word %d; equal %s" % (
            size >> 20, kind, statistics.median(times), sorted(times)[5], sorted(times)[45], statistics.median(single),
            word[0].item(), ok))
