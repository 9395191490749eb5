#pragma once

// Window MOE_TOPK: an MoE FFN's expert selection at decode (one token), computed inside the
// routed experts' gate/up launch (the exact GEMV kernel, frt_gemv_args::route_logits) instead of
// ggml-cuda's fused top-k kernel. The run, as llama.cpp's build_moe_ffn builds it for a softmax
// gate (and as ggml-cuda's topk-moe fusion recognises it):
//   SOFT_MAX(logits) -> RESHAPE -> ARGSORT(desc) -> VIEW (the ids) -> GET_ROWS(probs, ids)
//   [-> RESHAPE -> SUM_ROWS -> CLAMP -> DIV -> RESHAPE] [-> SCALE]   (the last: the weights)
// covered at the SOFT_MAX, where nothing runs. The window claims the experts' gate MUL_MAT_ID
// that reads the ids and runs its pack there (SHEXP_FOLD's or MATVEC's, with the routing): every
// expert block selects the experts itself, block 0 writes ids and weights for the later readers.

#include "../registry.cuh"

// The top-k run starting at a SOFT_MAX.
struct flashrt_moe_topk_run {
    const ggml_tensor * logits  = nullptr;  // [n_experts, 1]
    const ggml_tensor * ids     = nullptr;  // the VIEW: [n_used, 1] I32, rows n_experts apart
    const ggml_tensor * weights = nullptr;  // the run's last node
    int                 n_experts = 0, n_used = 0;
    bool                norm  = false;      // divided by max(sum, clamp)
    float               clamp = 0.0f;
    float               scale = 1.0f;
    int                 end   = 0;          // index of the last node
};

// The run at node i (a SOFT_MAX) for one token; nullptr on a hit, else why not.
const char * flashrt_moe_topk_run_at(const ggml_cgraph * cgraph, int i, flashrt_moe_topk_run & r);

flashrt_match flashrt_match_moe_topk(const ggml_cgraph * cgraph, int i);
void flashrt_run_moe_topk(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_run_claimed_moe_topk(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i,
                                  const flashrt_match & m, int node);
