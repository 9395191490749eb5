#include "repack.cuh"
#include "diagnostics.cuh"

#include "convert.cuh"
#include "gemv.cuh"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

bool flashrt_repack_cache_enabled() {
    static const bool enabled = !flashrt_env_flag("GGML_CUDA_FLASHRT_NO_CACHE", false);
    return enabled;
}

bool flashrt_repack_supported(const ggml_tensor * w, flashrt_layout layout) {
    switch (layout) {
        case flashrt_layout::f32:
            // Exact conversions only: quantized types would change what the window computes.
            return ggml_is_contiguous(w) &&
                   (w->type == GGML_TYPE_F32 || w->type == GGML_TYPE_F16 || w->type == GGML_TYPE_BF16);
        case flashrt_layout::gemv:
            // A reordering of the same blocks: lossless by construction.
            return ggml_is_contiguous(w) && w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % 256 == 0 &&
                   w->ne[1] <= INT32_MAX && (w->type == GGML_TYPE_Q6_K || w->type == GGML_TYPE_Q8_0);
    }
    return false;
}

static frt_gemv_type gemv_source_type(const ggml_tensor * w) {
    return w->type == GGML_TYPE_Q6_K ? FRT_GEMV_Q6_K : FRT_GEMV_Q8_0;
}

struct flashrt_repack_key {
    const ggml_backend_cuda_context * ctx;
    const void *                      data;
    ggml_type                         type;
    int64_t                           ne[GGML_MAX_DIMS];
    flashrt_layout                    layout;

    bool operator<(const flashrt_repack_key & o) const {
        return std::tie(ctx, data, type, ne[0], ne[1], ne[2], ne[3], layout) <
               std::tie(o.ctx, o.data, o.type, o.ne[0], o.ne[1], o.ne[2], o.ne[3], o.layout);
    }
};

struct flashrt_repack_entry {
    void * data;
    size_t bytes;
};

// One table for every context: contexts on other threads (one per device) look up concurrently.
struct flashrt_repack_table {
    std::mutex                    mutex;
    std::map<flashrt_repack_key, flashrt_repack_entry>    entries;
};

// Never destroyed: a backend context may be freed after static destructors ran.
static flashrt_repack_table & cache() {
    static flashrt_repack_table * c = new flashrt_repack_table;
    return *c;
}

static flashrt_repack_key key_of(const ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout) {
    flashrt_repack_key k{ &ctx, w->data, w->type, {}, layout };
    std::memcpy(k.ne, w->ne, sizeof(k.ne));
    return k;
}

