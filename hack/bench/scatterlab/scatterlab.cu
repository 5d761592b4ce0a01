// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// scatterlab times variants of the scattered-block copy kernel side by side on
// one GPU, with descriptors in device memory and in pinned host memory, on the
// case the xgmi engine is held to: 15,360 blocks of 720 B drawn at random from
// pools larger than L2. It includes the shipped kernels, so "flat16" is exactly
// what the engine launches. Build and run on a CUDA machine:
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -o scatterlab hack/bench/scatterlab/scatterlab.cu && ./scatterlab
//
// Times are CUDA events around each launch (median of -reps); GB/s counts the
// copied bytes once.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../../../native/kernels/copy.cu"

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e_ = (x);                                                                    \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));     \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

// lab_chunk is how many pieces a block takes per round with VPT vectors per thread.
template <int VPT>
__device__ __forceinline__ fx_u32 lab_chunk(fx_u32 per_piece, fx_u32 cap) {
  fx_u32 c = (VPT * blockDim.x) / per_piece;
  return c < 1 ? 1 : (c > cap ? cap : c);
}

// flat16 with VPT vectors per thread per round (the shipped kernel is VPT 4).
template <int VPT>
__global__ void lab_flat(fx_u64 src_base, fx_u64 dst_base, const fx_off* __restrict__ offs, fx_u32 pieces,
                         fx_u32 per_piece, fx_u32 shift) {
  __shared__ fx_off run[512];
  const fx_u32 chunk = lab_chunk<VPT>(per_piece, 512);
  for (fx_u32 first = blockIdx.x * chunk; first < pieces; first += gridDim.x * chunk) {
    const fx_u32 n = (pieces - first < chunk) ? pieces - first : chunk;
    for (fx_u32 t = threadIdx.x; t < n; t += blockDim.x) run[t] = offs[first + t];
    __syncthreads();
    fx_flat_run<VPT>(src_base, dst_base, run, n, per_piece, shift);
    __syncthreads();
  }
}

// Packed descriptors: piece i is bits [i*B, i*B+B) of a little-endian word
// stream, src index in the low sbits, dst index above, both in units of unit
// bytes (a multiple of 16). 36 bits instead of 64 for 2^18-block pools.
__global__ void lab_packed(fx_u64 src_base, fx_u64 dst_base, const fx_u32* __restrict__ words, fx_u32 pieces,
                           fx_u32 per_piece, fx_u64 unit, fx_u32 sbits, fx_u32 dbits) {
  __shared__ fx_u32 wbuf[512];
  __shared__ fx_off run[256];
  const fx_u32 B = sbits + dbits;
  const fx_u32 chunk = lab_chunk<4>(per_piece, 256);
  for (fx_u32 first = blockIdx.x * chunk; first < pieces; first += gridDim.x * chunk) {
    const fx_u32 n = (pieces - first < chunk) ? pieces - first : chunk;
    const fx_u64 bit0 = (fx_u64)first * B;
    const fx_u32 w0 = (fx_u32)(bit0 >> 5);
    const fx_u32 nw = (fx_u32)((((fx_u64)(first + n) * B + 31) >> 5) - w0) + 2;
    for (fx_u32 t = threadIdx.x; t < nw; t += blockDim.x) wbuf[t] = words[w0 + t];
    __syncthreads();
    for (fx_u32 t = threadIdx.x; t < n; t += blockDim.x) {
      fx_u64 b = (fx_u64)(first + t) * B - ((fx_u64)w0 << 5);
      fx_u32 wi = (fx_u32)(b >> 5), sh = (fx_u32)(b & 31);
      fx_u64 v = ((fx_u64)wbuf[wi] | ((fx_u64)wbuf[wi + 1] << 32)) >> sh;
      if (sh) v |= (fx_u64)wbuf[wi + 2] << (64 - sh);
      fx_off o;
      o.src = (fx_u32)(((v & ((1ull << sbits) - 1)) * unit) >> 4);
      o.dst = (fx_u32)((((v >> sbits) & ((1ull << dbits) - 1)) * unit) >> 4);
      run[t] = o;
    }
    __syncthreads();
    fx_flat_run<4>(src_base, dst_base, run, n, per_piece, 4);
    __syncthreads();
  }
}

