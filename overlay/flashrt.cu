#include "flashrt.cuh"
#include "registry.cuh"

#include <cstdlib>
#include <cstring>

// GGML_CUDA_FLASHRT_DISABLE=1 turns the whole layer off: the same binary then runs stock kernels.
static bool flashrt_disabled() {
    static const bool disabled = [] {
        const char * v = std::getenv("GGML_CUDA_FLASHRT_DISABLE");
        return v != nullptr && std::strcmp(v, "1") == 0;
    }();
    return disabled;
}

void ggml_cuda_flashrt_begin_graph(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph) {
    GGML_UNUSED(ctx);
    GGML_UNUSED(cgraph);
}

int ggml_cuda_flashrt_try_window(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (flashrt_disabled()) {
        return 0;
    }
    const int cc = ggml_cuda_info().devices[ctx.device].cc;
    int n_windows = 0;
    const flashrt_window * windows = flashrt_windows(&n_windows);
    for (int w = 0; w < n_windows; ++w) {
        const flashrt_window & window = windows[w];
        if (window.tier != flashrt_tier::safe || cc < window.min_cc) {
            continue;
        }
        const flashrt_match m = window.match(cgraph, i);
        if (m.miss == nullptr && m.n_nodes > 1) {
            window.run(ctx, cgraph, i, m);
            return m.n_nodes - 1;
        }
    }
    return 0;
}
