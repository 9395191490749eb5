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

// The sums of R rows across the 32 lanes (lane l holds row r's value in v[r]; R a power of two up
// to 32), each row's sum the same bits as frt_warp_sum of that row, for a warp that has many rows
// to add: a reduce-scatter. At offset m each lane keeps half of the rows it holds and sends its
// partner the other half, adding the partner's values of the half it keeps. Those are the pairs
// the butterfly adds at offset m (lanes l and l ^ m agree on the higher offsets' bits, so they hold
// the same rows), and a + b is b + a bit for bit, so every value is the butterfly's. 31 shuffles
// for 32 rows where the butterfly takes 160; once one row is left, the remaining offsets are the
// butterfly's. Returns the sum of row lane / (32 / R) (v is overwritten); every lane calls it.
// One template level an offset, so that every index into v is a constant (v stays in registers).
template <int N, int M, int R> static __device__ __forceinline__ void frt_warp_scatter_step(float (&v)[R], unsigned lane) {
    if constexpr (N > 1) {
        const bool upper = (lane & (unsigned) M) != 0;
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const float send = upper ? v[i] : v[N / 2 + i];
            const float keep = upper ? v[N / 2 + i] : v[i];
            v[i]             = keep + __shfl_xor_sync(0xffffffffu, send, M);
        }
        frt_warp_scatter_step<N / 2, M / 2>(v, lane);
    }
}

template <int R> static __device__ __forceinline__ float frt_warp_sum_rows(float (&v)[R]) {
    static_assert(R >= 1 && R <= 32 && (R & (R - 1)) == 0, "rows: a power of two up to 32");
    frt_warp_scatter_step<R, 16>(v, threadIdx.x % 32);
    float sum = v[0];
#pragma unroll
    for (int m = 16 / R; m > 0; m /= 2) {
        sum += __shfl_xor_sync(0xffffffffu, sum, m);
    }
    return sum;
}
