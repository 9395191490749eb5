#pragma once

// ggml-cuda's warp_reduce_sum and warp_reduce_max over the 32 lanes of a warp: the xor butterfly
// from offset 16 down, each lane combining with its partner. Kernels that give stock's bits reduce
// in this order.

#include <cuda_runtime.h>

static __device__ __forceinline__ float frt_warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

static __device__ __forceinline__ float frt_warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}
