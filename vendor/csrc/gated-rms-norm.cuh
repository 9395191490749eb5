#pragma once

// Gated RMS norm: out = x / sqrt(mean(x^2) + eps) * w * silu(z), row by row.
// The Gated DeltaNet output norm of Qwen3.5/3.6 (ssm_norm, gated by z). Plain pointers and
// strides: no ggml types, so it is tested on its own (tests/test-gated-rms-norm.cu).

#include <cstdint>
#include <cuda_runtime.h>

struct frt_gated_rms_norm_args {
    const float * x;    // [ncols] rows at x + r*x_row + c*x_channel + s*x_sample
    const float * w;    // [ncols], shared by all rows
    const float * z;    // same layout as x, with its own strides
    float *       out;  // same layout, its own strides; may be x itself
    int           ncols;
    int           nrows;
    int           nchannels;
    int           nsamples;
    int64_t       x_row, x_channel, x_sample;  // strides in elements
    int64_t       z_row, z_channel, z_sample;
    int64_t       out_row, out_channel, out_sample;
    float         eps;
    // w is never written by a kernel on the stream (a model weight): it is loaded before the PDL wait.
    bool          w_constant;
};

// Launches on `stream`; capture-safe. Returns the launch error, if any.
cudaError_t frt_gated_rms_norm_f32(const frt_gated_rms_norm_args & args, cudaStream_t stream);
