#pragma once

// The repack cache: model weights converted once, on their device, into the layout a window's
// kernel reads, keyed by (data pointer, type, shape, layout). Entries are made by the windows'
// prepare, in the first direct evaluation of a graph (never under a CUDA graph capture: they allocate
// and launch conversions), and freed with the backend context that made them, so each device holds
// its own.
//
// Only tensors in weight buffers (llama.cpp marks them GGML_BACKEND_BUFFER_USAGE_WEIGHTS) are
// cached: their contents never change while they live. Anything else, and everything when
// GGML_CUDA_FLASHRT_NO_CACHE=1, is converted per use into ctx.pool() memory. test-backend-ops
// reuses buffers at the same addresses with new contents, hence the switch.
//
// Memory: an entry is made only while the device keeps GGML_CUDA_FLASHRT_REPACK_RESERVE_MIB
// (default 1024) free after it; otherwise it is refused, one line says so, and the window reads
// the weight in place (or converts per use). FRT_STATS reports what is cached and refused.

#include "common.cuh"

enum class flashrt_layout {
    f32,   // the tensor's elements as contiguous F32
    gemv,  // Q6_K / Q8_0 matrices in the decode GEMV's aligned layout (gemv.cuh; same bytes, reordered)
};

// GGML_CUDA_FLASHRT_NO_CACHE is not 1.
bool flashrt_repack_cache_enabled();

// Whether `w` can be held in `layout` (its type converts exactly, it is contiguous).
bool flashrt_repack_supported(const ggml_tensor * w, flashrt_layout layout);

// Begin-graph hook only: makes sure `w` is cached in `layout` for ctx's device if it is a
// weight and the cache is on. Never during capture.
void flashrt_repack_prepare(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout);

// The cached copy of `w` in `layout` for ctx's device, or nullptr (not cached: cache off, not a
// weight, refused for want of memory, or not prepared). For layouts a kernel can also read in
// place more slowly (gemv), where no per-use conversion is worth making.
const void * flashrt_repack_lookup(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout);

// `w` in `layout`, as a window's kernel reads it: w->data itself when it already is in that
// layout, the cached copy, or a conversion made now on ctx.stream() into `scratch` (capture-safe).
// `window` names the caller in errors.
class flashrt_repacked {
  public:
    flashrt_repacked(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout,
                     const char * window);
    const float * f32() const { return (const float *) data; }

  private:
    const void *                 data = nullptr;
    ggml_cuda_pool_alloc<float>  scratch;
};

// Frees every entry made for ctx (its destructor, patch 0002).
void flashrt_repack_free(ggml_backend_cuda_context & ctx);
