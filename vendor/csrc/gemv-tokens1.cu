// frt_gemv's kernel instances for launches of up to 1 token (gemv-impl.cuh).
#include "gemv-impl.cuh"

cudaError_t frt_gemv_launch_tokens1(const frt_gemv_args & a, int direct, cudaStream_t stream) {
    return gemv_launch_tokens<1>(a, direct, stream);
}
