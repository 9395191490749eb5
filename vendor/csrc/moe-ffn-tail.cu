#include "moe-ffn-tail.cuh"
#include "pdl.cuh"
#include "q8-x.cuh"

constexpr int moe_tail_threads = 256;  // moe_weighted_reduction_f32's block

// early: the dependents may start now (frt_pdl_early_dependents); their wait covers our writes.
static __global__ void __launch_bounds__(moe_tail_threads) frt_moe_tail_kernel(const frt_moe_tail_args a, bool early) {
    const int t   = blockIdx.x;
    const int col = blockIdx.y * blockDim.x + threadIdx.x;
    if (early) {
        frt_pdl_launch_dependents();
    }
    frt_pdl_wait();
    if (col >= a.n_embd) {
        frt_pdl_launch_dependents();
        return;
    }
    const float * experts = a.experts + t * a.experts_token + col;
    const float   out     = frt_moe_tail_value([&](int k) { return experts[k * a.experts_slot]; },
                                               a.weights + t * a.weights_token, a.n_used, a.gate[t * a.gate_token],
                                               a.shexp[t * a.shexp_token + col], a.residual[t * a.residual_token + col]);
    frt_pdl_launch_dependents();
    a.out[t * a.out_token + col] = out;
}

// The norm's block as the exact GEMV's prologue runs it (exact_norm_scales): 512 threads, each
// playing two of the 1024 threads of ggml-cuda's rms_norm block (real warp w plays warps w and
// w + 16). Half an SM's registers, so that the block can become resident beside a block of the
// launch before it and start its wait early.
constexpr int moe_tail_norm_threads = 512;
constexpr int moe_tail_norm_virtual = 1024 / moe_tail_norm_threads;
constexpr int moe_tail_norm_cols    = FRT_MOE_TAIL_NORM_MAX_EMBD / 1024;  // columns a virtual thread

// One token's tail, then the next norm of its output quantized (frt_moe_tail_args::x_q8), in one
// block: stock's rms_norm thread t (here virtual) computes columns t, t + 1024, ..., the columns
// whose squares it adds, and adds them in that order; the block's sum is then formed as rms_norm
// forms it (a butterfly in each warp, then one over the 32 warp sums), and every 4 columns are
// normed and quantized by the GEMV prologue's code (q8-x.cuh). The image thus holds the bits the
// next launch's prologue would compute from `out`.
static __global__ void __launch_bounds__(moe_tail_norm_threads)
    frt_moe_tail_norm_kernel(const frt_moe_tail_args a, bool early) {
    constexpr unsigned full  = 0xffffffffu;
    constexpr int      warps = moe_tail_norm_threads / 32;
    extern __shared__ float4 values4[];  // the outputs, n_embd floats
    __shared__ float warp_sums[32];      // of stock's 32 warps
    float *        values = (float *) values4;
    const int      tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int      n = a.n_embd, k4 = n / 4;
    const float4 * norm4 = (const float4 *) a.norm_w;
    // The norm's weights before the wait: no kernel writes them.
    const float4   w_first = tid < k4 ? norm4[tid] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (early) {
        frt_pdl_launch_dependents();
    }
    frt_pdl_wait();
    // Every input is read before any output is written: `out` may alias a slot or the residual.
    const float gate = a.gate[0];
    float       v[moe_tail_norm_virtual][moe_tail_norm_cols];
#pragma unroll
    for (int i = 0; i < moe_tail_norm_virtual; ++i) {
#pragma unroll
        for (int j = 0; j < moe_tail_norm_cols; ++j) {
            const int col = 32 * (warp + warps * i) + lane + 1024 * j;
            if (col < n) {
                v[i][j] = frt_moe_tail_value([&](int k) { return a.experts[k * a.experts_slot + col]; }, a.weights,
                                             a.n_used, gate, a.shexp[col], a.residual[col]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < moe_tail_norm_virtual; ++i) {
        float ss = 0.0f;
#pragma unroll
        for (int j = 0; j < moe_tail_norm_cols; ++j) {
            const int col = 32 * (warp + warps * i) + lane + 1024 * j;
            if (col < n) {
                a.out[col]  = v[i][j];
                values[col] = v[i][j];
                ss += v[i][j] * v[i][j];
            }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            ss += __shfl_xor_sync(full, ss, offset);
        }
        if (lane == 0) {
            warp_sums[warp + warps * i] = ss;
        }
    }
    __syncthreads();
    float sum = warp_sums[lane];
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_xor_sync(full, sum, offset);
    }
    const float mean  = sum / n;
    const float scale = rsqrtf(mean + a.norm_eps);
    frt_pdl_launch_dependents();
    int8_t * xq = (int8_t *) a.x_q8;
    uint2 *  xm = (uint2 *) ((uint8_t *) a.x_q8 + n);
    // k4 is a multiple of 32: a warp's lanes are all in range or all out.
    for (int i = tid; i < k4; i += moe_tail_norm_threads) {
        const float4 w = i == tid ? w_first : norm4[i];
        frt_quantize_q8_chunk(frt_norm_chunk(values4[i], scale, w), i, lane, xq, xm);
    }
}

cudaError_t frt_moe_tail(const frt_moe_tail_args & a, cudaStream_t stream) {
    if (a.n_embd < 1 || a.tokens < 1 || a.n_used < 1 || a.n_used > FRT_MOE_TAIL_MAX_USED) {
        return cudaErrorInvalidValue;
    }
    if (a.x_q8 != nullptr) {
        if (a.tokens != 1 || a.n_embd % 128 != 0 || a.n_embd < 1024 || a.n_embd > 1024 * moe_tail_norm_cols ||
            a.norm_w == nullptr ||
            (uintptr_t) a.norm_w % 16 != 0 || (uintptr_t) a.x_q8 % 16 != 0) {
            return cudaErrorInvalidValue;
        }
        return frt_launch(frt_moe_tail_norm_kernel, dim3(1), dim3(moe_tail_norm_threads), a.n_embd * sizeof(float),
                          stream, a, frt_pdl_early_dependents());
    }
    const dim3 grid(a.tokens, (a.n_embd + moe_tail_threads - 1) / moe_tail_threads);
    return frt_launch(frt_moe_tail_kernel, grid, dim3(moe_tail_threads), 0, stream, a, frt_pdl_early_dependents());
}
