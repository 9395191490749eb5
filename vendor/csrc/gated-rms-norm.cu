#include "gated-rms-norm.cuh"

// One block per row. Decode rows are short (128 columns for Qwen3.6's 128-wide value heads, 32
// rows a token): the cost is the launch, so a 32-thread block reads each element once, reduces in
// registers and writes once.
template <int block_size>
static __global__ void frt_gated_rms_norm_f32_kernel(const frt_gated_rms_norm_args a) {
    const int row = blockIdx.x;
    const int channel = blockIdx.y;
    const int sample = blockIdx.z;
    const float * x = a.x + row * a.x_row + channel * a.x_channel + sample * a.x_sample;
    const float * z = a.z + row * a.z_row + channel * a.z_channel + sample * a.z_sample;
    float * out = a.out + row * a.out_row + channel * a.out_channel + sample * a.out_sample;

    float sum = 0.0f;
    for (int c = threadIdx.x; c < a.ncols; c += block_size) {
        const float v = x[c];
        sum += v * v;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_xor_sync(0xffffffff, sum, offset);
    }
    if constexpr (block_size > 32) {
        __shared__ float partial[32];
        const int warp = threadIdx.x / 32;
        const int lane = threadIdx.x % 32;
        if (lane == 0) {
            partial[warp] = sum;
        }
        __syncthreads();
        sum = lane < block_size / 32 ? partial[lane] : 0.0f;
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) {
            sum += __shfl_xor_sync(0xffffffff, sum, offset);
        }
    }
    const float scale = rsqrtf(sum / a.ncols + a.eps);

    // Every thread reads the elements it writes, and all reads of the first pass are done: out may
    // alias x.
    for (int c = threadIdx.x; c < a.ncols; c += block_size) {
        const float g = z[c];
        const float silu = g / (1.0f + expf(-g));
        out[c] = scale * x[c] * a.w[c] * silu;
    }
}

cudaError_t frt_gated_rms_norm_f32(const frt_gated_rms_norm_args & args, cudaStream_t stream) {
    const dim3 grid(args.nrows, args.nchannels, args.nsamples);
    if (args.ncols <= 1024) {
        frt_gated_rms_norm_f32_kernel<32><<<grid, 32, 0, stream>>>(args);
    } else {
        frt_gated_rms_norm_f32_kernel<256><<<grid, 256, 0, stream>>>(args);
    }
    return cudaGetLastError();
}
