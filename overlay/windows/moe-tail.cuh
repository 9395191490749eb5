#pragma once

// Window MOE_TAIL: the tail of a qwen35moe FFN, from the routed experts' weighted sum to the
// layer's output, as one kernel (vendor/csrc/moe-ffn-tail):
//   MUL(experts, weights) -> VIEW x n_used -> ADD chain (slot 0 first) = moe_out,
//   SIGMOID(shared-expert gate) -> MUL(shexp, .) -> ADD(moe_out, .) -> ADD(., residual)
// Stock: moe_weighted_reduction (the MUL and ADD chain fused), sigmoid, mul, and the two ADDs
// fused: 4 launches. The shared expert's down projection must come before the run (the graph
// order moves it after the routed experts' down projection when the window runs).

#include "../registry.cuh"

// The run's nodes, as qwen35moe builds them (llm_graph_context::build_moe_ffn's weighted sum, then
// qwen35moe's shared expert and residual).
struct flashrt_moe_tail_run {
    const ggml_tensor * weighted;  // MUL(experts, weights), the anchor
    const ggml_tensor * experts;   // [n_embd, n_used, tokens]
    const ggml_tensor * weights;   // [1, n_used, tokens]
    const ggml_tensor * sigmoid;
    const ggml_tensor * gate;      // [1, tokens]
    const ggml_tensor * shexp;     // [n_embd, tokens]
    const ggml_tensor * residual;  // [n_embd, tokens]
    const ggml_tensor * out;       // the last ADD
    int                 n_used, tokens, end;  // end: index of out
};

// The window's predicate at node i (nullptr: a hit) and its nodes; also for the experts' down
// launch, which computes the run itself where it can (MATVEC, GGML_FLASHRT_DOWN_TAIL).
const char * flashrt_moe_tail_run_at(const ggml_cgraph * cgraph, int i, flashrt_moe_tail_run & r);

// The run at node i (a hit of flashrt_moe_tail_run_at) in its own kernel; with `hand_off`, at one
// token, the kernel also hands the next layer's norm-fed pack its input normed and quantized where
// that pack takes it (the norm handoff, gemv-pack.cuh).
void flashrt_run_moe_tail_at(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, bool hand_off);

flashrt_match flashrt_match_moe_tail(const ggml_cgraph * cgraph, int i);
void flashrt_run_moe_tail(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_moe_tail(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                              const flashrt_match & m);
