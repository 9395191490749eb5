// The exact kernel with late staging (GGML_FLASHRT_EXACT_LATE, an experiment; 2 copy groups, or 4
// with GGML_FLASHRT_EXACT_CHUNKS=4): its own translation unit, so that it compiles beside the others.

#include "gemv-exact-impl.cuh"

cudaError_t frt_gemv_exact_launch_late(bool glu, int chunks, int device, int blocks, int smem, cudaStream_t stream,
                                       const exact_params & p) {
    if (chunks == kExactMaxChunks) {
        return glu ? exact_launch<frt_gemv_exact_kernel<true, 4, false, true>>(device, blocks, smem, stream, p)
                   : exact_launch<frt_gemv_exact_kernel<false, 4, false, true>>(device, blocks, smem, stream, p);
    }
    return glu ? exact_launch<frt_gemv_exact_kernel<true, 2, false, true>>(device, blocks, smem, stream, p)
               : exact_launch<frt_gemv_exact_kernel<false, 2, false, true>>(device, blocks, smem, stream, p);
}
