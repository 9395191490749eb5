#pragma once

// Window SHEXP_FOLD: the shared expert's gate and up projections (and its gate vector) served by the
// routed experts' gate/up launch: one decode GEMV launch reads the selected experts' gate and up
// matrices (by the router's ids, on the device) and the shared expert's dense matrices, all of the
// same normed FFN input. Stock: the experts' fused gate/up mmvq, then the shared expert's gate/up
// mmvq and its gate vector's mmvf, each with its own quantize_q8_1. 1 token.

#include "../registry.cuh"

flashrt_match flashrt_match_shexp_fold(const ggml_cgraph * cgraph, int i);
void flashrt_run_shexp_fold(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_shexp_fold(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                const flashrt_match & m);
