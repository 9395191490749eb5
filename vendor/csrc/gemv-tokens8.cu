// frt_gemv's kernel instances for launches of up to 8 tokens (gemv-impl.cuh).
#include "gemv-impl.cuh"

cudaError_t frt_gemv_launch_tokens8(const frt_gemv_args & a, int direct, cudaStream_t stream) {
    return gemv_launch_tokens<8>(a, direct, stream);
}
