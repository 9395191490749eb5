#include "fa4-io.cuh"

#include <algorithm>

static __global__ void frt_fa4_q_to_f16_kernel(const float * q, int64_t d, int64_t n, int64_t heads, int64_t s_token,
                                               int64_t s_head, half * out) {
    const int64_t total = d * n * heads;
    for (int64_t at = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; at < total; at += (int64_t) gridDim.x * blockDim.x) {
        const int64_t i = at % d, t = at / d % n, h = at / (d * n);
        out[at]         = __float2half(q[t * s_token + h * s_head + i]);
    }
}

static __global__ void frt_fa4_o_to_f32_kernel(const half * o, float * out, int64_t count) {
    for (int64_t at = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; at < count; at += (int64_t) gridDim.x * blockDim.x) {
        out[at] = __half2float(o[at]);
    }
}

static unsigned fa4_io_blocks(int64_t count) {
    return (unsigned) std::min<int64_t>((count + 255) / 256, 65535);
}

cudaError_t frt_fa4_q_to_f16(const float * q, int64_t d, int64_t n, int64_t heads, int64_t s_token, int64_t s_head,
                             half * out, cudaStream_t stream) {
    frt_fa4_q_to_f16_kernel<<<fa4_io_blocks(d * n * heads), 256, 0, stream>>>(q, d, n, heads, s_token, s_head, out);
    return cudaGetLastError();
}

cudaError_t frt_fa4_o_to_f32(const half * o, float * out, int64_t count, cudaStream_t stream) {
    frt_fa4_o_to_f32_kernel<<<fa4_io_blocks(count), 256, 0, stream>>>(o, out, count);
    return cudaGetLastError();
}