// Descriptors carried in the launch's own parameters (up to 32 KB on Volta+
// with CUDA 12.1+): the front end fetches them with the launch.
#define LAB_PARAM_PIECES 4088
struct LabParams {
  fx_u64 src_base, dst_base;
  fx_u32 pieces, per_piece, shift, pad;
  fx_off offs[LAB_PARAM_PIECES];
};
__global__ void lab_param(const __grid_constant__ LabParams p) {
  __shared__ fx_off run[256];
  const fx_u32 chunk = lab_chunk<4>(p.per_piece, 256);
  for (fx_u32 first = blockIdx.x * chunk; first < p.pieces; first += gridDim.x * chunk) {
    const fx_u32 n = (p.pieces - first < chunk) ? p.pieces - first : chunk;
    for (fx_u32 t = threadIdx.x; t < n; t += blockDim.x) run[t] = p.offs[first + t];
    __syncthreads();
    fx_flat_run<4>(p.src_base, p.dst_base, run, n, p.per_piece, p.shift);
    __syncthreads();
  }
}

// One warp per piece, descriptor read by every lane (one broadcast load), no
// shared memory and no barrier: each warp starts copying as soon as its own
// descriptor arrives. G pieces per warp keep 2G loads in flight per lane.
template <int G>
__global__ void lab_warp(fx_u64 src_base, fx_u64 dst_base, const fx_off* __restrict__ offs, fx_u32 pieces,
                         fx_u32 per_piece, fx_u32 shift) {
  const fx_u32 lane = threadIdx.x & 31;
  const fx_u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const fx_u32 warps = (gridDim.x * blockDim.x) >> 5;
  for (fx_u32 p0 = warp * G; p0 < pieces; p0 += warps * G) {
    fx_v16 r[G][2];
    fx_v16* d[G][2];
#pragma unroll
    for (int g = 0; g < G; g++) {
      d[g][0] = d[g][1] = 0;
      if (p0 + g < pieces) {
        fx_off o = offs[p0 + g];
        const fx_v16* s = (const fx_v16*)(src_base + ((fx_u64)o.src << shift));
        fx_v16* t = (fx_v16*)(dst_base + ((fx_u64)o.dst << shift));
#pragma unroll
        for (int h = 0; h < 2; h++) {
          fx_u32 in = lane + 32 * h;
          if (in < per_piece) {
            r[g][h] = s[in];
            d[g][h] = t + in;
          }
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
      for (int h = 0; h < 2; h++)
        if (d[g][h]) *d[g][h] = r[g][h];
  }
}

__global__ void lab_empty() {}

__global__ void lab_fill(fx_u32* p, fx_u64 n, fx_u32 seed) {
  for (fx_u64 i = blockIdx.x * (fx_u64)blockDim.x + threadIdx.x; i < n; i += (fx_u64)gridDim.x * blockDim.x) {
    fx_u32 x = (fx_u32)i * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    p[i] = x ^ (x >> 15);
  }
}

struct Set {
  std::vector<fx_u32> from, to;  // block indices
  std::vector<fx_off> off8;      // byte offsets >> 4
  std::vector<fx_u32> packed;    // 36-bit packed indices
};

int main(int argc, char** argv) {
  int count = 15360, poolBlocks = 262144, reps = 60, gapUs = 0, quick = 0;
  fx_u64 size = 720;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-reps")) reps = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-count")) count = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-pool")) poolBlocks = atoi(argv[i + 1]);
    // -gap-us: the host idles this long before each timed launch, as between
    // transfers that are planned one by one
    if (!strcmp(argv[i], "-gap-us")) gapUs = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "-quick")) quick = atoi(argv[i + 1]);
  }
  const int nsets = 4;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  printf("# %s, %d SMs, L2 %d MiB; %d x %llu B from pools of %d blocks; %d reps; %d us idle before each\n",
         prop.name, sms, prop.l2CacheSize >> 20, count, (unsigned long long)size, poolBlocks, reps, gapUs);
  const fx_u64 pool = (fx_u64)poolBlocks * size;
  unsigned char *src, *dst;
  CK(cudaMalloc(&src, pool));
  CK(cudaMalloc(&dst, pool));
  lab_fill<<<sms * 8, 256>>>((fx_u32*)src, pool / 4, 7);
  CK(cudaDeviceSynchronize());

  fx_u32 sbits = 0, dbits = 0;
  while ((1u << sbits) < (fx_u32)poolBlocks) sbits++;
  dbits = sbits;
  const fx_u32 B = sbits + dbits;
  std::mt19937_64 rng(42);
  std::vector<Set> sets(nsets);
  for (auto& s : sets) {
    std::vector<fx_u32> a(poolBlocks), b(poolBlocks);
    for (int i = 0; i < poolBlocks; i++) a[i] = b[i] = i;
    std::shuffle(a.begin(), a.end(), rng);
    std::shuffle(b.begin(), b.end(), rng);
    a.resize(count);
    b.resize(count);
    // the engine's planner sorts by destination
    std::vector<int> idx(count);
    for (int i = 0; i < count; i++) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](int x, int y) { return b[x] < b[y]; });
    for (int i : idx) {
      s.from.push_back(a[i]);
      s.to.push_back(b[i]);
      s.off8.push_back(fx_off{(fx_u32)(a[i] * size >> 4), (fx_u32)(b[i] * size >> 4)});
    }
    s.packed.assign(((fx_u64)count * B + 31) / 32 + 3, 0);
    for (int i = 0; i < count; i++) {
      fx_u64 v = (fx_u64)s.from[i] | ((fx_u64)s.to[i] << sbits);
      for (fx_u32 k = 0; k < B; k++)
        if (v >> k & 1) {
          fx_u64 bit = (fx_u64)i * B + k;
          s.packed[bit >> 5] |= 1u << (bit & 31);
        }
    }
  }
  const size_t descBytes = std::max(count * sizeof(fx_off), sets[0].packed.size() * 4);
  void* hostDesc;
  CK(cudaHostAlloc(&hostDesc, descBytes, cudaHostAllocMapped));
  std::vector<void*> devOff(nsets), devPacked(nsets);
  for (int k = 0; k < nsets; k++) {
    CK(cudaMalloc(&devOff[k], count * sizeof(fx_off)));
    CK(cudaMemcpy(devOff[k], sets[k].off8.data(), count * sizeof(fx_off), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&devPacked[k], sets[k].packed.size() * 4));
    CK(cudaMemcpy(devPacked[k], sets[k].packed.data(), sets[k].packed.size() * 4, cudaMemcpyHostToDevice));
  }
  void* devStage;
  CK(cudaMalloc(&devStage, descBytes));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  const fx_u32 per = (fx_u32)(size / 16);
  const fx_u64 sb = (fx_u64)src, db = (fx_u64)dst;
  const double bytes = (double)count * size;

  // where: 0 device-resident descriptors, 1 pinned host (rewritten by the CPU
  // before each launch, as the engine does), 2 uploaded with cudaMemcpyAsync
  // then launched (both timed).
  auto measure = [&](const char* name, int where, bool packed,
                     std::function<void(const void* descs, int k)> launch) {
    CK(cudaMemsetAsync(dst, 0, pool, st));
    std::vector<float> t;
    for (int i = -4; i < reps; i++) {
      int k = (i + 4 * nsets) % nsets;
      const void* descs = packed ? devPacked[k] : devOff[k];
      size_t nb = packed ? sets[k].packed.size() * 4 : count * sizeof(fx_off);
      const void* hsrc = packed ? (const void*)sets[k].packed.data() : (const void*)sets[k].off8.data();
      if (gapUs > 0) {
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(gapUs);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      if (where == 1 || where == 2) memcpy(hostDesc, hsrc, nb);
      CK(cudaEventRecord(e0, st));
      if (where == 1) descs = hostDesc;
      if (where == 2) {
        CK(cudaMemcpyAsync(devStage, hostDesc, nb, cudaMemcpyHostToDevice, st));
        descs = devStage;
      }
      launch(descs, k);
      CK(cudaGetLastError());
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 0) t.push_back(ms);
    }
    // the last repetition's blocks must hold their sources
    int k = (reps - 1 + 4 * nsets) % nsets;
    std::vector<unsigned char> hs(pool), hd(pool);
    CK(cudaMemcpy(hs.data(), src, pool, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hd.data(), dst, pool, cudaMemcpyDeviceToHost));
    int bad = 0;
    {
      for (int i = 0; i < count; i++)
        if (memcmp(&hd[sets[k].to[i] * size], &hs[sets[k].from[i] * size], size)) bad++;
    }
    std::sort(t.begin(), t.end());
    float med = t[t.size() / 2];
    const char* loc[] = {"device", "host", "upload", "param"};
    printf("%-34s %-7s median %7.2f us  min %7.2f us  %8.1f GB/s  %s\n", name, loc[where], med * 1e3, t[0] * 1e3,
           bytes / (med * 1e-3) / 1e9, bad ? "WRONG" : "ok");
    fflush(stdout);
  };

  auto grid = [&](fx_u32 chunk, int threads, int pieces = -1) {
    if (pieces < 0) pieces = count;
    fx_u32 runs = (pieces + chunk - 1) / chunk;
    return std::min<fx_u32>(runs, sms * (2048 / threads));
  };
  {
    // launch floor
    std::vector<float> t;
    for (int i = -4; i < reps; i++) {
      if (gapUs > 0) {
        auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(gapUs);
        while (std::chrono::steady_clock::now() < until) {
        }
      }
      CK(cudaEventRecord(e0, st));
      lab_empty<<<1, 32, 0, st>>>();
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (i >= 0) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    printf("%-34s         median %7.2f us\n", "empty kernel", t[t.size() / 2] * 1e3);
  }
  const fx_u32 total = count * per, shift = 4;
  for (int where = 0; where < 3; where++) {
    measure("flat16 (shipped)", where, false, [&](const void* d, int) {
      fx_u32 chunk = std::max<fx_u32>(1, 4 * 256 / per);
      fx_scatter_flat16<<<grid(chunk, 256), 256, 0, st>>>(sb, db, (const fx_off*)d, total, per, shift, nullptr);
    });
  }
  for (int where = 0; where < 2; where++) {
    measure("flat16 (shipped), keeping a copy", where, false, [&](const void* d, int) {
      fx_u32 chunk = std::max<fx_u32>(1, 4 * 256 / per);
      fx_scatter_flat16<<<grid(chunk, 256), 256, 0, st>>>(sb, db, (const fx_off*)d, total, per, shift,
                                                           (fx_off*)devStage);
    });
  }
  if (quick) return 0;
  for (int where = 0; where < 2; where++) {
    measure("packed 36-bit", where, true, [&](const void* d, int) {
      fx_u32 chunk = std::max<fx_u32>(1, 4 * 256 / per);
      lab_packed<<<grid(chunk, 256), 256, 0, st>>>(sb, db, (const fx_u32*)d, count, per, size, sbits, dbits);
    });
    struct Flat {
      const char* name;
      int vpt, threads;
    };
    for (Flat f : {Flat{"flat vpt2 t256", 2, 256}, Flat{"flat vpt8 t256", 8, 256}, Flat{"flat vpt4 t128", 4, 128},
                   Flat{"flat vpt4 t512", 4, 512}}) {
      measure(f.name, where, false, [&](const void* d, int) {
        fx_u32 chunk = std::max<fx_u32>(1, f.vpt * f.threads / per);
        dim3 g(grid(chunk, f.threads)), b(f.threads);
        const fx_off* o = (const fx_off*)d;
        if (f.vpt == 2) lab_flat<2><<<g, b, 0, st>>>(sb, db, o, count, per, shift);
        if (f.vpt == 4) lab_flat<4><<<g, b, 0, st>>>(sb, db, o, count, per, shift);
        if (f.vpt == 8) lab_flat<8><<<g, b, 0, st>>>(sb, db, o, count, per, shift);
      });
    }
    for (int g : {1, 2, 4}) {
      std::string name = "warp G" + std::to_string(g);
      measure(name.c_str(), where, false, [&](const void* d, int) {
        const fx_off* o = (const fx_off*)d;
        const int blocks = (count + 8 * g - 1) / (8 * g);  // 8 warps of g pieces per block
        if (g == 1) lab_warp<1><<<blocks, 256, 0, st>>>(sb, db, o, count, per, shift);
        if (g == 2) lab_warp<2><<<blocks, 256, 0, st>>>(sb, db, o, count, per, shift);
        if (g == 4) lab_warp<4><<<blocks, 256, 0, st>>>(sb, db, o, count, per, shift);
      });
    }
  }
  {
    static LabParams p;
    measure("descriptors in launch parameters", 3, false, [&](const void*, int k) {
      for (int first = 0; first < count; first += LAB_PARAM_PIECES) {
        int n = std::min(count - first, LAB_PARAM_PIECES);
        p.src_base = sb;
        p.dst_base = db;
        p.pieces = n;
        p.per_piece = per;
        p.shift = shift;
        memcpy(p.offs, &sets[k].off8[first], n * sizeof(fx_off));
        fx_u32 chunk = std::max<fx_u32>(1, 4 * 256 / per);
        lab_param<<<grid(chunk, 256, n), 256, 0, st>>>(p);
      }
    });
  }
  return 0;
}
