#pragma once

// The span of a Qwen3.5/3.6 full-attention layer between its input projections and flash
// attention, per token, in one kernel:
//   q_out[h]                 = rope(rms_norm(q[h]) * q_weight)           F32, each query head h
//   k_cache[row(t)][h]       = half(rope(rms_norm(k[h]) * k_weight))     each KV head h
//   v_cache[row(t)]          = half(v)
// rope is ggml's multi-section RoPE (ggml_rope_multi: MROPE, or qwen35's interleaved IMROPE) with
// NEOX pairing over the n_dims channels from n_offs; the other channels are copied.
// Stock ggml-cuda runs it as six kernels: rms_norm_f32 with the weight multiply fused and
// rope_multi for q, the same for k, and k_set_rows for k and for v. Each value here is computed
// with stock's expressions in stock's order: the norm's sum as rms_norm_f32<256> reduces it (a
// thread's columns in order, each warp's butterfly, the warps' sums through shared memory), its
// mean, rsqrtf and (scale * x) * w; rope_multi's section choice, powf, yarn correction, cosf/sinf
// and rotation; set_rows' round-to-nearest half. Compiled with ggml-cuda's flags (-use_fast_math),
// as in the overlay, the results are stock's bits.
//
// Plain pointers and strides (elements), no ggml types. A head's block reads its whole input row
// before it writes, so q_out may alias q element for element (same head, same strides); the caches
// must not overlap any input.

#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

constexpr int FRT_ATTN_ROPE_MAX_TOKENS = 8;
// rms_norm_f32 takes rows of fewer than 1024 columns with 256 threads (its reduction order).
constexpr int FRT_ATTN_ROPE_MAX_HEAD_DIM = 1022;

// Cache row of token t: data[t * stride], int64 (llama.cpp's k_idxs/v_idxs) or int32.
struct frt_attn_rope_rows {
    const void * data;
    int64_t      stride;
    bool         i32;
};

struct frt_attn_rope_args {
    int head_dim;  // even, 2..FRT_ATTN_ROPE_MAX_HEAD_DIM
    int n_head_q;
    int n_head_kv;
    int tokens;    // 1..FRT_ATTN_ROPE_MAX_TOKENS

    // Head h of token t: q + t*q_token + h*q_head, head_dim contiguous floats.
    const float * q;
    int64_t       q_head, q_token;
    const float * q_weight;  // [head_dim], the same for every head
    float         q_eps;
    float *       q_out;
    int64_t       q_out_head, q_out_token;

    const float * k;
    int64_t       k_head, k_token;
    const float * k_weight;
    float         k_eps;
    // q_weight and k_weight are model weights (no kernel writes them): read before the wait for
    // the previous kernel. Otherwise after it, with the activations.
    bool          weights_constant;
    __half *      k_cache;      // head h of token t: k_cache + row(t)*k_cache_row + h*head_dim
    int64_t       k_cache_row;
    frt_attn_rope_rows k_rows;

    const float * v;            // v_cols contiguous floats a token, at v + t*v_token
    int64_t       v_token;
    int           v_cols;
    __half *      v_cache;      // token t: v_cache + row(t)*v_cache_row
    int64_t       v_cache_row;
    frt_attn_rope_rows v_rows;

    // RoPE: ggml_rope_multi's parameters. theta_scale = powf(freq_base, -2.0f / n_dims) and
    // corr_dims (ggml_rope_yarn_corr_dims) are computed on the host, as ggml-cuda does.
    const int32_t * pos;        // position of token t in section s: pos[s*tokens + t]
    int             n_dims;     // rotated channels, from n_offs; n_offs + n_dims <= head_dim
    int             n_offs;
    int             sections[4];
    bool            imrope;     // GGML_ROPE_TYPE_IMROPE (else MROPE)
    float           theta_scale, freq_scale, ext_factor, attn_factor;
    float           corr_dims[2];
};

// Launches the kernel on `stream` (PDL when enabled); capture-safe. Returns the launch error
// (cudaErrorInvalidValue for shapes it does not take).
cudaError_t frt_attn_rope(const frt_attn_rope_args & args, cudaStream_t stream);
