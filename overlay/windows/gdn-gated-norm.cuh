#pragma once

// Window GDN_GATED_NORM (tier safe): the Gated DeltaNet output norm of qwen35/qwen35moe,
//   RMS_NORM(o) -> MUL(ssm_norm) -> ... -> SILU(z) -> MUL
// as one kernel. Stock runs it as two (RMS_NORM+MUL fused, SILU+MUL fused). When the graph
// computes z between the norm and the gate, the window is deferred to the SILU (registry.cuh).

#include "../registry.cuh"

flashrt_match flashrt_match_gdn_gated_norm(const ggml_cgraph * cgraph, int i);
void flashrt_run_gdn_gated_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
