#include "head.cuh"
#include "gemv-pack.cuh"

#include <cstring>

// llama.cpp names the LM head "output.weight", or reads the token embeddings when they are tied.
static bool head_weight(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack) {
    if (pack.n != 1) {
        return false;
    }
    const char * name = cgraph->nodes[pack.nodes[0]]->src[0]->name;
    return std::strcmp(name, "output.weight") == 0 || std::strcmp(name, "token_embd.weight") == 0;
}

flashrt_match flashrt_match_head(const ggml_cgraph * cgraph, int i) {
    flashrt_gemv_pack pack;
    if (const char * miss = flashrt_gemv_match_norm_pack(cgraph, i, pack)) {
        return flashrt_miss(miss);
    }
    if (!head_weight(cgraph, pack)) {
        return flashrt_miss("the reader is not the LM head");
    }
    return flashrt_gemv_match(pack, i, 2);
}

void flashrt_run_head(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_run_pack(ctx, cgraph, flashrt_gemv_pack_of(m, i, true), "HEAD");
}

void flashrt_prepare_head(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_prepare_pack(ctx, cgraph, flashrt_gemv_pack_of(m, i, true));
}

void flashrt_run_claimed_head(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                            int node) {
    GGML_UNUSED(m);
    flashrt_gemv_run_there(ctx, cgraph, i, node, "HEAD");
}
