#include "gated-residual.cuh"
#include "pdl.cuh"

// One block per token: the dot product is reduced in the block, then every thread writes the
// elements it alone read (so out may alias an input).
static constexpr int block_size = 256;

static __global__ void frt_gated_residual_f32_kernel(const frt_gated_residual_args p) {
    // The gate vector may be a per-use conversion written by the kernel before: wait first.
    frt_pdl_wait();
    const int t = blockIdx.x;
    const float * x = p.x + t * p.x_token;
    float dot = 0.0f;
    for (int c = threadIdx.x; c < p.n; c += block_size) {
        dot += p.w[c] * x[c];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        dot += __shfl_xor_sync(0xffffffff, dot, offset);
    }
    __shared__ float partial[block_size / 32];
    if (threadIdx.x % 32 == 0) {
        partial[threadIdx.x / 32] = dot;
    }
    __syncthreads();
    dot = threadIdx.x < block_size / 32 ? partial[threadIdx.x] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        dot += __shfl_xor_sync(0xffffffff, dot, offset);
    }
    // Every thread of warp 0 holds the total; share it.
    __shared__ float gate;
    if (threadIdx.x == 0) {
        gate = 1.0f / (1.0f + expf(-dot));
    }
    __syncthreads();
    const float g = gate;
    frt_pdl_launch_dependents();

    const float * s = p.s + t * p.s_token;
    const float * a = p.a + t * p.a_token;
    const float * r = p.r ? p.r + t * p.r_token : nullptr;
    float * out = p.out + t * p.out_token;
    for (int c = threadIdx.x; c < p.n; c += block_size) {
        float v = a[c] + s[c] * g;
        if (r) {
            v += r[c];
        }
        out[c] = v;
    }
}

cudaError_t frt_gated_residual_f32(const frt_gated_residual_args & args, cudaStream_t stream) {
    return frt_launch(frt_gated_residual_f32_kernel, args.n_tokens, block_size, 0, stream, args);
}
