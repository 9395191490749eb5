// Window predicates on a machine without a GPU: builds small graphs the way the FlashRT cases and
// llama.cpp build them (each tensor in memory of its own, as test-backend-ops allocates), asks the
// overlay's predicates at every node and checks which hit. Predicates are host code over the graph;
// this catches a predicate that would never fire (or fire where it must not) before a device run.
// bench/tools/predicate-check.sh builds and runs it (it links the overlay's objects from
// `cargo xtask build --overlay-only` and ggml-base from `cargo xtask build --cpu`).

#include "attn-rope.cuh"
#include "matvec.cuh"
#include "moe-tail.cuh"
#include "moe-topk.cuh"
#include "router.cuh"

#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

struct expectation {
    std::string name;
    std::function<std::vector<ggml_tensor *>(ggml_context *)> build;  // expanded in this order
    flashrt_match (*match)(const ggml_cgraph *, int);
    int hits;     // nodes where the predicate must hit
    int claimed;  // nodes the first hit must claim
};

static int check(const expectation & e) {
    ggml_init_params params = { 256u << 20, nullptr, false };
    ggml_context *   ctx    = ggml_init(params);
    ggml_cgraph *    gf     = ggml_new_graph_custom(ctx, 4096, false);
    for (ggml_tensor * t : e.build(ctx)) {
        ggml_build_forward_expand(gf, t);
    }
    int hits = 0, claimed = -1;
    for (int i = 0; i < gf->n_nodes; ++i) {
        const flashrt_match m = e.match(gf, i);
        if (m.hit()) {
            claimed = hits == 0 ? m.n_claimed : claimed;
            ++hits;
        } else if (m.miss != flashrt_miss_anchor) {
            std::printf("     node %d (%s %s): %s\n", i, ggml_op_desc(gf->nodes[i]), gf->nodes[i]->name, m.miss);
        }
    }
    ggml_free(ctx);
    const bool ok = hits == e.hits && (hits == 0 || claimed == e.claimed);
    std::printf("%s %-58s hits %d (want %d), claimed %d (want %d)\n", ok ? "ok  " : "FAIL", e.name.c_str(), hits, e.hits,
                claimed, e.claimed);
    return ok ? 0 : 1;
}

static ggml_tensor * f32(ggml_context * ctx, int64_t a, int64_t b = 1, int64_t c = 1) {
    return ggml_new_tensor_3d(ctx, GGML_TYPE_F32, a, b, c);
}

// build_moe_ffn's weighted sum and qwen35moe's shared expert and residual, as MOE_TAIL takes them;
// the inputs computed first, as in a layer.
static std::vector<ggml_tensor *> moe_tail(ggml_context * ctx, int n_used, bool sum_read_again) {
    const int64_t n_embd   = 2048;
    ggml_tensor * residual = ggml_scale(ctx, f32(ctx, n_embd), 1.0f);
    ggml_tensor * shexp    = ggml_scale(ctx, f32(ctx, n_embd), 0.5f);
    ggml_tensor * gate     = ggml_scale(ctx, f32(ctx, 1), 3.0f);
    ggml_tensor * experts  = ggml_scale(ctx, f32(ctx, n_embd, n_used), 1.0f);
    ggml_tensor * weighted = ggml_mul(ctx, experts, f32(ctx, 1, n_used));
    std::vector<ggml_tensor *> order = { residual, shexp, gate, experts, weighted };
    ggml_tensor * moe_out = nullptr;
    for (int k = 0; k < n_used; ++k) {
        order.push_back(ggml_view_2d(ctx, weighted, n_embd, 1, weighted->nb[2], k * weighted->nb[1]));
    }
    for (int k = 0; k < n_used; ++k) {
        moe_out = moe_out ? ggml_add(ctx, moe_out, order[5 + k]) : order[5 + k];
        order.push_back(moe_out);
    }
    ggml_tensor * out = ggml_add(ctx, ggml_add(ctx, moe_out, ggml_mul(ctx, shexp, ggml_sigmoid(ctx, gate))), residual);
    order.push_back(sum_read_again ? ggml_concat(ctx, out, ggml_scale(ctx, moe_out, 0.5f), 0) : out);
    return order;
}

