// The attention output gate with the product's q8 image (gate-mul-q8.cuh).
#include "gate-mul-q8.cuh"

#include "pdl.cuh"
#include "q8-x.cuh"

static constexpr int kGateThreads = 256;  // 8 warps: a warp a 32-value block of the product

static __global__ void __launch_bounds__(kGateThreads) frt_gate_mul_q8_kernel(const frt_gate_mul_q8_args a) {
    const int lane = threadIdx.x % 32;
    const int b    = blockIdx.x * (kGateThreads / 32) + threadIdx.x / 32;  // the warp's 32-value block
    const int i    = 32 * b + lane;                                         // the product's element
    frt_pdl_wait();  // attention wrote attn just before
    frt_pdl_launch_dependents();  // their wait covers the writes below
    if (b >= a.d * a.heads / 32) {
        return;  // whole warps: d is a multiple of 32
    }
    const int   h = i / a.d, c = i % a.d;
    const float g = a.gate[h * a.gate_head + c];
    const float v = (1.0f / (1.0f + expf(-g))) * a.attn[h * a.attn_head + c];  // op_sigmoid's, then the product
    a.out[i]      = v;
    if (a.x_q8 != nullptr) {
        const int k = a.d * a.heads;
        frt_quantize_q8_lane(v, lane, (int8_t *) a.x_q8 + 32 * b, (uint2 *) ((uint8_t *) a.x_q8 + k) + b);
    }
}

const char * frt_gate_mul_q8_unsupported(const frt_gate_mul_q8_args & a) {
    if (a.d < 32 || a.d % 32 != 0 || a.heads < 1) {
        return "d must be a positive multiple of 32, heads at least 1";
    }
    if (a.attn == nullptr || a.gate == nullptr || a.out == nullptr || a.attn_head < a.d || a.gate_head < a.d) {
        return "attn, gate and out must be set, heads at least d floats apart";
    }
    const int64_t k = (int64_t) a.d * a.heads;
    if (a.x_q8 != nullptr && (k > FRT_X_Q8_MAX_K || (reinterpret_cast<uintptr_t>(a.x_q8) & 15) != 0)) {
        return "x_q8 must be 16-byte aligned, d * heads at most FRT_X_Q8_MAX_K";
    }
    return nullptr;
}

cudaError_t frt_gate_mul_q8(const frt_gate_mul_q8_args & a, cudaStream_t stream) {
    if (frt_gate_mul_q8_unsupported(a) != nullptr) {
        return cudaErrorInvalidValue;
    }
    const int blocks32 = a.d * a.heads / 32;
    const int grid     = (blocks32 + kGateThreads / 32 - 1) / (kGateThreads / 32);
    return frt_launch(frt_gate_mul_q8_kernel, dim3(grid), dim3(kGateThreads), 0, stream, a);
}
