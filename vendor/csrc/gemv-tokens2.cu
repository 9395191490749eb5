// frt_gemv's kernel instances for launches of up to 2 tokens (gemv-impl.cuh).
#include "gemv-impl.cuh"

cudaError_t frt_gemv_launch_tokens2(const frt_gemv_args & a, int direct, cudaStream_t stream) {
    return gemv_launch_tokens<2>(a, direct, stream);
}
