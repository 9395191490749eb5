// The exact kernel with its staged rows in 2 or 4 copy groups (GGML_FLASHRT_EXACT_CHUNKS, an
// experiment): its own translation unit, so that it compiles beside the others.

#include "gemv-exact-impl.cuh"

cudaError_t frt_gemv_exact_launch_chunked(bool glu, int chunks, int device, int blocks, int smem, cudaStream_t stream,
                                          const exact_params & p) {
    if (chunks == kExactMaxChunks) {
        return glu ? exact_launch<frt_gemv_exact_kernel<true, 4>>(device, blocks, smem, stream, p)
                   : exact_launch<frt_gemv_exact_kernel<false, 4>>(device, blocks, smem, stream, p);
    }
    return glu ? exact_launch<frt_gemv_exact_kernel<true, 2>>(device, blocks, smem, stream, p)
               : exact_launch<frt_gemv_exact_kernel<false, 2>>(device, blocks, smem, stream, p);
}
