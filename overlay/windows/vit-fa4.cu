#include "vit-fa4.cuh"

#include "../diagnostics.cuh"
#include "fa4-attend.cuh"
#include "fattn.cuh"

#include <cstdio>

// A vision encoder attends over hundreds of patches; below this, stock's kernels are the ones to keep.
static constexpr int64_t vit_fa4_min_tokens = 32;

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
static const char * vit_fa4_miss(const ggml_tensor * fa, frt_fa4_shape & shape) {
    if (fa->src[3] != nullptr) {
        return "a mask (the non-causal modules take none)";
    }
    if (fa->src[0]->ne[2] != fa->src[1]->ne[2]) {
        return "grouped key/value heads (the non-causal modules have one key/value head a query head)";
    }
    return flashrt_fa4_node_miss(fa, vit_fa4_min_tokens, false, shape);
}

flashrt_match flashrt_match_vit_fa4(const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * fa = cgraph->nodes[i];
    if (fa->op != GGML_OP_FLASH_ATTN_EXT) {
        return flashrt_miss(flashrt_miss_anchor);
    }
    frt_fa4_shape shape;
    if (const char * miss = vit_fa4_miss(fa, shape)) {
        return flashrt_miss(miss);
    }
    return flashrt_hit(1);
}

void flashrt_prepare_vit_fa4(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(ctx);
    GGML_UNUSED(m);
    frt_fa4_shape shape;
    if (vit_fa4_miss(cgraph->nodes[i], shape) == nullptr) {
        flashrt_fa4_load_for("VIT_FA4", shape);
    }
}

void flashrt_run_vit_fa4(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    ggml_tensor * fa = cgraph->nodes[i];  // the match accepted it
    if (!flashrt_fa4_attend(ctx, fa, flashrt_fa4_shape_of(fa, false), fa->src[1]->ne[1])) {
        if (flashrt_debug_enabled()) {
            std::fprintf(stderr, "FlashRT: VIT_FA4 at node %d (%s): stock's flash attention: the module is not loaded\n",
                         i, fa->name);
        }
        ggml_cuda_flash_attn_ext(ctx, fa);
    }
}
