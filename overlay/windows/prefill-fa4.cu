#include "prefill-fa4.cuh"

#include "fa4-io.cuh"
#include "fa4.cuh"
#include "fattn.cuh"
#include "../diagnostics.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

// Below this many query tokens stock's kernels (decode, small batches) are the ones to keep.
static constexpr int64_t prefill_fa4_min_tokens = 32;

static float op_param_f32(const ggml_tensor * t, int k) {
    float v;
    std::memcpy(&v, (const int32_t *) t->op_params + k, sizeof(float));
    return v;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
static const char * prefill_fa4_miss(const ggml_tensor * fa, frt_fa4_shape & shape) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2], *mask = fa->src[3];
    if (q->ne[1] < prefill_fa4_min_tokens) {
        return "fewer tokens than a prefill (decode stays on stock's kernels)";
    }
    if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16 || fa->type != GGML_TYPE_F32) {
        return "types (F32 Q, F16 K and V, F32 output)";
    }
    if (fa->src[4] != nullptr || op_param_f32(fa, 1) != 0.0f || op_param_f32(fa, 2) != 0.0f) {
        return "attention sinks, ALiBi or a logit softcap";
    }
    if (mask == nullptr || mask->type != GGML_TYPE_F16 || mask->ne[2] != 1 || mask->ne[3] != 1) {
        return "no mask, or a mask per head or stream (FA4 runs only the causal prefix of one sequence)";
    }
    if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1) {
        return "more than one sequence stream";
    }
    if (k->ne[0] != q->ne[0] || v->ne[0] != q->ne[0] || k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] ||
        q->ne[2] % k->ne[2] != 0) {
        return "head sizes or head counts";
    }
    if (k->nb[0] != sizeof(ggml_fp16_t) || v->nb[0] != sizeof(ggml_fp16_t) || k->nb[1] % 16 != 0 || k->nb[2] % 16 != 0 ||
        v->nb[1] % 16 != 0 || v->nb[2] % 16 != 0 || (uintptr_t) k->data % 16 != 0 || (uintptr_t) v->data % 16 != 0) {
        return "K or V rows not 16-byte aligned";
    }
    if (q->nb[0] != sizeof(float) || !ggml_is_contiguous(fa)) {
        return "Q's columns or the output not contiguous";
    }
    shape = { (int) q->ne[0], (int) (q->ne[2] / k->ne[2]), true };
    if (const char * why = frt_fa4_unavailable(shape)) {
        return why;
    }
    return nullptr;
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

void flashrt_prepare_prefill_fa4(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                 const flashrt_match & m) {
    GGML_UNUSED(ctx);
    GGML_UNUSED(m);
    frt_fa4_shape shape;
    if (prefill_fa4_miss(cgraph->nodes[i], shape) == nullptr) {
        const cudaError_t err = frt_fa4_load(shape);
        if (err != cudaSuccess) {
            GGML_LOG_WARN("FlashRT: PREFILL_FA4: loading the FA4 module failed (%s); stock's flash attention runs\n",
                          cudaGetErrorString(err));
        }
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
    ggml_tensor *       fa = cgraph->nodes[i];
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2];
    frt_fa4_shape       shape;
    GGML_ASSERT(prefill_fa4_miss(fa, shape) == nullptr);
    cudaStream_t            stream  = ctx.stream();
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    const int64_t d = q->ne[0], n_q = q->ne[1], heads = q->ne[2], heads_kv = k->ne[2];
    const int64_t visible = capture == cudaStreamCaptureStatusNone ? causal_prefix(ctx, fa->src[3], n_q) : 0;
    if (visible == 0) {
        if (flashrt_debug_enabled()) {  // the match counted a hit: say that stock ran after all
            std::fprintf(stderr, "FlashRT: PREFILL_FA4 at node %d (%s): stock's flash attention: %s\n", i, fa->name,
                         capture != cudaStreamCaptureStatusNone ? "the graph is being captured"
                                                                : "the mask is not causal over a prefix of the cache");
        }
        ggml_cuda_flash_attn_ext(ctx, fa);
        return;
    }
    // Q to F16, in its own logical order (d, n_q, heads): contiguous, token stride d.
    ggml_cuda_pool_alloc<half> q16(ctx.pool(), d * n_q * heads);
    ggml_cuda_pool_alloc<half> o16(ctx.pool(), d * n_q * heads);
    CUDA_CHECK(frt_fa4_q_to_f16((const float *) q->data, d, n_q, heads, q->nb[1] / sizeof(float), q->nb[2] / sizeof(float),
                                q16.get(), stream));
    const frt_fa4_tensor tq = { q16.get(), 1, (int) n_q, (int) heads, d * n_q * heads, d, d * n_q };
    const frt_fa4_tensor tk = { k->data, 1, (int) visible, (int) heads_kv, 0, (int64_t) (k->nb[1] / sizeof(half)),
                                (int64_t) (k->nb[2] / sizeof(half)) };
    const frt_fa4_tensor tv = { v->data, 1, (int) visible, (int) heads_kv, 0, (int64_t) (v->nb[1] / sizeof(half)),
                                (int64_t) (v->nb[2] / sizeof(half)) };
    // The output as ggml lays it out, (d, heads, n_q): head stride d, token stride d x heads.
    const frt_fa4_tensor to = { o16.get(), 1, (int) n_q, (int) heads, d * n_q * heads, d * heads, d };
    float scale;
    std::memcpy(&scale, fa->op_params, sizeof(float));
    const cudaError_t err = frt_fa4_forward(shape, tq, tk, tv, to, scale, stream);
    if (err == cudaErrorNotSupported) {
        if (flashrt_debug_enabled()) {
            std::fprintf(stderr, "FlashRT: PREFILL_FA4 at node %d (%s): stock's flash attention: the module is not loaded\n",
                         i, fa->name);
        }
        ggml_cuda_flash_attn_ext(ctx, fa);
        return;
    }
    CUDA_CHECK(err);
    CUDA_CHECK(frt_fa4_o_to_f32(o16.get(), (float *) fa->data, d * n_q * heads, stream));
}
