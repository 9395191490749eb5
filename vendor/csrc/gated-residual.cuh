#pragma once

// Gated residual: for each token t (a column of n values),
//   g = sigmoid(dot(w, x_t));  out_t = a_t + g * s_t (+ r_t)
// The shared-expert gate of Qwen3.5/3.6 MoE layers: x is the FFN input, w the F32 gate vector,
// s the shared expert's output, a the routed experts' output, r the layer's residual.

#include <cstdint>
#include <cuda_runtime.h>

struct frt_gated_residual_args {
    const float * w;    // [n]
    const float * x;    // [n] per token, token stride x_token (elements)
    const float * s;    // shared expert output
    const float * a;    // routed experts output
    const float * r;    // residual, or nullptr
    float *       out;  // may be a, s, r or x itself when laid out identically
    int           n;
    int           n_tokens;
    int64_t       x_token, s_token, a_token, r_token, out_token;
};

// Launches on `stream`; capture-safe.
cudaError_t frt_gated_residual_f32(const frt_gated_residual_args & args, cudaStream_t stream);
