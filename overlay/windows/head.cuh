#pragma once

// Window HEAD: the final RMS norm and the LM head (the output projection to the vocabulary) as one
// decode GEMV launch:
//   RMS_NORM(x) -> MUL(output_norm) -> MUL_MAT(output)
// The head is the largest matrix of a decode step (qwen36: 248320 x 2048 Q6_K, 417 MB); stock runs
// it as one mul_mat_vec_q at ~1.4 TB/s. Q6_K heads are read from the repack cache's aligned copy.

#include "../registry.cuh"

flashrt_match flashrt_match_head(const ggml_cgraph * cgraph, int i);
void flashrt_run_head(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_head(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_run_claimed_head(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                            int node);
