#pragma once

// Window PREFILL_FA4: FLASH_ATTN_EXT at prefill sizes (32 tokens or more) through an ahead-of-time
// FlashAttention-4 module (vendor/csrc/fa4, fa4_aot/): F32 Q converted to F16, the F16 K and V
// read where they are in the KV cache, the output converted to F32. FA4's modules take no mask:
// the window runs where llama.cpp's mask is exactly causal over a prefix of the cache (each token
// sees the cells before it and itself, none after; a single sequence), which the run checks on the
// mask itself once per graph evaluation (a copy to the host: prefill graphs are not captured).
// Anything else (another mask, no module) runs stock's flash attention. A graph where the window
// may run is evaluated without a CUDA graph (flashrt_prefill_fa4_reads_host: the begin-graph hook
// tells ggml-cuda so), since a replay would reuse the key count found at capture whatever the mask.

#include "../registry.cuh"

flashrt_match flashrt_match_prefill_fa4(const ggml_cgraph * cgraph, int i);
void flashrt_run_prefill_fa4(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_prefill_fa4(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                 const flashrt_match & m);

// Whether the window would take a node of the graph (it then reads the mask on the host at every
// evaluation, so the graph must not be captured).
bool flashrt_prefill_fa4_reads_host(const ggml_cgraph * cgraph);
