#include "moe-ffn-tail.cuh"
#include "pdl.cuh"

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

cudaError_t frt_moe_tail(const frt_moe_tail_args & a, cudaStream_t stream) {
    if (a.n_embd < 1 || a.tokens < 1 || a.n_used < 1 || a.n_used > FRT_MOE_TAIL_MAX_USED) {
        return cudaErrorInvalidValue;
    }
    const dim3 grid(a.tokens, (a.n_embd + moe_tail_threads - 1) / moe_tail_threads);
    return frt_launch(frt_moe_tail_kernel, grid, dim3(moe_tail_threads), 0, stream, a, frt_pdl_early_dependents());
}
