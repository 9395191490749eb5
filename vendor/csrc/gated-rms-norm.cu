#include "gated-rms-norm.cuh"
#include "pdl.cuh"

static __device__ __forceinline__ float frt_silu(float v) {
    return v / (1.0f + expf(-v));
}

// Decode rows are short (128 columns for Qwen3.6's value heads, 32 rows a token) and the kernel is
// pure latency: one warp per row, every lane issues all of its float4 loads (w before the PDL wait
// when it is a weight) before the one reduction, then writes the elements it read (out may alias x).
// VEC float4 per lane: ncols <= 128 * VEC.
template <int VEC>
static __global__ void frt_gated_rms_norm_f32_vec(const frt_gated_rms_norm_args a) {
    constexpr int rows_per_block = 4;
    const int     lane           = threadIdx.x % 32;
    const int     row            = blockIdx.x * rows_per_block + threadIdx.x / 32;
    const int     ncols4         = a.ncols / 4;

    float4 wv[VEC];
    if (!a.w_constant) {
        frt_pdl_wait();
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        const int c4 = lane + 32 * k;
        wv[k]        = c4 < ncols4 ? ((const float4 *) a.w)[c4] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    frt_pdl_wait();
    if (row >= a.nrows) {
        return;
    }
    const int64_t channel = blockIdx.y, sample = blockIdx.z;
    const float4 * x = (const float4 *) (a.x + row * a.x_row + channel * a.x_channel + sample * a.x_sample);
    const float4 * z = (const float4 *) (a.z + row * a.z_row + channel * a.z_channel + sample * a.z_sample);
    float4 *       out = (float4 *) (a.out + row * a.out_row + channel * a.out_channel + sample * a.out_sample);

    float4 xv[VEC], zv[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        const int c4 = lane + 32 * k;
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        xv[k] = c4 < ncols4 ? x[c4] : zero;
        zv[k] = c4 < ncols4 ? z[c4] : zero;
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        ss += __shfl_xor_sync(0xffffffff, ss, offset);
    }
    frt_pdl_launch_dependents();
    const float scale = rsqrtf(ss / a.ncols + a.eps);
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
        const int c4 = lane + 32 * k;
        if (c4 < ncols4) {
            out[c4] = make_float4(scale * xv[k].x * wv[k].x * frt_silu(zv[k].x),
                                  scale * xv[k].y * wv[k].y * frt_silu(zv[k].y),
                                  scale * xv[k].z * wv[k].z * frt_silu(zv[k].z),
                                  scale * xv[k].w * wv[k].w * frt_silu(zv[k].w));
        }
    }
}

// Any shape and alignment: one block per row, scalar loads.
template <int block_size>
static __global__ void frt_gated_rms_norm_f32_any(const frt_gated_rms_norm_args a) {
    frt_pdl_wait();
    const int64_t row = blockIdx.x, channel = blockIdx.y, sample = blockIdx.z;
    const float * x   = a.x + row * a.x_row + channel * a.x_channel + sample * a.x_sample;
    const float * z   = a.z + row * a.z_row + channel * a.z_channel + sample * a.z_sample;
    float *       out = a.out + row * a.out_row + channel * a.out_channel + sample * a.out_sample;

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
    frt_pdl_launch_dependents();
    const float scale = rsqrtf(sum / a.ncols + a.eps);

    // Every thread reads the elements it writes, and all reads of the first pass are done: out may
    // alias x.
    for (int c = threadIdx.x; c < a.ncols; c += block_size) {
        out[c] = scale * x[c] * a.w[c] * frt_silu(z[c]);
    }
}

static bool frt_aligned16(const void * p) {
    return ((uintptr_t) p) % 16 == 0;
}

cudaError_t frt_gated_rms_norm_f32(const frt_gated_rms_norm_args & a, cudaStream_t stream) {
    const bool vectorizable = a.ncols % 4 == 0 && a.ncols <= 1024 && frt_aligned16(a.x) && frt_aligned16(a.z) &&
                              frt_aligned16(a.out) && frt_aligned16(a.w) &&
                              (a.x_row | a.x_channel | a.x_sample | a.z_row | a.z_channel | a.z_sample | a.out_row |
                               a.out_channel | a.out_sample) % 4 == 0;
    if (vectorizable) {
        const dim3 grid((a.nrows + 3) / 4, a.nchannels, a.nsamples);
        const int  vec = (a.ncols + 127) / 128;
        if (vec == 1) {
            return frt_launch(frt_gated_rms_norm_f32_vec<1>, grid, 128, 0, stream, a);
        }
        if (vec == 2) {
            return frt_launch(frt_gated_rms_norm_f32_vec<2>, grid, 128, 0, stream, a);
        }
        if (vec <= 4) {
            return frt_launch(frt_gated_rms_norm_f32_vec<4>, grid, 128, 0, stream, a);
        }
        return frt_launch(frt_gated_rms_norm_f32_vec<8>, grid, 128, 0, stream, a);
    }
    const dim3 grid(a.nrows, a.nchannels, a.nsamples);
    if (a.ncols <= 1024) {
        return frt_launch(frt_gated_rms_norm_f32_any<32>, grid, 32, 0, stream, a);
    }
    return frt_launch(frt_gated_rms_norm_f32_any<256>, grid, 256, 0, stream, a);
}
