#pragma once

// An MoE FFN's input norm and its F32 router rows (the router, the shared expert's gate vector) for
// one token, one row a block: the row's pairs are loaded into registers before the wait for the
// previous kernel (8 bytes a thread a 512 columns, nothing queued ahead of x for long), x once
// after it into shared memory, and each of the block's 256 threads plays ggml-cuda's mmvf thread of
// the same index. The same bits as the exact GEMV kernel's ROUTER launch (gemv-exact-impl.cuh:
// exact_norm_scales, gemv_prologue_x's normed value, exact_row_f32), which plays stock's rms_norm
// and mmvf in turn. frt_gemv runs it for such a launch unless GGML_FLASHRT_ROUTER_F32=0
// (gemv-exact.cu).

#include <cuda_runtime.h>

#include <cstdint>

constexpr int FRT_ROUTER_F32_MAX_SEGMENTS = 4;

struct frt_router_f32_segment {
    const float * w;           // row r at w + r * row_stride
    int           rows;
    int64_t       row_stride;  // floats, a multiple of 4
    float *       out;         // out[r]
};

struct frt_router_f32_args {
    const float * x;     // k floats: the token's input before the norm (16-byte aligned)
    const float * norm;  // k floats: the RMS norm's weight (16-byte aligned)
    float         eps;   // rms(x) = sqrt(mean(x^2) + eps)
    int           k;     // a multiple of 512, 1024 to 4096
    float *       x_normed;  // non-null: the normed x written here (k floats, 16-byte aligned)
    // Non-null (with x_normed): the normed x also quantized as ggml-cuda's quantize_q8_1 quantizes
    // it, its image written here (q8-x.cuh; frt_x_q8_bytes(k) bytes, 16-byte aligned), for the
    // next launch's frt_gemv_args::x_q8. k at most FRT_X_Q8_MAX_K.
    void *        x_q8;
    int           n_segments;
    frt_router_f32_segment seg[FRT_ROUTER_F32_MAX_SEGMENTS];
};

// nullptr when frt_router_f32 takes `args`; otherwise why not.
const char * frt_router_f32_unsupported(const frt_router_f32_args & args);

// Launches on `stream` (capture-safe, programmatic dependent launch like ggml-cuda): one block of
// 256 threads a row of every segment. cudaErrorInvalidValue when frt_router_f32_unsupported says why.
cudaError_t frt_router_f32(const frt_router_f32_args & args, cudaStream_t stream);
