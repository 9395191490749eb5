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

// The norm's block as ggml-cuda's rms_norm runs it for n_embd >= 1024: 1024 threads, thread T
// adding the squares of columns T, T + 1024, ... in that order. Here that block is 8 blocks, block
// r playing stock's threads 128r .. 128r + 127 (its warps 4r .. 4r + 3) with one of our threads a
// column, as the plain tail has (its loads in one round trip): thread (h, i) of block r computes
// column 128r + i + 1024h. Measured before (H100 traces, bench/results 2026-12-05): one block of
// 512 threads doing all the loads, 8.8 us a layer; a cluster of 8 blocks, 7.6 (it started late: a
// cluster waits for 8 SMs of one GPC at once); the plain tail 3.6. The 8 blocks meet at their warp
// sums.
constexpr int moe_tail_norm_blocks = 8;
constexpr int moe_tail_norm_stock  = 1024 / moe_tail_norm_blocks;  // stock's threads a block plays
constexpr int moe_tail_norm_warps  = moe_tail_norm_stock / 32;
constexpr int moe_tail_norm_cols   = FRT_MOE_TAIL_NORM_MAX_EMBD / 1024;  // columns a stock thread

static __device__ __forceinline__ void tail_store_tagged(unsigned long long * at, unsigned long long v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(at), "l"(v) : "memory");
}

static __device__ __forceinline__ unsigned long long tail_load_tagged(const unsigned long long * at) {
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
    return v;
}

// One token's tail, then the next norm of its output quantized (frt_moe_tail_args::x_q8): each
// thread computes and writes its column; the first 128 threads of a block add the squares of their
// stock thread's columns in stock's order and reduce each warp as stock does. The blocks meet at
// the 32 warp sums themselves: each goes out as one 8-byte store of (epoch << 32 | the sum's bits)
// and every warp polls the 32 until all carry this launch's epoch, then reduces them in stock's
// order as rms_norm does, norms its 32 consecutive columns (one q8 block) and quantizes them as the
// GEMV prologue would (q8-x.cuh). The image holds the bits the next launch's prologue would compute
// from `out`. No fence, atomic or second read sits on the last block's chain (a counter's meeting
// cost the tail ~1 us more: bench/results/2026-12-06-be6bd7d-h100-tail-tags). Every launch writes
// each slot once, so all 32 hold the same epoch between launches; a block learns it from a slot
// only its warp 0 writes, before that warp writes it. Waiting for the other blocks cannot hang: a
// block waits only once it has let its dependents start, which they do only when every block of
// this launch has done the same (and the launch before ours waits for nothing of ours).
static __global__ void __launch_bounds__(moe_tail_norm_stock * moe_tail_norm_cols)
    frt_moe_tail_norm_kernel(const frt_moe_tail_args a, bool early) {
    constexpr unsigned full = 0xffffffffu;
    __shared__ float   values[moe_tail_norm_cols][moe_tail_norm_stock];
    __shared__ unsigned epoch;  // this launch's
    const int          tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int          h = tid / moe_tail_norm_stock, i = tid % moe_tail_norm_stock;
    const int          col = blockIdx.x * moe_tail_norm_stock + i + 1024 * h;
    const int          n   = a.n_embd;
    unsigned long long * tagged = (unsigned long long *) a.norm_scratch;
    // The norm's weight before the wait: no kernel writes it.
    const float w = col < n ? a.norm_w[col] : 0.0f;
    if (early) {
        frt_pdl_launch_dependents();
    }
    frt_pdl_wait();
    if (tid == 0) {  // slot 4 * blockIdx.x: written by this block's warp 0 alone
        epoch = (unsigned) (tail_load_tagged(tagged + moe_tail_norm_warps * blockIdx.x) >> 32) + 1u;
    }
    // A thread reads its column of every input before it writes it: `out` may alias a slot or the
    // residual, column for column.
    float v = 0.0f;
    if (col < n) {
        v = frt_moe_tail_value([&](int k) { return a.experts[k * a.experts_slot + col]; }, a.weights, a.n_used,
                               a.gate[0], a.shexp[col], a.residual[col]);
        a.out[col] = v;
    }
    values[h][i] = v;
    if (!early) {
        frt_pdl_launch_dependents();  // before the meeting: see above
    }
    __syncthreads();
    if (h == 0) {
        float ss = 0.0f;
        for (int j = 0; j < moe_tail_norm_cols && i + 1024 * j + blockIdx.x * moe_tail_norm_stock < n; ++j) {
            ss += values[j][i] * values[j][i];
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            ss += __shfl_xor_sync(full, ss, offset);
        }
        if (lane == 0) {
            tail_store_tagged(tagged + blockIdx.x * moe_tail_norm_warps + warp,
                              (unsigned long long) epoch << 32 | __float_as_uint(ss));
        }
    }
    float sum;  // stock's warp `lane`
    for (bool all = false; !all;) {
        const unsigned long long s = tail_load_tagged(tagged + lane);
        sum = __uint_as_float((unsigned) s);
        all = __all_sync(full, (unsigned) (s >> 32) == epoch);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_xor_sync(full, sum, offset);
    }
    const float mean  = sum / n;
    const float scale = rsqrtf(mean + a.norm_eps);
    // n is a multiple of 128: a warp's 32 columns, one q8 block, are all in range or all out.
    if (col < n) {
        frt_quantize_q8_lane(v * scale * w, lane, (int8_t *) a.x_q8 + (col - lane),
                             (uint2 *) ((uint8_t *) a.x_q8 + n) + col / 32);
    }
}

cudaError_t frt_moe_tail(const frt_moe_tail_args & a, cudaStream_t stream) {
    if (a.n_embd < 1 || a.tokens < 1 || a.n_used < 1 || a.n_used > FRT_MOE_TAIL_MAX_USED) {
        return cudaErrorInvalidValue;
    }
    if (a.x_q8 != nullptr) {
        if (a.tokens != 1 || a.n_embd % 128 != 0 || a.n_embd < 1024 || a.n_embd > 1024 * moe_tail_norm_cols ||
            a.norm_w == nullptr || a.norm_scratch == nullptr || (uintptr_t) a.norm_scratch % 16 != 0 ||
            (uintptr_t) a.norm_w % 16 != 0 || (uintptr_t) a.x_q8 % 16 != 0) {
            return cudaErrorInvalidValue;
        }
        const int stock_cols = (a.n_embd + 1023) / 1024;  // columns a stock thread
        const dim3 grid(moe_tail_norm_blocks), block(moe_tail_norm_stock * stock_cols);
        return frt_launch(frt_moe_tail_norm_kernel, grid, block, 0, stream, a, frt_pdl_early_dependents());
    }
    const dim3 grid(a.tokens, (a.n_embd + moe_tail_threads - 1) / moe_tail_threads);
    return frt_launch(frt_moe_tail_kernel, grid, dim3(moe_tail_threads), 0, stream, a, frt_pdl_early_dependents());
}
