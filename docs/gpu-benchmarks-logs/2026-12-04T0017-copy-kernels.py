# SPDX-License-Identifier: Apache-2.0
# Copyright The fabricxfer Authors

"""Contiguous device-to-device copies of 64 MiB and 1 GiB on one GPU, timed by CUDA events (median and 10th
percentile of 200 single copies), every byte compared after each variant. Needs torch and CuPy.

    python3 2026-12-04T0017-copy-kernels.py shapes   torch copy_, cudaMemcpyAsync and SM copy kernels of several shapes
    python3 2026-12-04T0017-copy-kernels.py split    the same copy split across streams: copy engines, or a copy
                                                     engine beside an SM kernel (the 00:23 log)"""

import cupy as cp, numpy as np, torch, sys

src_code = r'''
typedef uint4 v16;
extern "C" __global__ void gs4(v16* __restrict__ d, const v16* __restrict__ s, unsigned long long n) {
  unsigned long long lanes = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * lanes < n; i += 4 * lanes) {
    v16 a = s[i], b = s[i + lanes], c = s[i + 2 * lanes], e = s[i + 3 * lanes];
    d[i] = a; d[i + lanes] = b; d[i + 2 * lanes] = c; d[i + 3 * lanes] = e;
  }
  for (; i < n; i += lanes) d[i] = s[i];
}
template <int U, bool H>
__device__ __forceinline__ void tile(v16* __restrict__ d, const v16* __restrict__ s, unsigned long long n) {
  unsigned long long per = (unsigned long long)blockDim.x * U;
  for (unsigned long long base = (unsigned long long)blockIdx.x * per; base < n; base += (unsigned long long)gridDim.x * per) {
    v16 r[U];
    unsigned long long i = base + threadIdx.x;
    if (base + per <= n) {
#pragma unroll
      for (int k = 0; k < U; k++) r[k] = H ? __ldcs(&s[i + k * blockDim.x]) : s[i + k * blockDim.x];
#pragma unroll
      for (int k = 0; k < U; k++) { if (H) __stcs(&d[i + k * blockDim.x], r[k]); else d[i + k * blockDim.x] = r[k]; }
    } else {
      for (int k = 0; k < U; k++) if (i + k * blockDim.x < n) d[i + k * blockDim.x] = s[i + k * blockDim.x];
    }
  }
}
extern "C" __global__ void t4(v16* d, const v16* s, unsigned long long n) { tile<4, true>(d, s, n); }
extern "C" __global__ void t8(v16* d, const v16* s, unsigned long long n) { tile<8, true>(d, s, n); }
extern "C" __global__ void t16(v16* d, const v16* s, unsigned long long n) { tile<16, true>(d, s, n); }
extern "C" __global__ void p8(v16* d, const v16* s, unsigned long long n) { tile<8, false>(d, s, n); }
'''
mod = cp.RawModule(code=src_code, options=('-std=c++17', '--gpu-architecture=sm_90'))
props = cp.cuda.runtime.getDeviceProperties(0)
sms = props['multiProcessorCount']
print('sms', sms, props['name'])

