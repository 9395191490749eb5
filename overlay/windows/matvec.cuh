#pragma once

// Window MATVEC: any remaining weight matvec at decode (1..8 tokens) through the decode GEMV
// kernel, together with the later matvecs that read the same input the same way (one launch):
// dense MUL_MATs (output projections, the router and the shared expert's projections) and the
// routed experts' MUL_MAT_IDs (gate and up share one launch, ids read on the device). Stock runs
// each as a quantize_q8_1 and a mul_mat_vec_q (or mul_mat_vec_f for float weights).

#include "../registry.cuh"

flashrt_match flashrt_match_matvec(const ggml_cgraph * cgraph, int i);
void flashrt_run_matvec(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_matvec(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
