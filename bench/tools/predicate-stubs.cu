// The few ggml-cuda symbols the overlay's objects reference on paths predicate-check never takes
// (launches, pools, errors): predicate-check links the overlay without ggml-cuda itself.

#include "common.cuh"
#include "convert.cuh"

#include <cstdlib>

extern "C" const char * cublasGetStatusString(cublasStatus_t) {
    return "";
}

extern "C" CUresult cuGetErrorString(CUresult, const char ** s) {
    *s = "";
    return CUDA_SUCCESS;
}

int ggml_cuda_get_device() {
    return 0;
}

void ggml_cuda_set_device(int) {}

[[noreturn]] void ggml_cuda_error(const char *, const char *, const char *, int, const char *) {
    std::abort();
}

// Every window counts as enabled: the predicates are what is checked.
bool flashrt_window_enabled(const char *) {
    return true;
}

std::unique_ptr<ggml_cuda_pool> ggml_backend_cuda_context::new_pool_for_device(int, int) {
    return nullptr;
}

to_fp32_cuda_t ggml_get_to_fp32_cuda(ggml_type) {
    return nullptr;
}

uint64_t flashrt_evaluation() {
    return 0;
}

// The windows take every batch they can (the default).
bool flashrt_multi_token_enabled() {
    return true;
}

void ggml_cuda_flash_attn_ext(ggml_backend_cuda_context &, ggml_tensor *) {
    std::abort();
}
