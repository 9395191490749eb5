#pragma once

// Window ROUTER: an MoE FFN's input norm folded into the launch of the matvecs that read the normed
// value first, the router and the shared expert's gate vector (both F32), the launch keeping the
// normed value for the experts' gate/up and the shared expert that read it later:
//   RMS_NORM(x) -> MUL(ffn_norm) -> MUL_MAT(ffn_gate_inp), MUL_MAT(ffn_gate_inp_shexp), ...
// Stock: rms_norm_f32 (the MUL fused), then the router's mul_mat_vec_f (2 launches; 1 with ROUTER).

#include "../registry.cuh"

flashrt_match flashrt_match_router(const ggml_cgraph * cgraph, int i);
void flashrt_run_router(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_router(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_run_claimed_router(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                                int node);
