#include "counters.cuh"

#include "gemv.cuh"
#include "moe-ffn-tail.cuh"
#include "q8-x.cuh"

#include <map>
#include <mutex>

// Slices, in the order of flashrt_counter_use (each a multiple of 4: every slice 16-byte aligned).
static constexpr int counters_size[] = { 256, 2048, frt_x_q8_bytes(FRT_X_Q8_MAX_K) / 4, FRT_MOE_TAIL_NORM_SCRATCH,
                                         FRT_GEMV_CHUNK_COUNTER_WORDS };
static constexpr int counters_uses   = (int) (sizeof(counters_size) / sizeof(counters_size[0]));
static_assert(FRT_MOE_TAIL_NORM_SCRATCH % 4 == 0 && FRT_GEMV_CHUNK_COUNTER_WORDS % 4 == 0, "every slice 16-byte aligned");

int flashrt_counters_size(flashrt_counter_use use) {
    return counters_size[(int) use];
}

static int counters_offset(flashrt_counter_use use) {
    int offset = 0;
    for (int u = 0; u < (int) use; ++u) {
        offset += counters_size[u];
    }
    return offset;
}

struct flashrt_context_counters {
    std::mutex                                              mutex;
    std::map<const ggml_backend_cuda_context *, unsigned *> of;
};

static flashrt_context_counters & context_counters() {
    static auto * c = new flashrt_context_counters;  // never destroyed: contexts may outlive statics
    return *c;
}

bool flashrt_counters_prepare(ggml_backend_cuda_context & ctx) {
    flashrt_context_counters &  c = context_counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.of.count(&ctx) != 0) {
        return true;
    }
    ggml_cuda_set_device(ctx.device);
    const size_t bytes = counters_offset((flashrt_counter_use) counters_uses) * sizeof(unsigned);  // the last slice's end
    unsigned *   p     = nullptr;
    // Zeroed on the stream the kernels run on: prepared in the node loop, just before them.
    if (cudaMalloc(&p, bytes) != cudaSuccess || cudaMemsetAsync(p, 0, bytes, ctx.stream()) != cudaSuccess) {
        (void) cudaGetLastError();
        if (p != nullptr) {
            cudaFree(p);
        }
        return false;
    }
    c.of[&ctx] = p;
    return true;
}

unsigned * flashrt_counters_of(const ggml_backend_cuda_context & ctx, flashrt_counter_use use) {
    flashrt_context_counters &  c = context_counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto                        it = c.of.find(&ctx);
    return it != c.of.end() ? it->second + counters_offset(use) : nullptr;
}

void flashrt_free_counters(const ggml_backend_cuda_context & ctx) {
    flashrt_context_counters &  c = context_counters();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto                        it = c.of.find(&ctx);
    if (it != c.of.end()) {
        cudaFree(it->second);
        c.of.erase(it);
    }
}
