#pragma once

// The tail of a Qwen3.5/3.6 MoE FFN, per token and column c, in one kernel:
//   moe   = sum over the n_used slots k of experts[k][c] * weights[k]   (slot 0 first)
//   gated = shexp[c] * sigmoid(gate)
//   out   = (moe + gated) + residual
// and, optionally, the next layer's input norm of `out` already quantized for its matvecs.
// Stock ggml-cuda runs it as four kernels: moe_weighted_reduction (its fused MUL + ADD chain), the
// SIGMOID, the MUL and the fused pair of ADDs. Each value is computed with stock's expression, the
// reduction as moe_weighted_reduction_f32 writes it and the rest rounded op by op (no contraction
// across what stock computes in separate kernels), so the results match stock's.
//
// Plain pointers and strides (elements), no ggml types. Each output element reads only its own
// column of the column-wise inputs, so `out` may alias one of them (the same column), never
// `weights` or `gate`.

#include <cstdint>
#include <cuda_runtime.h>

struct frt_moe_tail_args {
    int n_embd;
    int n_used;  // 1..FRT_MOE_TAIL_MAX_USED
    int tokens;

    const float * experts;  // slot k of token t at experts + t*experts_token + k*experts_slot
    int64_t       experts_token, experts_slot;
    const float * weights;  // [n_used] of token t at weights + t*weights_token
    int64_t       weights_token;
    const float * shexp;    // the shared expert's output, [n_embd] at shexp + t*shexp_token
    int64_t       shexp_token;
    const float * gate;     // its gate logit, one at gate + t*gate_token
    int64_t       gate_token;
    const float * residual;  // [n_embd] at residual + t*residual_token
    int64_t       residual_token;
    float *       out;       // [n_embd] at out + t*out_token
    int64_t       out_token;
    // Optional, one token (x_q8 non-null): the output also RMS-normed as ggml-cuda's fused rms_norm
    // + mul norms it (eps norm_eps, then times norm_w) and quantized as quantize_q8_1 quantizes it,
    // written as frt_gemv_args::x_q8's image (q8-x.cuh), for the next launch's matvecs: the norm
    // and the quantization leave that launch's prologue. n_embd a multiple of 128, from 1024
    // (stock's norm block of 1024 threads) to FRT_MOE_TAIL_NORM_MAX_EMBD; norm_w and x_q8 16-byte
    // aligned, x_q8 apart from every input. norm_scratch: FRT_MOE_TAIL_NORM_SCRATCH words of device
    // memory, zeroed once and then left to the launches (the norm's warp sums, each tagged with an
    // epoch that only grows), used by one stream's launches one after another.
    const float * norm_w;
    float         norm_eps;
    void *        x_q8;
    unsigned *    norm_scratch;
};

constexpr int FRT_MOE_TAIL_MAX_USED = 16;
constexpr int FRT_MOE_TAIL_NORM_MAX_EMBD = 4096;
// norm_scratch (words): stock's 32 warp sums, 8 bytes each (the sum's bits, then the epoch above
// them).
constexpr int FRT_MOE_TAIL_NORM_SCRATCH = 64;

#ifdef __CUDACC__
// One output of the tail: slot k's expert value is expert(k). The one expression both
// frt_moe_tail's kernel and the exact GEMV kernel's fused tail (gemv.cuh, frt_gemv_moe_tail)
// compute, so that their results are the same bits: moe_weighted_reduction_f32 without an expert
// scale (its (e * 1.0f) * w is e * w exactly, and its sum += ... contracts to the same fma(e, w,
// sum)), then op_sigmoid, op_mul and the two op_adds, each rounded as its own kernel rounds it.
template <typename EXPERT>
static __device__ __forceinline__ float frt_moe_tail_value(EXPERT expert, const float * weights, int n_used, float gate,
                                                           float shexp, float residual) {
    // The slots' loads 8 at a time (one round trip for qwen36's 8, not one a slot), each sum in slot
    // order; the weights, the same for every thread, come from L1.
    constexpr int kBatch = 8;
    float         sum    = 0.0f;
#pragma unroll
    for (int k0 = 0; k0 < FRT_MOE_TAIL_MAX_USED; k0 += kBatch) {
        float e[kBatch] = {};
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            if (k0 + j < n_used) {
                e[j] = expert(k0 + j);
            }
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            if (k0 + j == 0) {
                sum = e[0] * weights[0];
            } else if (k0 + j < n_used) {
                sum += e[j] * weights[k0 + j];
            }
        }
    }
    const float sig   = 1.0f / (1.0f + expf(-gate));
    const float gated = __fmul_rn(shexp, sig);
    const float ffn   = __fadd_rn(sum, gated);
    return __fadd_rn(ffn, residual);
}
#endif

// Launches the kernel on `stream` (PDL when enabled); capture-safe. Returns the launch error.
cudaError_t frt_moe_tail(const frt_moe_tail_args & args, cudaStream_t stream);
