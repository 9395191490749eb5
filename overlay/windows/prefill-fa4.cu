#include "prefill-fa4.cuh"

#include "../diagnostics.cuh"
#include "fa4-attend.cuh"
#include "fattn.cuh"

#include <cmath>
#include <cstdio>
#include <mutex>
#include <vector>

// Below this many query tokens stock's kernels (decode, small batches) are the ones to keep.
static constexpr int64_t prefill_fa4_min_tokens = 32;

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
static const char * prefill_fa4_miss(const ggml_tensor * fa, frt_fa4_shape & shape) {
    const ggml_tensor * mask = fa->src[3];
    if (mask == nullptr || mask->type != GGML_TYPE_F16 || mask->ne[2] != 1 || mask->ne[3] != 1) {
        return "no mask, or a mask per head or stream (FA4 runs only the causal prefix of one sequence)";
    }
    return flashrt_fa4_node_miss(fa, prefill_fa4_min_tokens, true, shape);
}

flashrt_match flashrt_match_prefill_fa4(const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * fa = cgraph->nodes[i];
    if (fa->op != GGML_OP_FLASH_ATTN_EXT) {
        return flashrt_miss(flashrt_miss_anchor);
    }
    frt_fa4_shape shape;
    if (const char * miss = prefill_fa4_miss(fa, shape)) {
        return flashrt_miss(miss);
    }
    return flashrt_hit(1);
}

bool flashrt_prefill_fa4_reads_host(const ggml_cgraph * cgraph) {
    for (int i = 0; i < cgraph->n_nodes; ++i) {
        frt_fa4_shape shape;
        if (cgraph->nodes[i]->op == GGML_OP_FLASH_ATTN_EXT && prefill_fa4_miss(cgraph->nodes[i], shape) == nullptr) {
            return true;
        }
    }
    return false;
}

void flashrt_prepare_prefill_fa4(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                 const flashrt_match & m) {
    GGML_UNUSED(ctx);
    GGML_UNUSED(m);
    frt_fa4_shape shape;
    if (prefill_fa4_miss(cgraph->nodes[i], shape) == nullptr) {
        flashrt_fa4_load_for("PREFILL_FA4", shape);
    }
}

// The keys every query sees, when the mask is causal over a prefix of the cache: row r (of n_q)
// sees exactly cells [0, visible - (n_q - 1 - r)) (0 there, -inf elsewhere), as FA4's causal
// attention of n_q queries over `visible` keys does. Returns 0 when the mask is anything else.
// Reads the mask to the host (a synchronisation): once per graph evaluation and mask.
static int64_t causal_prefix(ggml_backend_cuda_context & ctx, const ggml_tensor * mask, int64_t n_q) {
    struct seen {
        const void * data       = nullptr;
        uint64_t     evaluation = 0;
        int64_t      n_q = 0, visible = 0;
    };
    static std::mutex mutex;
    static seen       last[4];
    static int        next = 0;
    const uint64_t    evaluation = flashrt_evaluation();
    std::lock_guard<std::mutex> lock(mutex);
    for (const seen & s : last) {
        if (s.data == mask->data && s.evaluation == evaluation && s.n_q == n_q) {
            return s.visible;
        }
    }
    const int64_t            n_kv = mask->ne[0];
    std::vector<ggml_fp16_t> rows((size_t) n_q * n_kv);
    CUDA_CHECK(cudaMemcpy2DAsync(rows.data(), n_kv * sizeof(ggml_fp16_t), mask->data, mask->nb[1],
                                 n_kv * sizeof(ggml_fp16_t), n_q, cudaMemcpyDeviceToHost, ctx.stream()));
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const auto visible_in = [&](int64_t r) {  // leading zeros of row r, or -1 when the rest is not all -inf
        const ggml_fp16_t * row = rows.data() + r * n_kv;
        int64_t             c   = 0;
        while (c < n_kv && ggml_fp16_to_fp32(row[c]) == 0.0f) {
            ++c;
        }
        for (int64_t j = c; j < n_kv; ++j) {
            const float x = ggml_fp16_to_fp32(row[j]);
            if (!(std::isinf(x) && x < 0.0f)) {
                return (int64_t) -1;
            }
        }
        return c;
    };
    int64_t visible = visible_in(n_q - 1);
    if (visible < n_q) {
        visible = 0;
    }
    for (int64_t r = 0; r + 1 < n_q && visible > 0; ++r) {
        if (visible_in(r) != visible - (n_q - 1 - r)) {
            visible = 0;
        }
    }
    last[next] = { mask->data, evaluation, n_q, visible };
    next       = (next + 1) % 4;
    return visible;
}

void flashrt_run_prefill_fa4(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    ggml_tensor *       fa    = cgraph->nodes[i];
    const frt_fa4_shape shape = flashrt_fa4_shape_of(fa, true);  // the match accepted the node
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capture));
    const int64_t visible =
        capture == cudaStreamCaptureStatusNone ? causal_prefix(ctx, fa->src[3], fa->src[0]->ne[1]) : 0;
    const char * stock = visible == 0 ? (capture != cudaStreamCaptureStatusNone
                                             ? "the graph is being captured (the begin-graph hook should have said no)"
                                             : "the mask is not causal over a prefix of the cache")
                         : !flashrt_fa4_attend(ctx, fa, shape, visible) ? "the module is not loaded"
                                                                         : nullptr;
    if (stock != nullptr) {
        if (flashrt_debug_enabled()) {  // the match counted a hit: say that stock ran after all
            std::fprintf(stderr, "FlashRT: PREFILL_FA4 at node %d (%s): stock's flash attention: %s\n", i, fa->name,
                         stock);
        }
        ggml_cuda_flash_attn_ext(ctx, fa);
    }
}
