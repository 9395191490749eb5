#pragma once

// Window VIT_FA4: a vision encoder's attention (llama.cpp's multimodal path, tools/mtmd: every
// patch sees every patch, no mask) through an ahead-of-time FlashAttention-4 module
// (vendor/csrc/fa4, fa4_aot/): FLASH_ATTN_EXT without a mask, F32 Q converted to F16, the F16 K
// and V (the encoder casts them) read where they are, the output converted to F32. Head sizes of
// the manifest's non-causal modules (64, 72, 80: SigLIP-style encoders), as many query heads as
// key/value heads. No host synchronisation: capture-safe.

#include "../registry.cuh"

flashrt_match flashrt_match_vit_fa4(const ggml_cgraph * cgraph, int i);
void flashrt_run_vit_fa4(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
void flashrt_prepare_vit_fa4(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
