// frt_gemv's kernel instances for launches of up to 4 tokens (gemv-impl.cuh).
#include "gemv-impl.cuh"

cudaError_t frt_gemv_launch_tokens4(const frt_gemv_args & a, int direct, cudaStream_t stream) {
    return gemv_launch_tokens<4>(a, direct, stream);
}
