// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// fabricxfer copy kernels (CUDA). Compiled at run time with NVRTC for the GPU
// present; no headers are needed.
//
// fx_copy_contig      one contiguous range, every thread of the grid.
// fx_scatter_general  one warp per descriptor {src, dst, size}: any sizes and
//                     alignments.
// fx_scatter_uniform  one warp per descriptor for equal-sized items whose
//                     addresses are base + (offset << shift): 8 bytes of
//                     descriptor per item instead of 24, since the host must
//                     ship every descriptor before the kernel runs.
// fx_scatter_flat16   equal-sized, 16-byte aligned items as runs of 16-byte
//                     vectors: a block takes several consecutive items per
//                     round, so small items (a 720-byte KV block is 45
//                     vectors) keep every lane busy and several loads in
//                     flight, and each descriptor is read once.
// fx_scatter_packed16 the same over bit-packed block indices (36 bits for a
//                     block list over 2^18-block pools instead of 64).
//
// Within a range, 16-byte vectors are used where source and destination share
// their alignment modulo 16, then 8, 4, 2 bytes, with byte copies for the
// unaligned head and the tail. Each thread keeps four vectors in flight.
//
// Every kernel takes an fx_signal last: with done set, the launch's last block
// to finish writes the submission's sequence number to the host's done word
// itself, so the host queues no stream write behind the kernel (a driver call
// of 2.5-4.5 us on the H200, on every submission's path).

typedef unsigned long long fx_u64;
typedef unsigned int fx_u32;

struct alignas(16) fx_v16 { fx_u32 x, y, z, w; };

struct alignas(8) fx_off {
  fx_u32 src;
  fx_u32 dst;
};

struct fx_desc {
  fx_u64 src;
  fx_u64 dst;
  fx_u64 size;
};

// fx_signal: done is a word of mapped pinned host memory the host polls (0:
// signal nothing), count a device word counting the launch's finished blocks
// (zero between launches: the last block resets it), seq what done shows once
// every block's writes are visible to the whole system.
struct fx_signal {
  fx_u32* done;
  fx_u32* count;
  fx_u32 seq;
};

// fx_signal_end runs at the end of a kernel, in every thread of every block
// (no thread may have returned early): each thread fences its writes at
// system scope before its block is counted, and the last block counted
// writes the sequence number after a fence of its own (the threadFenceReduction
// pattern, at system scope: destinations may be pinned host memory or a peer).
__device__ __forceinline__ void fx_signal_end(const fx_signal& sig) {
  if (sig.done == 0) return;
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(sig.count, 1u) == gridDim.x - 1) {
    *sig.count = 0;
    __threadfence_system();
    *(volatile fx_u32*)sig.done = sig.seq;
  }
}

template <typename T>
__device__ __forceinline__ void fx_copy_words(T* __restrict__ d, const T* __restrict__ s, fx_u64 n,
                                              fx_u64 lane, fx_u64 lanes) {
  fx_u64 i = lane;
  for (; i + 3 * lanes < n; i += 4 * lanes) {
    T a = s[i];
    T b = s[i + lanes];
    T c = s[i + 2 * lanes];
    T e = s[i + 3 * lanes];
    d[i] = a;
    d[i + lanes] = b;
    d[i + 2 * lanes] = c;
    d[i + 3 * lanes] = e;
  }
  for (; i < n; i += lanes) d[i] = s[i];
}

template <typename T>
__device__ __forceinline__ void fx_copy_aligned(unsigned char* d, const unsigned char* s, fx_u64 n,
                                                fx_u64 lane, fx_u64 lanes) {
  const fx_u64 w = sizeof(T);
  fx_u64 head = (w - ((fx_u64)d & (w - 1))) & (w - 1);
  if (head > n) head = n;
  for (fx_u64 i = lane; i < head; i += lanes) d[i] = s[i];
  d += head;
  s += head;
  n -= head;
  fx_u64 words = n / w;
  fx_copy_words<T>((T*)d, (const T*)s, words, lane, lanes);
  for (fx_u64 i = words * w + lane; i < n; i += lanes) d[i] = s[i];
}

