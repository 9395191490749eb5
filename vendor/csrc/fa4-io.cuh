#pragma once

// The conversions around an FA4 module (vendor/csrc/fa4.cuh), which reads and writes F16: Q from
// F32 with any token and head strides, the output back to F32. Plain pointers, sizes and strides.

#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// q: `heads` heads of `n` tokens of `d` floats, element (i, t, h) at q[t * s_token + h * s_head + i];
// out: F16, element (i, t, h) at out[(h * n + t) * d + i]. Returns the launch error.
cudaError_t frt_fa4_q_to_f16(const float * q, int64_t d, int64_t n, int64_t heads, int64_t s_token, int64_t s_head,
                             half * out, cudaStream_t stream);

// out[i] = o[i] for `count` values. Returns the launch error.
cudaError_t frt_fa4_o_to_f32(const half * o, float * out, int64_t count, cudaStream_t stream);
