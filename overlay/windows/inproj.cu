#include "inproj.cuh"
#include "gemv-pack.cuh"

flashrt_match flashrt_match_inproj(const ggml_cgraph * cgraph, int i) {
    flashrt_gemv_pack pack;
    if (const char * miss = flashrt_gemv_match_norm_pack(cgraph, i, pack)) {
        return flashrt_miss(miss);
    }
    if (!flashrt_gemv_pack_reads(cgraph, pack, "INPROJ")) {
        return flashrt_miss("no Gated DeltaNet input projection among the readers");
    }
    return flashrt_gemv_match(pack, i, 2);
}

void flashrt_run_inproj(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_run_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, true), "INPROJ");
}

void flashrt_prepare_inproj(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_prepare_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, true));
}

void flashrt_run_claimed_inproj(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                            int node) {
    GGML_UNUSED(m);
    flashrt_gemv_run_there(ctx, cgraph, i, node, "INPROJ");
}
