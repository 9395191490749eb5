#include "shexp-fold.cuh"
#include "gemv-pack.cuh"

flashrt_match flashrt_match_shexp_fold(const ggml_cgraph * cgraph, int i) {
    flashrt_gemv_pack pack;
    if (const char * miss = flashrt_gemv_match_same_input(cgraph, i, flashrt_gemv_fold::experts, pack)) {
        return flashrt_miss(miss);
    }
    return flashrt_gemv_match(pack, i, 1);
}

void flashrt_run_shexp_fold(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_run_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, false), "SHEXP_FOLD");
}

void flashrt_prepare_shexp_fold(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                const flashrt_match & m) {
    flashrt_gemv_prepare_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, false));
}
