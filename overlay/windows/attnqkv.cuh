#pragma once

// Window ATTNQKV: a full-attention layer's q (with its output gate), k and v projections as one
// decode GEMV launch, with the RMS norm before them in the kernel's prologue:
//   RMS_NORM(x) -> MUL(attn_norm) -> MUL_MAT(attn_q), MUL_MAT(attn_k), MUL_MAT(attn_v)
// Stock: RMS_NORM+MUL, then per matvec a quantize_q8_1 and a mul_mat_vec_q (7 launches).

#include "../registry.cuh"

flashrt_match flashrt_match_attnqkv(const ggml_cgraph * cgraph, int i);
void flashrt_run_attnqkv(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_attnqkv(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_run_claimed_attnqkv(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                            int node);
