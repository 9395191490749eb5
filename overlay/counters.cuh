#pragma once

// Device memory that window kernels keep per backend context: counters they count on and leave at
// zero (or, for MOE_TAIL's norm handoff, one that only grows) (a "last block finishes the work" pattern: the MoE tail in the experts' down launch; GDN's
// one-launch flags), and the handoff's image (a kernel hands the next GEMV launch its input already
// normed and quantized: frt_gemv_args::x_q8). One array per context, each use its own
// slice; allocated and zeroed by a window's prepare hook (never under CUDA graph capture), freed
// with the context.

#include "common.cuh"

enum class flashrt_counter_use {
    gdn_flags,    // GDN's one launch: one per key head (at most 256)
    moe_tail,     // one per 4 rows of an FFN's output (n_embd up to 8192)
    handoff,      // not counters: one vector's x_q8 image (up to FRT_X_Q8_MAX_K values), 16-byte aligned
    tail_norm,    // MOE_TAIL's norm handoff: 32 warp sums, each tagged with an epoch that only grows
    exact_chunks, // the exact GEMV launches' chunk counters (frt_gemv_args::chunk_counters)
};

// Counters of `use` in the slice (how many the kernel may touch).
int flashrt_counters_size(flashrt_counter_use use);

// Allocates and zeroes the context's counters on its stream, once. false when the device refused
// (the window then runs without them: its fallback).
bool flashrt_counters_prepare(ggml_backend_cuda_context & ctx);

// The context's counters of `use`, or nullptr when no prepare hook made them (a capture of a graph
// never evaluated directly).
unsigned * flashrt_counters_of(const ggml_backend_cuda_context & ctx, flashrt_counter_use use);

void flashrt_free_counters(const ggml_backend_cuda_context & ctx);
