#include "moe-ffn-tail.cuh"
#include "pdl.cuh"
#include "q8-x.cuh"

#include <cooperative_groups.h>

namespace cg = cooperative_groups;

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

// The norm's block as ggml-cuda's rms_norm runs it for n_embd >= 1024: 1024 threads, thread T
// adding the squares of columns T, T + 1024, ... in that order. Here that block is a cluster of
// 8 blocks of 128 threads (block r plays stock's threads 128r .. 128r + 127, its warps 4r .. 4r +
// 3), so that the tail's loads are spread over 8 SMs: one block of 512 threads doing them all took
// 8.8 us a layer against 3.5 for the plain tail (H100 trace, bench/results 2026-12-05).
constexpr int moe_tail_norm_split   = 8;
constexpr int moe_tail_norm_threads = 1024 / moe_tail_norm_split;
constexpr int moe_tail_norm_warps   = moe_tail_norm_threads / 32;
constexpr int moe_tail_norm_cols    = FRT_MOE_TAIL_NORM_MAX_EMBD / 1024;  // columns a thread

// One token's tail, then the next norm of its output quantized (frt_moe_tail_args::x_q8): each
// thread computes and writes its columns and adds their squares in stock's order; each block's
// warp sums go to shared memory; after the cluster barrier every warp reads stock's 32 warp sums
// from the 8 blocks in stock's order and reduces them as rms_norm does; then each warp norms its
// 32 consecutive columns (one q8 block each) and quantizes them as the GEMV prologue would
// (q8-x.cuh). The image thus holds the bits the next launch's prologue would compute from `out`.
static __global__ void __launch_bounds__(moe_tail_norm_threads)
    frt_moe_tail_norm_kernel(const frt_moe_tail_args a, bool early) {
    constexpr unsigned full = 0xffffffffu;
    __shared__ float   warp_sums[moe_tail_norm_warps];  // of stock's warps 4r .. 4r + 3
    cg::cluster_group  cluster = cg::this_cluster();
    const int          tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int          thread = (int) cluster.block_rank() * moe_tail_norm_threads + tid;  // stock's
    const int          n      = a.n_embd;
    // The norm's weights before the wait: no kernel writes them.
    float w[moe_tail_norm_cols];
#pragma unroll
    for (int j = 0; j < moe_tail_norm_cols; ++j) {
        const int col = thread + 1024 * j;
        w[j]          = col < n ? a.norm_w[col] : 0.0f;
    }
    if (early) {
        frt_pdl_launch_dependents();
    }
    frt_pdl_wait();
    // A thread reads its columns of every input before it writes them: `out` may alias a slot or
    // the residual, column for column.
    const float gate = a.gate[0];
    float       v[moe_tail_norm_cols];
#pragma unroll
    for (int j = 0; j < moe_tail_norm_cols; ++j) {
        const int col = thread + 1024 * j;
        if (col < n) {
            v[j] = frt_moe_tail_value([&](int k) { return a.experts[k * a.experts_slot + col]; }, a.weights, a.n_used,
                                      gate, a.shexp[col], a.residual[col]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < moe_tail_norm_cols; ++j) {
        const int col = thread + 1024 * j;
        if (col < n) {
            a.out[col] = v[j];
            ss += v[j] * v[j];
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        ss += __shfl_xor_sync(full, ss, offset);
    }
    if (lane == 0) {
        warp_sums[warp] = ss;
    }
    cluster.sync();
    // Lane l holds stock's warp l's sum: block l / 4's warp l % 4.
    float sum = cluster.map_shared_rank(warp_sums, lane / moe_tail_norm_warps)[lane % moe_tail_norm_warps];
    cluster.barrier_arrive();  // read: a block may leave once every block has read
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_xor_sync(full, sum, offset);
    }
    const float mean  = sum / n;
    const float scale = rsqrtf(mean + a.norm_eps);
    frt_pdl_launch_dependents();
    int8_t * xq = (int8_t *) a.x_q8;
    uint2 *  xm = (uint2 *) ((uint8_t *) a.x_q8 + n);
    // n is a multiple of 128: a warp's 32 columns, one q8 block, are all in range or all out.
#pragma unroll
    for (int j = 0; j < moe_tail_norm_cols; ++j) {
        const int col = thread + 1024 * j;
        if (col < n) {
            frt_quantize_q8_lane(v[j] * scale * w[j], lane, xq + (col - lane), xm + col / 32);
        }
    }
    cluster.barrier_wait();
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
        return frt_launch_clustered(frt_moe_tail_norm_kernel, dim3(moe_tail_norm_split), dim3(moe_tail_norm_threads), 0,
                                    stream, moe_tail_norm_split, a, frt_pdl_early_dependents());
    }
    const dim3 grid(a.tokens, (a.n_embd + moe_tail_threads - 1) / moe_tail_threads);
    return frt_launch(frt_moe_tail_kernel, grid, dim3(moe_tail_threads), 0, stream, a, frt_pdl_early_dependents());
}
