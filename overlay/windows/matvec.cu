#include "matvec.cuh"
#include "gemv-pack.cuh"

flashrt_match flashrt_match_matvec(const ggml_cgraph * cgraph, int i) {
    flashrt_gemv_pack pack;
    // With SHEXP_FOLD on, the shared expert's matvecs wait for the experts' launch.
    const flashrt_gemv_fold fold =
        flashrt_window_enabled("SHEXP_FOLD") ? flashrt_gemv_fold::leave : flashrt_gemv_fold::none;
    if (const char * miss = flashrt_gemv_match_same_input(cgraph, i, fold, pack)) {
        return flashrt_miss(miss);
    }
    return flashrt_gemv_match(pack, i, 1);
}

void flashrt_run_matvec(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_run_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, false), "MATVEC");
}

void flashrt_prepare_matvec(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    flashrt_gemv_prepare_pack(ctx, cgraph, flashrt_gemv_pack_of(cgraph, m, i, false));
}
