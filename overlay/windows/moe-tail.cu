#include "moe-tail.cuh"
#include "gemv-pack.cuh"
#include "window-util.cuh"

#include "../counters.cuh"

#include "moe-ffn-tail.cuh"

#include <algorithm>
#include <vector>

static bool is_f32_rows(const ggml_tensor * t, int64_t n_embd, int64_t tokens) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == n_embd && t->ne[1] == tokens && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->nb[0] == sizeof(float);
}

// The other source of binary node `t`, when one of its sources is `one`; nullptr otherwise.
static const ggml_tensor * other_source(const ggml_tensor * t, const ggml_tensor * one) {
    return t->src[0] == one ? t->src[1] : t->src[1] == one ? t->src[0] : nullptr;
}

static const char * moe_tail_collect(const ggml_cgraph * cgraph, int i, flashrt_moe_tail_run & r) {
    const ggml_tensor * w = cgraph->nodes[i];
    if (w->op != GGML_OP_MUL) {
        return flashrt_miss_anchor;
    }
    const auto is_experts = [w](const ggml_tensor * t) {
        return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && ggml_are_same_shape(t, w);
    };
    const auto is_weights = [w](const ggml_tensor * t) {
        return t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[0] == 1 && t->ne[1] == w->ne[1] &&
               t->ne[2] == w->ne[2] && t->ne[3] == w->ne[3];
    };
    if (w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w) || w->ne[3] != 1) {
        return flashrt_miss_anchor;
    }
    if (is_experts(w->src[0]) && is_weights(w->src[1])) {
        r.experts = w->src[0], r.weights = w->src[1];
    } else if (is_experts(w->src[1]) && is_weights(w->src[0])) {
        r.experts = w->src[1], r.weights = w->src[0];
    } else {
        return flashrt_miss_anchor;  // not the routed experts' weighting
    }
    if (i + 1 >= cgraph->n_nodes || cgraph->nodes[i + 1]->op != GGML_OP_VIEW || cgraph->nodes[i + 1]->src[0] != w) {
        return flashrt_miss_anchor;  // a broadcast MUL, not viewed slot by slot
    }
    r.weighted = w;
    r.n_used   = (int) w->ne[1];
    r.tokens   = (int) w->ne[2];
    const int64_t n_embd = w->ne[0];
    if (r.n_used < 2 || r.n_used > FRT_MOE_TAIL_MAX_USED) {
        return "shape: fewer than 2 or more than 16 experts a token";
    }
    const int sig_at = i + 2 * r.n_used;
    r.end            = sig_at + 3;
    if (r.end >= cgraph->n_nodes) {
        return "graph ends";
    }
    // The slots' views, then the ADD chain in slot order: stock's summation order.
    const ggml_tensor * views[FRT_MOE_TAIL_MAX_USED];
    for (int k = 0; k < r.n_used; ++k) {
        const ggml_tensor * v = cgraph->nodes[i + 1 + k];
        if (v->op != GGML_OP_VIEW || v->src[0] != w || !is_f32_rows(v, n_embd, r.tokens) ||
            (r.tokens > 1 && v->nb[1] != w->nb[2]) || v->view_offs % w->nb[1] != 0 ||
            v->view_offs / w->nb[1] >= (size_t) r.n_used) {
            return "the weighted experts are not followed by one view a slot";
        }
        views[k] = v;
    }
    const auto slot_of = [&](const ggml_tensor * v) {
        const ggml_tensor * const * at = std::find(views, views + r.n_used, v);
        return at == views + r.n_used ? -1 : (int) ((*at)->view_offs / w->nb[1]);
    };
    const ggml_tensor * sum = nullptr;
    for (int k = 1; k < r.n_used; ++k) {
        const ggml_tensor * add = cgraph->nodes[i + r.n_used + k];
        const ggml_tensor * lhs = k == 1 ? nullptr : sum;
        if (add->op != GGML_OP_ADD || !is_f32_rows(add, n_embd, r.tokens) ||
            (k == 1 ? slot_of(add->src[0]) != 0 : add->src[0] != lhs) || slot_of(add->src[1]) != k) {
            return "the slots are not summed in order by a chain of ADDs";
        }
        sum = add;
    }
    r.sigmoid = cgraph->nodes[sig_at];
    if (r.sigmoid->op != GGML_OP_UNARY || ggml_get_unary_op(r.sigmoid) != GGML_UNARY_OP_SIGMOID) {
        return "the weighted sum is not followed by the shared expert's gate SIGMOID (its down projection in between?)";
    }
    r.gate = r.sigmoid->src[0];
    const ggml_tensor * gated = cgraph->nodes[sig_at + 1];
    r.shexp                   = gated->op == GGML_OP_MUL ? other_source(gated, r.sigmoid) : nullptr;
    const ggml_tensor * ffn   = cgraph->nodes[sig_at + 2];
    const ggml_tensor * moe   = ffn->op == GGML_OP_ADD ? other_source(ffn, gated) : nullptr;
    r.out                     = cgraph->nodes[r.end];
    r.residual                = r.out->op == GGML_OP_ADD ? other_source(r.out, ffn) : nullptr;
    if (r.shexp == nullptr || moe != sum || r.residual == nullptr) {
        return "not SIGMOID -> MUL(shared expert) -> ADD(weighted sum) -> ADD(residual)";
    }
    if (r.gate->type != GGML_TYPE_F32 || r.gate->ne[0] != 1 || r.gate->ne[1] != r.tokens ||
        ggml_nelements(r.gate) != r.tokens || !ggml_is_contiguous(r.gate) || !is_f32_rows(r.shexp, n_embd, r.tokens) ||
        !is_f32_rows(r.residual, n_embd, r.tokens) || !is_f32_rows(gated, n_embd, r.tokens) ||
        !is_f32_rows(ffn, n_embd, r.tokens) || !is_f32_rows(r.out, n_embd, r.tokens)) {
        return "shapes: the gate is not one value a token, or a value is not F32 rows of the FFN's width";
    }
    return nullptr;
}

