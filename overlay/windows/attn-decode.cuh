#pragma once

// Window ATTN_DECODE: a decode step's attention over a short F16 cache (FLASH_ATTN_EXT of 1 to 8
// query tokens over at most 1024 cells) in one kernel (vendor/csrc/decode-attention) instead of stock's
// flash attention and its fix-up: a cluster of 8 blocks a key/value head, each scoring an eighth of
// the cells, then combining the blocks' partial softmaxes through the cluster's shared memory. Any
// F16 mask (a server's batch of sequences included),
// no sinks, ALiBi or softcap. Scores and sums in float: close to stock, not its bits. When the
// attention is followed by qwen35's output gate (RESHAPE, [the gate's VIEW and CONT,] SIGMOID, MUL),
// the kernel applies the gate as it writes, into the MUL's output, with stock's expressions for the
// gate (GGML_FLASHRT_ATTN_GATE=0: attention alone).

#include "../registry.cuh"

flashrt_match flashrt_match_attn_decode(const ggml_cgraph * cgraph, int i);
void flashrt_run_attn_decode(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
