#include "attn-decode.cuh"

#include "window-util.cuh"
#include "decode-attention.cuh"

static bool aligned16(const ggml_tensor * t) {
    return t->nb[0] == sizeof(ggml_fp16_t) && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 && (uintptr_t) t->data % 16 == 0;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
static const char * attn_decode_miss(const ggml_tensor * fa) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2], *mask = fa->src[3];
    if (const char * miss = flashrt_plain_attention_miss(fa)) {
        return miss;
    }
    const int64_t d = q->ne[0], n_q = q->ne[1], heads = q->ne[2], n_kv = k->ne[1], heads_kv = k->ne[2];
    if (n_q > 1 && !flashrt_multi_token_enabled()) {
        return "batch: several tokens (GGML_FLASHRT_MULTI_TOKEN=0)";
    }
    if (k->ne[0] != d || v->ne[0] != d || v->ne[1] != n_kv || v->ne[2] != heads_kv) {
        return "K and V shapes differ from Q's head size or from each other";
    }
    if (const char * why = frt_attn_decode_unsupported((int) d, (int) heads, (int) heads_kv, (int) n_q, (int) n_kv)) {
        return why;
    }
    if (heads_kv > 65535) {
        return "more than 65535 key/value heads (the launch's grid)";
    }
    if (q->nb[0] != sizeof(float) || q->nb[1] % sizeof(float) != 0 || q->nb[2] % sizeof(float) != 0) {
        return "Q's columns not contiguous floats";
    }
    if (!aligned16(k) || !aligned16(v)) {
        return "K or V rows not 16-byte aligned";
    }
    if (mask != nullptr && (mask->type != GGML_TYPE_F16 || mask->ne[0] < n_kv || mask->ne[1] < n_q || mask->ne[2] != 1 ||
                            mask->ne[3] != 1 || mask->nb[0] != sizeof(ggml_fp16_t))) {
        return "mask not one F16 row a query over the cells";
    }
    if (!ggml_is_contiguous(fa) || fa->ne[0] != d || fa->ne[1] != heads || fa->ne[2] != n_q) {
        return "output not a contiguous [d, heads, tokens]";
    }
    return nullptr;
}

flashrt_match flashrt_match_attn_decode(const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * fa = cgraph->nodes[i];
    if (fa->op != GGML_OP_FLASH_ATTN_EXT) {
        return flashrt_miss(flashrt_miss_anchor);
    }
    if (const char * miss = attn_decode_miss(fa)) {
        return flashrt_miss(miss);
    }
    return flashrt_hit(1);
}

void flashrt_run_attn_decode(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    ggml_tensor *       fa = cgraph->nodes[i];  // the match accepted it
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2], *mask = fa->src[3];
    frt_attn_decode_args a = {};
    a.d        = (int) q->ne[0];
    a.n_q      = (int) q->ne[1];
    a.heads    = (int) q->ne[2];
    a.n_kv     = (int) k->ne[1];
    a.heads_kv = (int) k->ne[2];
    a.q         = (const float *) q->data;
    a.q_token   = q->nb[1] / sizeof(float);
    a.q_head    = q->nb[2] / sizeof(float);
    a.k         = (const __half *) k->data;
    a.k_cell    = k->nb[1] / sizeof(ggml_fp16_t);
    a.k_head    = k->nb[2] / sizeof(ggml_fp16_t);
    a.v         = (const __half *) v->data;
    a.v_cell    = v->nb[1] / sizeof(ggml_fp16_t);
    a.v_head    = v->nb[2] / sizeof(ggml_fp16_t);
    a.mask      = mask != nullptr ? (const __half *) mask->data : nullptr;
    a.mask_row  = mask != nullptr ? mask->nb[1] / sizeof(ggml_fp16_t) : 0;
    a.out       = (float *) fa->data;
    a.out_head  = fa->nb[1] / sizeof(float);
    a.out_token = fa->nb[2] / sizeof(float);
    a.scale     = flashrt_op_param_f32(fa, 0);
    CUDA_CHECK(frt_attn_decode(a, ctx.stream()));
}