__device__ __forceinline__ void fx_copy_span(fx_u64 dst, fx_u64 src, fx_u64 n, fx_u64 lane, fx_u64 lanes) {
  unsigned char* d = (unsigned char*)dst;
  const unsigned char* s = (const unsigned char*)src;
  fx_u64 mis = dst ^ src;
  if ((mis & 15) == 0) {
    fx_copy_aligned<fx_v16>(d, s, n, lane, lanes);
  } else if ((mis & 7) == 0) {
    fx_copy_aligned<fx_u64>(d, s, n, lane, lanes);
  } else if ((mis & 3) == 0) {
    fx_copy_aligned<fx_u32>(d, s, n, lane, lanes);
  } else if ((mis & 1) == 0) {
    fx_copy_aligned<unsigned short>(d, s, n, lane, lanes);
  } else {
    fx_copy_words<unsigned char>(d, s, n, lane, lanes);
  }
}

extern "C" __global__ void fx_copy_contig(fx_u64 dst, fx_u64 src, fx_u64 n, fx_signal sig) {
  fx_u64 lane = (fx_u64)blockIdx.x * blockDim.x + threadIdx.x;
  fx_u64 lanes = (fx_u64)gridDim.x * blockDim.x;
  fx_copy_span(dst, src, n, lane, lanes);
  fx_signal_end(sig);
}

extern "C" __global__ void fx_scatter_general(const fx_desc* __restrict__ descs, fx_u32 count, fx_signal sig) {
  const fx_u32 lane = threadIdx.x & 31;
  fx_u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const fx_u32 warps = (gridDim.x * blockDim.x) >> 5;
  for (; warp < count; warp += warps) {
    fx_desc t = descs[warp];
    fx_copy_span(t.dst, t.src, t.size, lane, 32);
  }
  fx_signal_end(sig);
}

extern "C" __global__ void fx_scatter_uniform(fx_u64 src_base, fx_u64 dst_base, const fx_off* __restrict__ offs,
                                              fx_u32 count, fx_u64 size, fx_u32 shift, fx_signal sig) {
  const fx_u32 lane = threadIdx.x & 31;
  fx_u32 warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const fx_u32 warps = (gridDim.x * blockDim.x) >> 5;
  for (; warp < count; warp += warps) {
    fx_off o = offs[warp];
    fx_copy_span(dst_base + ((fx_u64)o.dst << shift), src_base + ((fx_u64)o.src << shift), size, lane, 32);
  }
  fx_signal_end(sig);
}

// Pieces per block round of fx_scatter_flat16 at most; a round moves at most
// 4 * blockDim.x vectors, so each thread has up to four loads in flight.
#define FX_FLAT_MAX_CHUNK 256

// fx_flat_chunk is how many pieces one block takes per round: as many whole
// pieces as fit in 4 vectors per thread, at least one. The host sizes the grid
// with the same rule (scatter.FlatChunk in engines/gpu/internal/scatter).
__device__ __forceinline__ fx_u32 fx_flat_chunk(fx_u32 per_piece, fx_u32 threads) {
  fx_u32 c = (4 * threads) / per_piece;
  if (c < 1) c = 1;
  if (c > FX_FLAT_MAX_CHUNK) c = FX_FLAT_MAX_CHUNK;
  return c;
}

// fx_flat_run moves n pieces of per_piece 16-byte vectors, whose offsets (in
// units of 1 << shift bytes) are in run, with the block's threads: VPT loads
// in flight per thread before the first store.
template <int VPT>
__device__ __forceinline__ void fx_flat_run(fx_u64 src_base, fx_u64 dst_base, const fx_off* run, fx_u32 n,
                                            fx_u32 per_piece, fx_u32 shift) {
  const fx_u32 vecs = n * per_piece;
  for (fx_u32 v = threadIdx.x; v < vecs; v += VPT * blockDim.x) {
    fx_v16 r[VPT];
    fx_v16* d[VPT];
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      fx_u32 w = v + k * blockDim.x;
      d[k] = 0;
      if (w < vecs) {
        fx_u32 piece = w / per_piece;
        fx_u32 in = w - piece * per_piece;
        fx_off o = run[piece];
        r[k] = ((const fx_v16*)(src_base + ((fx_u64)o.src << shift)))[in];
        d[k] = ((fx_v16*)(dst_base + ((fx_u64)o.dst << shift))) + in;
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; k++) {
      if (d[k]) *d[k] = r[k];
    }
  }
}