// An MoE FFN's input norm and the readers of the normed value, as ROUTER takes them.
static std::vector<ggml_tensor *> router(ggml_context * ctx, int64_t tokens) {
    const int64_t k        = 2048;
    ggml_tensor * normed   = ggml_mul(ctx, ggml_rms_norm(ctx, ggml_scale(ctx, f32(ctx, k, tokens), 1.5f), 1e-6f), f32(ctx, k));
    ggml_tensor * w_router = f32(ctx, k, 256);
    ggml_set_name(w_router, "blk.0.ffn_gate_inp.weight");
    ggml_tensor * w_gate = f32(ctx, k, 1);
    ggml_set_name(w_gate, "blk.0.ffn_gate_inp_shexp.weight");
    ggml_tensor * out = ggml_concat(ctx, ggml_scale(ctx, ggml_mul_mat(ctx, w_router, normed), 0.5f),
                                    ggml_scale(ctx, ggml_mul_mat(ctx, w_gate, normed), 0.5f), 0);
    ggml_tensor * ids    = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, 4, tokens);
    ggml_tensor * w_exps = ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_K, k, 64, 8);
    ggml_set_name(w_exps, "blk.0.ffn_gate_exps.weight");
    ggml_tensor * gate = ggml_mul_mat_id(ctx, w_exps, ggml_reshape_3d(ctx, normed, k, 1, tokens), ids);
    return { ggml_concat(ctx, out, ggml_reshape_2d(ctx, gate, 64 * 4, tokens), 0) };
}

// A matvec and its residual ADD, directly or through a RESHAPE (ssm_out), as MATVEC takes them;
// a computed residual comes before the matvec, as in a layer.
static std::vector<ggml_tensor *> residual_add(ggml_context * ctx, bool reshaped, bool computed_residual) {
    const int64_t k = 4096, rows = 2048;
    ggml_tensor * residual = f32(ctx, rows);
    if (computed_residual) {
        residual = ggml_scale(ctx, residual, 0.5f);
    }
    ggml_tensor * x  = ggml_scale(ctx, reshaped ? f32(ctx, k, 1, 1) : f32(ctx, k), 0.5f);
    ggml_tensor * mm = ggml_mul_mat(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_K, k, rows), x);
    if (reshaped) {
        mm = ggml_reshape_2d(ctx, mm, rows, 1);
    }
    return { residual, x, ggml_add(ctx, mm, residual) };
}

// build_moe_ffn's softmax top-k (the weights expanded first, as llama.cpp does), the routed
// experts' gate/up reading the ids and the shared expert's gate/up, with their SwiGLUs, as
// MOE_TOPK and SHEXP_FOLD take them.
static std::vector<ggml_tensor *> moe_topk(ggml_context * ctx, int64_t tokens, bool probs_read_again) {
    const int64_t k = 2048, rows = 256, n_experts = 64, n_used = 8;  // fewer experts than qwen36: memory
    ggml_tensor * x        = ggml_scale(ctx, f32(ctx, k, tokens), 0.5f);
    ggml_tensor * logits   = ggml_scale(ctx, f32(ctx, n_experts, tokens), 1.0f);
    ggml_tensor * probs    = ggml_soft_max(ctx, logits);
    ggml_tensor * selected = ggml_argsort_top_k(ctx, probs, n_used);
    ggml_tensor * weights  = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, n_experts, tokens), selected);
    weights                = ggml_reshape_2d(ctx, weights, n_used, tokens);
    ggml_tensor * sum      = ggml_clamp(ctx, ggml_sum_rows(ctx, weights), 6.103515625e-5f, INFINITY);
    weights                = ggml_reshape_3d(ctx, ggml_div(ctx, weights, sum), 1, n_used, tokens);
    ggml_tensor * x3       = ggml_reshape_3d(ctx, x, k, 1, tokens);
    const auto    experts  = [&] { return ggml_new_tensor_3d(ctx, GGML_TYPE_Q4_K, k, rows, n_experts); };
    const auto    dense    = [&] { return ggml_new_tensor_2d(ctx, GGML_TYPE_Q4_K, k, rows); };
    ggml_tensor * act  = ggml_swiglu_split(ctx, ggml_mul_mat_id(ctx, experts(), x3, selected),
                                           ggml_mul_mat_id(ctx, experts(), x3, selected));
    ggml_tensor * sact = ggml_swiglu_split(ctx, ggml_mul_mat(ctx, dense(), x), ggml_mul_mat(ctx, dense(), x));
    std::vector<ggml_tensor *> out = { x, logits, weights, act, sact };
    if (probs_read_again) {
        out.push_back(ggml_scale(ctx, probs, 2.0f));
    }
    return out;
}

