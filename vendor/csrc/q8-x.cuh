#pragma once

// An input vector as the decode GEMV kernels hold it in shared memory: RMS-normed (optionally)
// and quantized as ggml-cuda's quantize_q8_1 quantizes it, as int8 with a scale per 32 values and
// int sums per 16. The code is shared by the GEMV prologues (gemv-impl.cuh) and by the kernels
// that hand the next launch its input already quantized (frt_gemv_args::x_q8), so that both give
// the same bits.
//
// The image of one vector of k values (k a multiple of 256) in device memory, as it lies in shared
// memory: k int8 values, then k / 32 uint2 (the block's half-rounded scale as float bits; the sums
// of values 0..15 and 16..31 as two int16).

#include <cuda_fp16.h>
#include <cstdint>

static constexpr __host__ __device__ int frt_x_q8_bytes(int k) {
    return k + k / 32 * 8;
}

// The widest vector a handoff image holds (the context's slice of device memory is this big).
constexpr int FRT_X_Q8_MAX_K = 8192;

#ifdef __CUDACC__
// Four columns of x normed as ggml-cuda's fused rms_norm + mul forms them: x * scale * w.
static __device__ __forceinline__ float4 frt_norm_chunk(float4 x, float scale, float4 w) {
    return make_float4(x.x * scale * w.x, x.y * scale * w.y, x.z * scale * w.z, x.w * scale * w.w);
}

// Quantizes four values, chunk i of the vector (values 4i .. 4i + 3), into xq and, for the first
// chunk of each 32-value block, its scale and sums into xm. The 8 lanes of a block (8 consecutive
// lanes, lane = the calling thread's lane) call it together, with every lane of the warp.
//
// Stock's quantize_q8_1, expression for expression (built with the same -use_fast_math as
// ggml-cuda, so the same instructions), its scale rounded to half as block_q8_1 stores it. Any other
// rounding of x, even a more exact one, moves every matvec off stock's by up to 2^-11 a block, and
// decode amplifies that into logits that no longer track stock's (cargo xtask parity).
static __device__ __forceinline__ void frt_quantize_q8_chunk(float4 xv, int i, int lane, int8_t * xq, uint2 * xm) {
    constexpr unsigned full = 0xffffffffu;
    float amax = fmaxf(fmaxf(fabsf(xv.x), fabsf(xv.y)), fmaxf(fabsf(xv.z), fabsf(xv.w)));
    for (int offset = 1; offset < 8; offset <<= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(full, amax, offset));
    }
    const float d_raw = amax / 127.0f;
    const float d     = __half2float(__float2half_rn(d_raw));
    const int   q0    = amax == 0.0f ? 0 : (int) roundf(xv.x / d_raw);
    const int   q1    = amax == 0.0f ? 0 : (int) roundf(xv.y / d_raw);
    const int   q2    = amax == 0.0f ? 0 : (int) roundf(xv.z / d_raw);
    const int   q3    = amax == 0.0f ? 0 : (int) roundf(xv.w / d_raw);
    ((int *) xq)[i] = (q0 & 0xff) | (q1 & 0xff) << 8 | (q2 & 0xff) << 16 | (q3 & 0xff) << 24;
    int sum = q0 + q1 + q2 + q3;
    sum += __shfl_xor_sync(full, sum, 1);
    sum += __shfl_xor_sync(full, sum, 2);  // lanes 8m + 0..3: values 0..15 of the block, 8m + 4..7: 16..31
    const int hi = __shfl_xor_sync(full, sum, 4);
    if (lane % 8 == 0) {
        xm[i / 8] = make_uint2(__float_as_uint(d), (uint32_t) (sum & 0xffff) | (uint32_t) hi << 16);
    }
}

// The same quantization with one 32-value block held by a warp, a value a lane: the same
// expressions (the block's maximum does not depend on the order it is formed in; the sums are
// integers), so the same bits as frt_quantize_q8_chunk. xq, xm: the block's values and its entry.
static __device__ __forceinline__ void frt_quantize_q8_lane(float v, int lane, int8_t * xq, uint2 * xm) {
    constexpr unsigned full = 0xffffffffu;
    float amax = fabsf(v);
    for (int offset = 16; offset > 0; offset >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(full, amax, offset));
    }
    const float d_raw = amax / 127.0f;
    const float d     = __half2float(__float2half_rn(d_raw));
    const int   q     = amax == 0.0f ? 0 : (int) roundf(v / d_raw);
    xq[lane]          = (int8_t) q;
    int sum = q;
    for (int offset = 1; offset < 16; offset <<= 1) {
        sum += __shfl_xor_sync(full, sum, offset);  // lanes 0..15: values 0..15, lanes 16..31: 16..31
    }
    const int hi = __shfl_xor_sync(full, sum, 16);
    if (lane == 0) {
        *xm = make_uint2(__float_as_uint(d), (uint32_t) (sum & 0xffff) | (uint32_t) hi << 16);
    }
}
#endif