const char * flashrt_moe_tail_run_at(const ggml_cgraph * cgraph, int i, flashrt_moe_tail_run & r) {
    if (const char * miss = moe_tail_collect(cgraph, i, r)) {
        return miss;
    }
    // Only the output may be read after the run, and nothing else in it may be a graph output.
    if (const char * miss = flashrt_run_is_private(cgraph, i, r.end, { r.out })) {
        return miss;
    }
    // Every thread reads the weights and the gate: the output must not overlap them. Column-wise
    // inputs may share its memory only element for element.
    if (flashrt_overlaps(r.out, r.weights) || flashrt_overlaps(r.out, r.gate)) {
        return "memory: the output overlaps the routing weights or the gate";
    }
    bool experts_safe = !flashrt_overlaps(r.out, r.experts);
    for (int k = 0; k < r.n_used && !experts_safe; ++k) {
        experts_safe = (const char *) r.out->data == (const char *) r.experts->data + k * r.experts->nb[1] &&
                       (r.tokens == 1 || r.out->nb[1] == r.experts->nb[2]);
    }
    if (!experts_safe || !flashrt_same_or_disjoint(r.out, r.shexp) || !flashrt_same_or_disjoint(r.out, r.residual)) {
        return "memory: the output overlaps an input other than element for element";
    }
    return nullptr;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_moe_tail(const ggml_cgraph * cgraph, int i) {
    flashrt_moe_tail_run r;
    if (const char * miss = flashrt_moe_tail_run_at(cgraph, i, r)) {
        return flashrt_miss(miss);
    }
    return flashrt_hit(r.end + 1 - i);
}

// The norm that reads the run's output right after it (the next layer's input norm), when the pack
// at that norm takes its input quantized (the norm handoff, gemv-pack.cuh): its node, weight and
// eps; else -1. The tail kernel then also norms and quantizes one token's output
// (frt_moe_tail_args::x_q8).
static int handoff_norm(const ggml_cgraph * cgraph, const flashrt_moe_tail_run & r, const float ** weight,
                        float * eps) {
    const int64_t n_embd = r.out->ne[0];
    if (r.tokens != 1 || n_embd % 128 != 0 || n_embd < 1024 || n_embd > FRT_MOE_TAIL_NORM_MAX_EMBD) {
        return -1;
    }
    for (int j = r.end + 1; j < cgraph->n_nodes && j <= r.end + 4; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (t->op == GGML_OP_RMS_NORM && t->src[0] == r.out) {
            return flashrt_gemv_handoff_wanted(cgraph, j, weight, eps) && (uintptr_t) *weight % 16 == 0 ? j : -1;
        }
    }
    return -1;
}

void flashrt_run_moe_tail_at(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, bool hand_off) {
    flashrt_moe_tail_run r;
    const char * miss = moe_tail_collect(cgraph, i, r);
    GGML_ASSERT(miss == nullptr);
    const size_t      f = sizeof(float);
    frt_moe_tail_args a = {};
    a.n_embd            = (int) r.out->ne[0];
    a.n_used            = r.n_used;
    a.tokens            = r.tokens;
    a.experts           = (const float *) r.experts->data;
    a.experts_token     = r.experts->nb[2] / f;
    a.experts_slot      = r.experts->nb[1] / f;
    a.weights           = (const float *) r.weights->data;
    a.weights_token     = r.weights->nb[2] / f;
    a.shexp             = (const float *) r.shexp->data;
    a.shexp_token       = r.shexp->nb[1] / f;
    a.gate              = (const float *) r.gate->data;
    a.gate_token        = r.gate->nb[1] / f;
    a.residual          = (const float *) r.residual->data;
    a.residual_token    = r.residual->nb[1] / f;
    a.out               = (float *) r.out->data;
    a.out_token         = r.out->nb[1] / f;
    const float * norm_w = nullptr;
    float         eps    = 0.0f;
    const int     norm   = hand_off ? handoff_norm(cgraph, r, &norm_w, &eps) : -1;
    void *        image  = norm >= 0 ? flashrt_counters_of(ctx, flashrt_counter_use::handoff) : nullptr;
    if (image != nullptr) {  // none when no direct evaluation prepared the context's counters
        a.norm_w       = norm_w;
        a.norm_eps     = eps;
        a.x_q8         = image;
        a.norm_scratch = flashrt_counters_of(ctx, flashrt_counter_use::tail_norm);
    }
    FLASHRT_CHECK("MOE_TAIL", frt_moe_tail(a, ctx.stream()));
    if (image != nullptr) {
        flashrt_gemv_hand_off(ctx, cgraph, norm, r.out->data, image);
    }
}

void flashrt_run_moe_tail(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    flashrt_run_moe_tail_at(ctx, cgraph, i, true);
}

void flashrt_prepare_moe_tail(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                              const flashrt_match & m) {
    GGML_UNUSED(cgraph);
    GGML_UNUSED(i);
    GGML_UNUSED(m);
    flashrt_counters_prepare(ctx);  // the norm handoff's image; without it the tail hands nothing off
}