static bool is_weight(const ggml_tensor * w) {
    return w->buffer != nullptr && ggml_backend_buffer_get_usage(w->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}

// Already in the layout: read in place.
static bool is_native(const ggml_tensor * w, flashrt_layout layout) {
    return layout == flashrt_layout::f32 && w->type == GGML_TYPE_F32;
}

static void convert(const ggml_tensor * w, flashrt_layout layout, void * dst, cudaStream_t stream) {
    switch (layout) {
        case flashrt_layout::f32: {
            const to_fp32_cuda_t to_f32 = ggml_get_to_fp32_cuda(w->type);
            GGML_ASSERT(to_f32 != nullptr);
            to_f32(w->data, (float *) dst, ggml_nelements(w), stream);
            break;
        }
        case flashrt_layout::gemv:
            CUDA_CHECK(frt_gemv_repack(gemv_source_type(w), w->data, w->nb[1], (int) w->ne[1], (int) w->ne[0], dst,
                                       stream));
            break;
    }
}

static size_t layout_bytes(const ggml_tensor * w, flashrt_layout layout) {
    switch (layout) {
        case flashrt_layout::f32:
            return ggml_nelements(w) * sizeof(float);
        case flashrt_layout::gemv:
            return (size_t) w->ne[1] *
                   frt_gemv_row_bytes(frt_gemv_repacked_type(gemv_source_type(w)), (int) w->ne[0]);
    }
    return 0;
}

// Device memory an entry must leave free (a KV cache or compute buffer may still grow).
static size_t reserve_bytes() {
    static const size_t reserve = [] {
        const char * v = std::getenv("GGML_CUDA_FLASHRT_REPACK_RESERVE_MIB");
        return (size_t) (v ? std::atoll(v) : 1024) * 1024 * 1024;
    }();
    return reserve;
}

void flashrt_repack_prepare(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout) {
    if (!flashrt_repack_cache_enabled() || is_native(w, layout) || !is_weight(w) ||
        !flashrt_repack_supported(w, layout)) {
        return;
    }
    flashrt_repack_table & c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    const flashrt_repack_key key = key_of(ctx, w, layout);
    if (c.entries.count(key) != 0) {
        return;
    }
    const size_t bytes = layout_bytes(w, layout);
    ggml_cuda_set_device(ctx.device);
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    if (free < bytes + reserve_bytes()) {
        flashrt_stats & stats = flashrt_global_stats();
        if (stats.repack_refused.fetch_add(1) == 0) {
            GGML_LOG_WARN("FlashRT: repack cache: device %d has %zu MiB free, keeping %zu MiB: weights from %s on are "
                          "read in place (slower); set GGML_CUDA_FLASHRT_REPACK_RESERVE_MIB to change the reserve\n",
                          ctx.device, free >> 20, reserve_bytes() >> 20, w->name);
        }
        stats.repack_refused_bytes += bytes;
        // Remember the refusal: the next graph must not try (and log) again.
        c.entries.emplace(key, flashrt_repack_entry{ nullptr, 0 });
        return;
    }
    void * data = nullptr;
    CUDA_CHECK(cudaMalloc(&data, bytes));
    convert(w, layout, data, ctx.stream());
    CUDA_CHECK(cudaGetLastError());
    c.entries.emplace(key, flashrt_repack_entry{ data, bytes });
    flashrt_global_stats().repack_tensors++;
    flashrt_global_stats().repack_bytes += bytes;
}

const void * flashrt_repack_lookup(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout) {
    if (!flashrt_repack_cache_enabled() || !is_weight(w)) {
        return nullptr;
    }
    flashrt_repack_table & c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.entries.find(key_of(ctx, w, layout));
    return it == c.entries.end() ? nullptr : it->second.data;
}

flashrt_repacked::flashrt_repacked(ggml_backend_cuda_context & ctx, const ggml_tensor * w, flashrt_layout layout,
                                   const char * window)
    : scratch(ctx.pool()) {
    // gemv layouts are only looked up (flashrt_repack_lookup): the kernel reads the GGUF layout too.
    GGML_ASSERT(layout == flashrt_layout::f32);
    if (!flashrt_repack_supported(w, layout)) {
        GGML_ABORT("FlashRT window %s: weight %s (%s) cannot be repacked; its predicate should have rejected it",
                   window, w->name, ggml_type_name(w->type));
    }
    if (is_native(w, layout)) {
        data = w->data;
        return;
    }
    if (flashrt_repack_cache_enabled() && is_weight(w)) {
        flashrt_repack_table & c = cache();
        std::lock_guard<std::mutex> lock(c.mutex);
        const auto it = c.entries.find(key_of(ctx, w, layout));
        if (it != c.entries.end() && it->second.data != nullptr) {
            data = it->second.data;
            return;
        }
    }
    // Not cached (cache off, not a weight, or a capture of a graph no direct evaluation prepared).
    flashrt_global_stats().repack_per_use++;
    scratch.alloc(ggml_nelements(w));
    convert(w, layout, scratch.get(), ctx.stream());
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        GGML_ABORT("FlashRT window %s: converting %s: %s", window, w->name, cudaGetErrorString(err));
    }
    data = scratch.get();
}

void flashrt_repack_free(ggml_backend_cuda_context & ctx) {
    flashrt_repack_table & c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    for (auto it = c.entries.begin(); it != c.entries.end();) {
        if (it->first.ctx == &ctx) {
            ggml_cuda_set_device(ctx.device);
            if (it->second.data != nullptr) {
                CUDA_CHECK(cudaFree(it->second.data));
            }
            it = c.entries.erase(it);
        } else {
            ++it;
        }
    }
}
