#pragma once

// Window MOE_TAIL: the tail of a qwen35moe FFN, from the routed experts' weighted sum to the
// layer's output, as one kernel (vendor/csrc/moe-ffn-tail):
//   MUL(experts, weights) -> VIEW x n_used -> ADD chain (slot 0 first) = moe_out,
//   SIGMOID(shared-expert gate) -> MUL(shexp, .) -> ADD(moe_out, .) -> ADD(., residual)
// Stock: moe_weighted_reduction (the MUL and ADD chain fused), sigmoid, mul, and the two ADDs
// fused: 4 launches. The shared expert's down projection must come before the run (the graph
// order moves it after the routed experts' down projection when the window runs).

#include "../registry.cuh"

flashrt_match flashrt_match_moe_tail(const ggml_cgraph * cgraph, int i);
void flashrt_run_moe_tail(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