// qwen35's attention span as ATTN_ROPE takes it: q's and k's RMS_NORM -> MUL -> ROPE (IMROPE), the
// K and V cache writes; the projections before the span (ATTNQKV's order at one token) or v's and
// k's in between (stock's order); q's RoPE read after it.
static std::vector<ggml_tensor *> attn_rope(ggml_context * ctx, int64_t tokens, bool kv_between, bool k_rope_read_again) {
    const int64_t D = 256, Hq = 16, Hkv = 2, T = tokens;
    ggml_tensor * q_full = ggml_scale(ctx, f32(ctx, 2 * D * Hq, T), 0.5f);
    ggml_tensor * k_cur  = ggml_scale(ctx, f32(ctx, D * Hkv, T), 0.5f);
    ggml_tensor * v_cur  = ggml_scale(ctx, f32(ctx, D * Hkv, T), 0.5f);
    ggml_tensor * pos    = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 4 * T);
    int sections[4]      = { 11, 11, 10, 0 };
    const auto norm_rope = [&](ggml_tensor * x) {
        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-6f), f32(ctx, D));
        return ggml_rope_multi(ctx, x, pos, nullptr, 64, sections, GGML_ROPE_TYPE_IMROPE, 262144, 1e7f, 1.0f, 0.0f,
                               1.0f, 32.0f, 1.0f);
    };
    ggml_tensor * q = norm_rope(ggml_view_3d(ctx, q_full, D, Hq, T, 2 * D * 4, 2 * D * Hq * 4, 0));
    ggml_tensor * v = ggml_reshape_3d(ctx, v_cur, D, Hkv, T);
    ggml_tensor * k = norm_rope(ggml_reshape_3d(ctx, k_cur, D, Hkv, T));
    ggml_tensor * ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, T);
    ggml_tensor * k_set = ggml_set_rows(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D * Hkv, 64, 1),
                                        ggml_view_2d(ctx, k, D * Hkv, T, k->nb[2], 0), ids);
    ggml_tensor * v_set = ggml_set_rows(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_F16, D * Hkv, 64, 1),
                                        ggml_view_2d(ctx, v, D * Hkv, T, v->nb[2], 0), ids);
    std::vector<ggml_tensor *> order = { q_full };
    if (!kv_between) {
        order.insert(order.end(), { v_cur, k_cur });
    }
    order.insert(order.end(), { q, v, k, k_set, v_set, ggml_scale(ctx, q, 2.0f) });
    if (k_rope_read_again) {
        order.push_back(ggml_scale(ctx, k, 2.0f));
    }
    return order;
}

// The routed experts' down projection (one input a slot) and the shared expert's right after, as
// MOE_TAIL's graph order puts them: MATVEC's launch takes both.
static std::vector<ggml_tensor *> down_pair(ggml_context * ctx, int64_t tokens) {
    const int64_t k = 512, n_embd = 2048, n_experts = 32, n_used = 8;
    ggml_tensor * act  = ggml_scale(ctx, f32(ctx, k, n_used, tokens), 0.5f);
    ggml_tensor * sact = ggml_scale(ctx, f32(ctx, k, tokens), 0.5f);
    ggml_tensor * ids  = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_used, tokens);
    ggml_tensor * down = ggml_mul_mat_id(ctx, ggml_new_tensor_3d(ctx, GGML_TYPE_Q6_K, k, n_embd, n_experts), act, ids);
    return { act, sact, down, ggml_mul_mat(ctx, ggml_new_tensor_2d(ctx, GGML_TYPE_Q6_K, k, n_embd), sact) };
}

// The LM head as llama.cpp builds it: the final norm's value kept (result_norm), the head's matvec
// right after. `weight`: the head's weight name (another name: an ordinary dense matvec).
static std::vector<ggml_tensor *> lm_head(ggml_context * ctx, int64_t tokens, const char * weight) {
    ggml_tensor * x      = ggml_scale(ctx, f32(ctx, 2048, tokens), 1.5f);
    ggml_tensor * normed = ggml_mul(ctx, ggml_rms_norm(ctx, x, 1e-6f), f32(ctx, 2048));
    ggml_set_name(normed, "result_norm");
    ggml_set_output(normed);
    ggml_tensor * w = ggml_new_tensor_2d(ctx, GGML_TYPE_Q6_K, 2048, 1024);
    ggml_set_name(w, weight);
    ggml_tensor * out = ggml_mul_mat(ctx, w, normed);
    ggml_set_name(out, "result_output");
    return { x, normed, out };
}

