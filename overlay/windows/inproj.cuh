#pragma once

// Window INPROJ: a Gated DeltaNet layer's input projections (qkv, z gate, alpha, beta: every
// matvec that reads the layer's normed input) as one decode GEMV launch, with the RMS norm before
// them in the kernel's prologue:
//   RMS_NORM(x) -> MUL(attn_norm) -> MUL_MAT(attn_qkv), MUL_MAT(attn_gate), MUL_MAT(ssm_beta), MUL_MAT(ssm_alpha)
// Stock: RMS_NORM+MUL, then per matvec a quantize_q8_1 and a mul_mat_vec_q (9 launches).

#include "../registry.cuh"

flashrt_match flashrt_match_inproj(const ggml_cgraph * cgraph, int i);
void flashrt_run_inproj(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_inproj(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_run_claimed_inproj(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                            int node);
