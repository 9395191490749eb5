#pragma once

// Window ATTN_OUT_GATE (tier safe; FRT_ATTN_OUT_GATE_SWAP=0 turns it off):
// the output gate of qwen35's full-attention layers where ATTN_DECODE does not fold it (its output
// would lie over Q),
//   [CONT of the gate's view of the q projection ->] SIGMOID -> MUL(attention, sigmoid)
// at one token, as one kernel (vendor/csrc/gate-mul-q8) that reads the gate through its view and
// also hands the product's q8 image to the attention output projection's GEMV launch, which then
// copies it instead of reading and quantizing the product after its wait (as GDN hands ssm_out
// its output's image). Stock runs the CONT and the fused SIGMOID-MUL.

#include "../registry.cuh"

flashrt_match flashrt_match_attn_out_gate(const ggml_cgraph * cgraph, int i);
void flashrt_run_attn_out_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_attn_out_gate(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                   const flashrt_match & m);
