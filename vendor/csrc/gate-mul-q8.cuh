#pragma once

// The output gate of Qwen3.5/3.6's full-attention layers for one token, as ggml-cuda's fused
// SIGMOID-MUL forms it (unary_gated_op_kernel<op_sigmoid>: (1 / (1 + expf(-gate))) * attn), written
// out and, when x_q8 is set, as the q8 image of the product (q8-x.cuh) that the next GEMV launch
// (the attention output projection) copies instead of reading and quantizing `out` after its wait.
// The gate is read through its view of the q projection (no CONT first).

#include <cstdint>
#include <cuda_runtime.h>

struct frt_gate_mul_q8_args {
    const float * attn;  // head h: d floats at attn + h * attn_head
    int64_t       attn_head;
    const float * gate;  // head h: d floats at gate + h * gate_head
    int64_t       gate_head;
    float *       out;   // d * heads contiguous floats; may be attn itself, element for element
    void *        x_q8;  // nullptr, or frt_x_q8_bytes(d * heads) bytes, 16-byte aligned
    int           d;     // a multiple of 32
    int           heads;
};

// Why the kernel does not take `a`, or nullptr.
const char * frt_gate_mul_q8_unsupported(const frt_gate_mul_q8_args & a);

// Launches on `stream` (PDL when enabled); capture-safe. cudaErrorInvalidValue where unsupported.
cudaError_t frt_gate_mul_q8(const frt_gate_mul_q8_args & a, cudaStream_t stream);
