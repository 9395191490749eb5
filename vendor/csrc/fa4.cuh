#pragma once

// FlashAttention-4 forward kernels compiled ahead of time (fa4_aot/): the modules linked into this
// build, loaded on demand and run through their generated entry points. Plain pointers, sizes and
// strides, no ggml types.
//
// Compiled in when the build has objects for one of its architectures: the overlay's CMake then
// defines FRT_FA4 and writes frt-fa4-modules.h (bench/device/fa4.sh does the same for the
// standalone test). Otherwise every call answers why not, and nothing else is compiled.

#include <cstdint>
#include <cuda_runtime.h>

// One tensor (batch, sequence, heads, head_dim) of F16 values, head_dim contiguous; strides in
// elements, multiples of 8 (rows 16-byte aligned), data 16-byte aligned.
struct frt_fa4_tensor {
    void *  data;
    int     batch, seq, heads;
    int64_t stride_batch, stride_seq, stride_head;
};

// What a module is compiled for: the head dimension, query heads per key/value head, causality.
struct frt_fa4_shape {
    int  head_dim;
    int  qhead_per_kvhead;
    bool causal;
};

// nullptr when a module of this shape is linked for the current device's architecture, else why
// not (no objects in the build, none of that shape, another architecture).
const char * frt_fa4_unavailable(const frt_fa4_shape & shape);

// Loads the module of `shape` on the current device, once; outside CUDA graph capture (loading
// is not capturable). Returns the load's error.
cudaError_t frt_fa4_load(const frt_fa4_shape & shape);

// O = softmax(Q K^T * scale [causal mask]) V with the module of `shape` (loaded on this device by
// frt_fa4_load) on `stream`: capture-safe. K and V have heads / qhead_per_kvhead heads.
cudaError_t frt_fa4_forward(const frt_fa4_shape & shape, const frt_fa4_tensor & q, const frt_fa4_tensor & k,
                            const frt_fa4_tensor & v, const frt_fa4_tensor & o, float scale, cudaStream_t stream);

// One line: the modules linked (names), or why there are none. For FRT_STATS and tests.
const char * frt_fa4_summary();
