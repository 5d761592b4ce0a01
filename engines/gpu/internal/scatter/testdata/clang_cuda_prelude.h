// SPDX-License-Identifier: Apache-2.0
// Copyright The fabricxfer Authors

// Stand-ins for what NVRTC gives copy.cu without headers, so clang's CUDA front end can compile it where there is
// no CUDA toolkit (kernels_compile_test.go): the launch qualifiers, the fences and the 32-bit atomics it uses.
#include "__clang_cuda_builtin_vars.h"
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __inline__ __attribute__((always_inline))
static __device__ __forceinline__ void __threadfence_system() { __nvvm_membar_sys(); }
static __device__ __forceinline__ void __threadfence() { __nvvm_membar_gl(); }
static __device__ __forceinline__ unsigned atomicAdd(unsigned* p, unsigned v) { return __nvvm_atom_add_gen_i((int*)p, (int)v); }
static __device__ __forceinline__ unsigned atomicMin(unsigned* p, unsigned v) { return __nvvm_atom_min_gen_ui(p, v); }
static __device__ __forceinline__ unsigned atomicOr(unsigned* p, unsigned v) { return __nvvm_atom_or_gen_i((int*)p, (int)v); }