int main() {
    // GGML_FLASHRT_HEAD_BATCH=1 (read once by the overlay): the LM head at 2-8 tokens too;
    // predicate-check.sh runs this twice, without and with it.
    const char * head_batch_env = std::getenv("GGML_FLASHRT_HEAD_BATCH");
    const bool   head_batch     = head_batch_env != nullptr && std::string(head_batch_env) == "1";
    std::printf("GGML_FLASHRT_HEAD_BATCH=%d\n", head_batch ? 1 : 0);
    const std::vector<expectation> expected = {
        { "MATVEC: the LM head, 1 token", [](ggml_context * c) { return lm_head(c, 1, "output.weight"); },
          flashrt_match_matvec, 1, 0 },
        { head_batch ? "MATVEC: the LM head, 3 tokens (HEAD_BATCH)" : "MATVEC: the LM head, 3 tokens (refuse)",
          [](ggml_context * c) { return lm_head(c, 3, "output.weight"); }, flashrt_match_matvec, head_batch ? 1 : 0,
          0 },
        { "MATVEC: another dense matvec, 3 tokens (refuse)",
          [](ggml_context * c) { return lm_head(c, 3, "blk.0.attn_output.weight"); }, flashrt_match_matvec, 0, 0 },
        { "MATVEC: the LM head, 9 tokens (refuse)", [](ggml_context * c) { return lm_head(c, 9, "output.weight"); },
          flashrt_match_matvec, 0, 0 },
        { "MOE_TAIL: 8 slots", [](ggml_context * c) { return moe_tail(c, 8, false); }, flashrt_match_moe_tail, 1, 0 },
        { "MOE_TAIL: the weighted sum read again (reject)", [](ggml_context * c) { return moe_tail(c, 8, true); },
          flashrt_match_moe_tail, 0, 0 },
        { "ROUTER: 1 token (router + gate vector)", [](ggml_context * c) { return router(c, 1); }, flashrt_match_router, 1, 2 },
        { "ROUTER: 2 tokens (reject)", [](ggml_context * c) { return router(c, 2); }, flashrt_match_router, 0, 0 },
        { "MOE_TOPK: 8 of 64 (gate/up + shared, SwiGLUs)", [](ggml_context * c) { return moe_topk(c, 1, false); },
          flashrt_match_moe_topk, 1, 6 },
        { "MOE_TOPK: 2 tokens (reject)", [](ggml_context * c) { return moe_topk(c, 2, false); }, flashrt_match_moe_topk,
          0, 0 },
        { "MOE_TOPK: the probabilities read again (reject)", [](ggml_context * c) { return moe_topk(c, 1, true); },
          flashrt_match_moe_topk, 0, 0 },
        { "MATVEC: the experts' down + the shared expert's (own input)", [](ggml_context * c) { return down_pair(c, 1); },
          flashrt_match_matvec, 2, 1 },
        { "MATVEC: residual ADD", [](ggml_context * c) { return residual_add(c, false, false); }, flashrt_match_matvec, 1, 1 },
        { "MATVEC: residual ADD through a RESHAPE", [](ggml_context * c) { return residual_add(c, true, true); },
          flashrt_match_matvec, 1, 1 },
        { "MATVEC: a leaf through a RESHAPE is not a residual", [](ggml_context * c) { return residual_add(c, true, false); },
          flashrt_match_matvec, 1, 0 },
        { "ATTN_ROPE: 1 token, projections before", [](ggml_context * c) { return attn_rope(c, 1, false, false); },
          flashrt_match_attn_rope, 1, 0 },
        { "ATTN_ROPE: 3 tokens, projections in between", [](ggml_context * c) { return attn_rope(c, 3, true, false); },
          flashrt_match_attn_rope, 1, 0 },
        { "ATTN_ROPE: 9 tokens (refuse)", [](ggml_context * c) { return attn_rope(c, 9, true, false); },
          flashrt_match_attn_rope, 0, 0 },
        { "ATTN_ROPE: k's RoPE read again (reject)", [](ggml_context * c) { return attn_rope(c, 1, false, true); },
          flashrt_match_attn_rope, 0, 0 },
    };
    int failed = 0;
    for (const expectation & e : expected) {
        failed += check(e);
    }
    std::printf("%d passed, %d failed\n", (int) expected.size() - failed, failed);
    return failed == 0 ? 0 : 1;
}
