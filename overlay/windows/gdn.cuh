#pragma once

// Window GDN: a Gated DeltaNet layer of qwen35/qwen35moe at decode (one token per sequence, up to
// 8 sequences), from the conv state's GET_ROWS to the gated output norm:
//   GET_ROWS(conv cache) -> CONCAT(., qkv^T) -> CPY(conv cache) ; GET_ROWS(ssm cache) ;
//   SSM_CONV -> SILU -> q, k: RMS_NORM -> SCALE ; alpha: ADD(dt) -> SOFTPLUS -> MUL(a) ;
//   beta: SIGMOID ; GATED_DELTA_NET -> CPY(ssm cache) ; RMS_NORM -> MUL(w) ; SILU(z) -> MUL
// as two kernels (vendor/csrc/gdn-decode.cuh) where stock runs ~12; one for a single sequence
// (GGML_FLASHRT_GDN_ONE_LAUNCH=0 keeps two).
// The states are read and written in place in the caches. The input projections (qkv, z, alpha, beta) must be computed
// before the block: the graph order INPROJ sets up (graph-order.cu).

#include "../registry.cuh"

flashrt_match flashrt_match_gdn(const ggml_cgraph * cgraph, int i);
void flashrt_run_gdn(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
// Preparation in the node loop (outside capture): the context's zeroed flags for the one-launch path
// (overlay/counters).
void flashrt_prepare_gdn(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
