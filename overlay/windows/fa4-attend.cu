#include "fa4-attend.cuh"

#include "window-util.cuh"
#include "fa4-io.cuh"

#include <cstring>

const char * flashrt_fa4_node_miss(const ggml_tensor * fa, int64_t min_tokens, bool causal, frt_fa4_shape & shape) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2];
    if (q->ne[1] < min_tokens) {
        return "fewer tokens than the window takes (stock's kernels keep small batches)";
    }
    if (const char * miss = flashrt_plain_attention_miss(fa)) {
        return miss;
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
    shape = flashrt_fa4_shape_of(fa, causal);
    return frt_fa4_unavailable(shape);
}

frt_fa4_shape flashrt_fa4_shape_of(const ggml_tensor * fa, bool causal) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1];
    return { (int) q->ne[0], (int) (q->ne[2] / k->ne[2]), causal };
}

void flashrt_fa4_load_for(const char * window, const frt_fa4_shape & shape) {
    const cudaError_t err = frt_fa4_load(shape);
    if (err != cudaSuccess) {
        GGML_LOG_WARN("FlashRT: %s: loading the FA4 module failed (%s); stock's flash attention runs\n", window,
                      cudaGetErrorString(err));
    }
}

bool flashrt_fa4_attend(ggml_backend_cuda_context & ctx, ggml_tensor * fa, const frt_fa4_shape & shape, int64_t n_kv) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2];
    cudaStream_t        stream = ctx.stream();
    const int64_t       d = q->ne[0], n_q = q->ne[1], heads = q->ne[2], heads_kv = k->ne[2];
    // Q to F16 in its own logical order (d, n_q, heads): token stride d, head stride d x n_q.
    ggml_cuda_pool_alloc<half> q16(ctx.pool(), d * n_q * heads);
    ggml_cuda_pool_alloc<half> o16(ctx.pool(), d * n_q * heads);
    CUDA_CHECK(frt_fa4_q_to_f16((const float *) q->data, d, n_q, heads, q->nb[1] / sizeof(float), q->nb[2] / sizeof(float),
                                q16.get(), stream));
    const frt_fa4_tensor tq = { q16.get(), 1, (int) n_q, (int) heads, d * n_q * heads, d, d * n_q };
    const frt_fa4_tensor tk = { k->data, 1, (int) n_kv, (int) heads_kv, 0, (int64_t) (k->nb[1] / sizeof(half)),
                                (int64_t) (k->nb[2] / sizeof(half)) };
    const frt_fa4_tensor tv = { v->data, 1, (int) n_kv, (int) heads_kv, 0, (int64_t) (v->nb[1] / sizeof(half)),
                                (int64_t) (v->nb[2] / sizeof(half)) };
    // The output as ggml lays it out, (d, heads, n_q): head stride d, token stride d x heads.
    const frt_fa4_tensor to = { o16.get(), 1, (int) n_q, (int) heads, d * n_q * heads, d * heads, d };
    const float          scale = flashrt_op_param_f32(fa, 0);
    const cudaError_t    err   = frt_fa4_forward(shape, tq, tk, tv, to, scale, stream);
    if (err == cudaErrorNotSupported) {
        return false;
    }
    CUDA_CHECK(err);
    CUDA_CHECK(frt_fa4_o_to_f32(o16.get(), (float *) fa->data, d * n_q * heads, stream));
    return true;
}
