#pragma once

// Window SHEXP_GATE (tier full, see docs/perf-notes.md): the shared-expert gate of
// qwen35moe/qwen3next layers and the residual add that follows,
//   MUL_MAT(w_gate_shexp, x) -> SIGMOID -> MUL(shexp) -> ADD(moe_out) [-> ADD(residual)]
// as one kernel. Stock runs it as four (the matvec, SIGMOID, MUL, the fused ADD chain): the
// sigmoid's [1, tokens] shape keeps upstream from fusing it with the MUL. The gate vector may be
// F32 (quantized GGUFs keep 1-row tensors in F32), F16 or BF16 (read through the repack cache).

#include "../registry.cuh"

flashrt_match flashrt_match_shexp_gate(const ggml_cgraph * cgraph, int i);
void flashrt_run_shexp_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_shexp_gate(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                const flashrt_match & m);