CHECK = []
def med_time(fn, iters=200, warm=10):
    st = cp.cuda.get_current_stream()
    CHECK[0][1].zero_()
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(iters):
        a = cp.cuda.Event(); b = cp.cuda.Event()
        a.record(st); fn(); b.record(st); b.synchronize()
        ts.append(cp.cuda.get_elapsed_time(a, b) * 1000)
    ts.sort()
    torch.cuda.synchronize()
    assert torch.equal(CHECK[0][0], CHECK[0][1])
    return ts[len(ts) // 2], ts[len(ts) // 10]

streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
t16 = mod.get_function('t16')
t4 = mod.get_function('t4')

def split(dst, src, nbytes, parts):
    """parts: list of (kind, fraction); each part on its own stream, joined on the current stream."""
    cur = cp.cuda.get_current_stream()
    ev0 = cp.cuda.Event(disable_timing=True); ev0.record(cur)
    off = 0
    evs = []
    for k, (kind, frac) in enumerate(parts):
        n = nbytes - off if k == len(parts) - 1 else (int(nbytes * frac) // 4096) * 4096
        st = streams[k]
        st.wait_event(ev0)
        if kind == 'ce':
            cp.cuda.runtime.memcpyAsync(dst.data.ptr + off, src.data.ptr + off, n, 3, st.ptr)
        else:
            with st:
                grid = max(1, min(sms * 4, n // (512 * 16 * 16)))
                t16((grid,), (512,), (dst.data.ptr + off, src.data.ptr + off, cp.uint64(n // 16)))
        e = cp.cuda.Event(disable_timing=True); e.record(st); evs.append(e)
        off += n
    for e in evs:
        cur.wait_event(e)


def each_size(fill):
    """Runs fill(res, nbytes, torch src, torch dst, cupy src, cupy dst) for 64 MiB and 1 GiB and prints what it
    timed, fastest first, against torch's copy_."""
    for nbytes in (64 << 20, 1 << 30):
        ts_src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device='cuda')
        ts_dst = torch.empty_like(ts_src)
        CHECK[:] = [(ts_src, ts_dst)]
        src = cp.asarray(ts_src); dst = cp.asarray(ts_dst)
        res = {}
        fill(res, nbytes, ts_src, ts_dst, src, dst)
        torch.cuda.synchronize()
        ref = res[next(k for k in res if k.startswith('torch copy_'))][0]
        print(f'== {nbytes >> 20} MiB (median / p10 us, TB/s r+w at median, vs torch)')
        for k_, (m, p) in sorted(res.items(), key=lambda kv: kv[1][0]):
            print(f'{k_:28s} {m:8.2f} {p:8.2f}  {2 * nbytes / m / 1e6:6.2f}  {ref / m:5.2f}')
        del ts_src, ts_dst, src, dst
        torch.cuda.empty_cache()


def fill_shapes(res, nbytes, ts_src, ts_dst, src, dst):
    n16 = nbytes // 16
    res['torch copy_'] = med_time(lambda: ts_dst.copy_(ts_src))
    res['memcpyAsync'] = med_time(lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3, cp.cuda.get_current_stream().ptr))
    k = mod.get_function('gs4')
    for grid, block in ((sms * 4, 256), (sms * 8, 256), (sms * 4, 512), (sms * 2, 1024)):
        res[f'gs4 {grid}x{block}'] = med_time(lambda: k((grid,), (block,), (dst, src, cp.uint64(n16))))
    for name, U in (('t4', 4), ('t8', 8), ('t16', 16), ('p8', 8)):
        k = mod.get_function(name)
        for block in (256, 512):
            full = (n16 + block * U - 1) // (block * U)
            for grid in (sms * 2, sms * 4, sms * 8, min(full, 1 << 30)):
                if grid > full:
                    continue
                res[f'{name} {grid}x{block}'] = med_time(lambda: k((grid,), (block,), (dst, src, cp.uint64(n16))))


def fill_split(res, nbytes, ts_src, ts_dst, src, dst):
    for rep in range(2):
        res[f'torch copy_ #{rep}'] = med_time(lambda: ts_dst.copy_(ts_src))
        res[f'memcpyAsync #{rep}'] = med_time(lambda: cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, 3, cp.cuda.get_current_stream().ptr))
        for parts in ([('ce', 0.5), ('ce', 0.5)], [('ce', .25)] * 4, [('ce', 0.5), ('k', 0.5)], [('ce', 0.6), ('k', 0.4)],
                      [('ce', 0.7), ('k', 0.3)], [('ce', 0.4), ('k', 0.6)], [('k', 1.0)]):
            name = '+'.join(f'{k}{f:g}' for k, f in parts) + f' #{rep}'
            res[name] = med_time(lambda: split(dst, src, nbytes, parts))


if __name__ == "__main__":
    each_size({"shapes": fill_shapes, "split": fill_split}[sys.argv[1] if len(sys.argv) > 1 else "shapes"])
