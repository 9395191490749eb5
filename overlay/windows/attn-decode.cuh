#pragma once

// Window ATTN_DECODE: a decode step's attention over a short F16 cache (FLASH_ATTN_EXT of 1 to 8
// query tokens over at most 1024 cells) in one kernel (vendor/csrc/decode-attention) instead of stock's
// flash attention and its fix-up: 32 cells a block, the last block of each key/value head
// combining the blocks' partial softmaxes. Any F16 mask (a server's batch of sequences included),
// no sinks, ALiBi or softcap. Scores and sums in float: close to stock, not its bits.

#include "../registry.cuh"

flashrt_match flashrt_match_attn_decode(const ggml_cgraph * cgraph, int i);
void flashrt_run_attn_decode(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_attn_decode(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                 const flashrt_match & m);
