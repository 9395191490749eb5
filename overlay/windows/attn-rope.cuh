#pragma once

// Window ATTN_ROPE: a qwen35/qwen35moe full-attention layer from its q/k/v projections to flash
// attention, as one kernel (vendor/csrc/attn-norm-rope), 1 to 8 tokens:
//   q: RMS_NORM -> MUL(attn_q_norm) -> ROPE (ggml_rope_multi, IMROPE)            = Qcur
//   k: RMS_NORM -> MUL(attn_k_norm) -> ROPE -> VIEW -> SET_ROWS(K cache, F16)
//   v:                                          VIEW -> SET_ROWS(V cache, F16)
// Stock: rms_norm_f32 (the MUL fused) and rope_multi for q and for k, two k_set_rows: 6 launches
// (ggml-cuda's RoPE + VIEW + SET_ROWS and RMS_NORM + MUL + ROPE fusions take only NORMAL/NEOX
// RoPE, not rope_multi). The window is deferred: q's three nodes are taken where they stand and
// computed with k's at k's RMS_NORM, since stock's order puts the k and v projections in between
// (at one token ATTNQKV's order leaves only their reshapes there).

#include "../registry.cuh"

flashrt_match flashrt_match_attn_rope(const ggml_cgraph * cgraph, int i);
void flashrt_run_attn_rope(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