// Each block takes a run of consecutive pieces per round: their descriptors
// are read once, coalesced, into shared memory (one read per piece instead of
// one per vector, which matters most when the descriptors stay in pinned host
// memory and every read crosses PCIe), then the block's threads move the run's
// vectors with four loads in flight each. When keep is set, the block also
// writes the descriptors it read there (device memory), so a later launch of
// the same layout reads them on the GPU instead of across PCIe.
extern "C" __global__ void fx_scatter_flat16(fx_u64 src_base, fx_u64 dst_base, const fx_off* __restrict__ offs,
                                             fx_u32 total, fx_u32 per_piece, fx_u32 shift,
                                             fx_off* __restrict__ keep, fx_signal sig) {
  __shared__ fx_off run[FX_FLAT_MAX_CHUNK];
  const fx_u32 pieces = total / per_piece;
  const fx_u32 chunk = fx_flat_chunk(per_piece, blockDim.x);
  for (fx_u32 first = blockIdx.x * chunk; first < pieces; first += gridDim.x * chunk) {
    const fx_u32 n = (pieces - first < chunk) ? pieces - first : chunk;
    for (fx_u32 t = threadIdx.x; t < n; t += blockDim.x) {
      const fx_off o = offs[first + t];
      run[t] = o;
      if (keep) keep[first + t] = o;
    }
    __syncthreads();
    fx_flat_run<4>(src_base, dst_base, run, n, per_piece, shift);
    __syncthreads();
  }
  fx_signal_end(sig);
}

// fx_scatter_packed16 is fx_scatter_flat16 over packed descriptors: piece i's
// offsets from the bases, in units of unit bytes, are bits [i*B, i*B+B) of a
// little-endian word stream (B = sbits + dbits < 64, source in the low
// sbits), followed by three words of padding; see scatter.Layout.Packed. Each
// block reads the words of its run once and decodes them into shared memory
// as 16-byte offsets. With keep set, the words it read are also written there.
extern "C" __global__ void fx_scatter_packed16(fx_u64 src_base, fx_u64 dst_base, const fx_u32* __restrict__ words,
                                               fx_u32 pieces, fx_u32 per_piece, fx_u64 unit, fx_u32 sbits,
                                               fx_u32 dbits, fx_u32* __restrict__ keep, fx_signal sig) {
  // A run of FX_FLAT_MAX_CHUNK pieces of at most 63 bits spans this many words.
  __shared__ fx_u32 wbuf[(FX_FLAT_MAX_CHUNK * 63 + 31) / 32 + 4];
  __shared__ fx_off run[FX_FLAT_MAX_CHUNK];
  const fx_u32 B = sbits + dbits;
  const fx_u64 smask = (1ull << sbits) - 1, dmask = (1ull << dbits) - 1;
  const fx_u32 chunk = fx_flat_chunk(per_piece, blockDim.x);
  for (fx_u32 first = blockIdx.x * chunk; first < pieces; first += gridDim.x * chunk) {
    const fx_u32 n = (pieces - first < chunk) ? pieces - first : chunk;
    const fx_u32 w0 = (fx_u32)(((fx_u64)first * B) >> 5);
    const fx_u32 nw = (fx_u32)((((fx_u64)(first + n) * B + 31) >> 5) - w0) + 2;
    for (fx_u32 t = threadIdx.x; t < nw; t += blockDim.x) {
      const fx_u32 w = words[w0 + t];
      wbuf[t] = w;
      if (keep) keep[w0 + t] = w;  // neighbouring blocks write the same value to a shared word
    }
    __syncthreads();
    for (fx_u32 t = threadIdx.x; t < n; t += blockDim.x) {
      const fx_u64 bit = (fx_u64)(first + t) * B - ((fx_u64)w0 << 5);
      const fx_u32 wi = (fx_u32)(bit >> 5), sh = (fx_u32)(bit & 31);
      fx_u64 v = ((fx_u64)wbuf[wi] | ((fx_u64)wbuf[wi + 1] << 32)) >> sh;
      if (sh) v |= (fx_u64)wbuf[wi + 2] << (64 - sh);
      fx_off o;
      o.src = (fx_u32)(((v & smask) * unit) >> 4);
      o.dst = (fx_u32)((((v >> sbits) & dmask) * unit) >> 4);
      run[t] = o;
    }
    __syncthreads();
    fx_flat_run<4>(src_base, dst_base, run, n, per_piece, 4);
    __syncthreads();
  }
  fx_signal_end(sig);
}

// Block lists checked on the GPU (CUDA only). The host hands the kernels the caller's block ids as they came
// (two u32 arrays in pinned memory, src_ids[i] -> dst_ids[i]) with the base address of every region pair; it
// neither checks nor expands them. fx_blocks_check runs first: it copies the ids to device memory, checks every
// id against its side's block count and finds repeated destination ids with a bitmap (one bit per destination
// block, all clear between launches), recording the first offending entry of each kind in status. fx_blocks16
// then moves block ids[i] of every pair, as fx_scatter_flat16 moves pieces, unless status says the list was
// refused: then nothing is written. Either way it clears the bits the check set, and its last block to finish
// reports status to the host (report, mapped pinned memory) and resets status for the next list.
//
// status: [0] first out-of-range entry, [1] a repeated destination entry (0xffffffff: none), [2] blocks of
// fx_blocks16 finished.

#define FX_NONE 0xffffffffu

extern "C" __global__ void fx_blocks_check(const fx_u32* __restrict__ src_ids, const fx_u32* __restrict__ dst_ids,
                                           fx_u32 n, fx_u32 src_blocks, fx_u32 dst_blocks,
                                           fx_u32* __restrict__ dev_src, fx_u32* __restrict__ dev_dst,
                                           fx_u32* __restrict__ bitmap, fx_u32* __restrict__ status) {
  for (fx_u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const fx_u32 s = src_ids[i], d = dst_ids[i];
    dev_src[i] = s;
    dev_dst[i] = d;
    if (s >= src_blocks || d >= dst_blocks) {
      atomicMin(&status[0], i);
      continue;
    }
    const fx_u32 bit = 1u << (d & 31);
    if (atomicOr(&bitmap[d >> 5], bit) & bit) atomicMin(&status[1], i);
  }
}

extern "C" __global__ void fx_blocks16(const fx_u64* __restrict__ bases, fx_u32 pairs, fx_u32 n,
                                       const fx_u32* __restrict__ src_ids, const fx_u32* __restrict__ dst_ids,
                                       fx_u32 dst_blocks, fx_u32 per_piece, fx_u32* __restrict__ bitmap,
                                       fx_u32* __restrict__ status, volatile fx_u32* report, fx_signal sig) {
  __shared__ fx_u64 run_src[FX_FLAT_MAX_CHUNK];
  __shared__ fx_u64 run_dst[FX_FLAT_MAX_CHUNK];
  __shared__ bool refused;
  if (threadIdx.x == 0) refused = status[0] != FX_NONE || status[1] != FX_NONE;
  __syncthreads();
  const fx_u64 bytes = (fx_u64)per_piece * 16;
  // The bits of this list, cleared once per id (pair 0's pieces), whether or not it moves.
  for (fx_u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const fx_u32 d = dst_ids[i];
    if (d < dst_blocks) bitmap[d >> 5] = 0;
  }
  if (!refused) {
    const fx_u32 pieces = pairs * n;
    const fx_u32 chunk = fx_flat_chunk(per_piece, blockDim.x);
    for (fx_u32 first = blockIdx.x * chunk; first < pieces; first += gridDim.x * chunk) {
      const fx_u32 cnt = (pieces - first < chunk) ? pieces - first : chunk;
      for (fx_u32 t = threadIdx.x; t < cnt; t += blockDim.x) {
        const fx_u32 piece = first + t, pair = piece / n, i = piece - pair * n;
        run_src[t] = bases[2 * pair] + (fx_u64)src_ids[i] * bytes;
        run_dst[t] = bases[2 * pair + 1] + (fx_u64)dst_ids[i] * bytes;
      }
      __syncthreads();
      const fx_u32 vecs = cnt * per_piece;
      for (fx_u32 v = threadIdx.x; v < vecs; v += 4 * blockDim.x) {
        fx_v16 r[4];
        fx_v16* d[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          const fx_u32 w = v + k * blockDim.x;
          d[k] = 0;
          if (w < vecs) {
            const fx_u32 p = w / per_piece, in = w - p * per_piece;
            r[k] = ((const fx_v16*)run_src[p])[in];
            d[k] = ((fx_v16*)run_dst[p]) + in;
          }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
          if (d[k]) *d[k] = r[k];
        }
      }
      __syncthreads();
    }
  }
  // The last block to finish reports and resets status (the threadFenceReduction pattern), then writes the done
  // word when signalling: every block's writes must then be visible system-wide first, as in fx_signal_end.
  if (sig.done) {
    __threadfence_system();
  } else {
    __threadfence();
  }
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&status[2], 1) == gridDim.x - 1) {
    report[0] = atomicAdd(&status[0], 0);
    report[1] = atomicAdd(&status[1], 0);
    report[2] = 1;
    status[0] = FX_NONE;
    status[1] = FX_NONE;
    status[2] = 0;
    __threadfence_system();
    if (sig.done) *(volatile fx_u32*)sig.done = sig.seq;
  }
}
