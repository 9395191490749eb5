#include "attn-decode.cuh"

#include "window-util.cuh"
#include "../diagnostics.cuh"
#include "decode-attention.cuh"

#include <cstdio>

static bool aligned16(const ggml_tensor * t) {
    return t->nb[0] == sizeof(ggml_fp16_t) && t->nb[1] % 16 == 0 && t->nb[2] % 16 == 0 && (uintptr_t) t->data % 16 == 0;
}

// Caches of more than FRT_ATTN_DECODE_MAX_KV cells go to the split kernels (decode-attention.cuh)
// unless GGML_FLASHRT_ATTN_DECODE_LONG=0 (stock's flash attention). On the H100, tg128@d8192 +1.7%
// against stock's flash attention and its fix-up, tg128@d1024 (1280 cells) -0.6%, within the
// +-1.2% that two identical configurations differed by in the same bench
// (bench/results/2026-12-07-b92628f-h100-split-decode).
static bool attn_decode_long_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_ATTN_DECODE_LONG", true);
    return enabled;
}

// Experiment: the split kernels also take caches of 513-1024 cells from the one-cluster kernel
// (alone on the H100 10.4 against 19.0 µs at 1024 cells, 10.1 against 12.2 at 512), not yet
// measured in decode (tg128@d512 runs 768 cells).
static bool attn_decode_mid_split_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_ATTN_DECODE_MID_SPLIT", false);
    return enabled;
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
    if (n_kv > FRT_ATTN_DECODE_MAX_KV && !attn_decode_long_enabled()) {
        return "more than 1024 cells (GGML_FLASHRT_ATTN_DECODE_LONG=0)";
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

// The output gate of qwen35's full-attention layers (build_layer_attn), right after attention:
//   FLASH_ATTN_EXT -> RESHAPE [d * heads, tokens] -> [VIEW (the gate's half of the q projection)
//   -> CONT] -> SIGMOID -> MUL(attention, sigmoid)
// The kernel applies it as it writes (frt_attn_decode_args::gate), into the MUL's output, reading
// the CONT's input in place: stock's CONT and fused SIGMOID-MUL kernels are not launched. On unless
// GGML_FLASHRT_ATTN_GATE=0.
static bool attn_gate_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_ATTN_GATE", true);
    return enabled;
}

struct attn_gate {
    const ggml_tensor * gate = nullptr;  // what the kernel reads: the CONT's input, or the SIGMOID's
    int64_t             gate_head = 0, gate_token = 0;  // its strides in floats
    const ggml_tensor * out = nullptr;  // the MUL
    int                 end = -1;       // the MUL's node
};

// No SIGMOID where the gate would be: attention without a gate, never printed.
static const char * const attn_gate_none = "no output gate";

// Strides (floats) of an F32 tensor read as [d, heads, tokens] in its logical element order
// ([d, heads, tokens] or [d * heads, tokens], values of a row contiguous); false if it is neither.
static bool gate_strides(const ggml_tensor * g, int64_t d, int64_t heads, int64_t n_q, int64_t & head,
                         int64_t & token) {
    if (g->type != GGML_TYPE_F32 || g->nb[0] != sizeof(float) || g->nb[1] % sizeof(float) != 0 ||
        g->nb[2] % sizeof(float) != 0 || g->ne[3] != 1) {
        return false;
    }
    if (g->ne[0] == d && g->ne[1] == heads && g->ne[2] == n_q) {
        head  = g->nb[1] / sizeof(float);
        token = g->nb[2] / sizeof(float);
        return true;
    }
    if (g->ne[0] == d * heads && g->ne[1] == n_q && g->ne[2] == 1) {
        head  = d;
        token = g->nb[1] / sizeof(float);
        return true;
    }
    return false;
}

// Whether the MUL's output `out` ([d * heads, tokens], a row's values contiguous) and a
// [d, heads, tokens] tensor at `data` with strides `head` and `token` (floats) put every element at
// the same address.
static bool same_elements(const ggml_tensor * out, const void * data, int64_t head, int64_t token, int64_t d,
                          int64_t heads, int64_t n_q) {
    return out->data == data && (heads == 1 || head == d) &&
           (n_q == 1 || token * (int64_t) sizeof(float) == (int64_t) out->nb[1]);
}

// Why the nodes after attention node i (matched) are not a gate the kernel folds in, or nullptr.
static const char * attn_gate_miss(const ggml_cgraph * cgraph, int i, attn_gate & ag) {
    const ggml_tensor * fa = cgraph->nodes[i];
    const int64_t       d = fa->ne[0], heads = fa->ne[1], n_q = fa->ne[2];
    int                 sig_at = -1;
    for (int j = i + 2; j <= i + 4 && j + 1 < cgraph->n_nodes; ++j) {
        if (cgraph->nodes[j]->op == GGML_OP_UNARY && ggml_get_unary_op(cgraph->nodes[j]) == GGML_UNARY_OP_SIGMOID) {
            sig_at = j;
            break;
        }
    }
    if (sig_at < 0) {
        return attn_gate_none;
    }
    const ggml_tensor * attn = cgraph->nodes[i + 1], *sigmoid = cgraph->nodes[sig_at], *mul = cgraph->nodes[sig_at + 1];
    if (attn->op != GGML_OP_RESHAPE || attn->src[0] != fa || attn->ne[0] != d * heads || attn->ne[1] != n_q) {
        return "gate: attention not followed by its RESHAPE to [d * heads, tokens]";
    }
    if (mul->op != GGML_OP_MUL || !((mul->src[0] == attn && mul->src[1] == sigmoid) ||
                                    (mul->src[0] == sigmoid && mul->src[1] == attn))) {
        return "gate: the SIGMOID not followed by the MUL of attention and it";
    }
    // Between the RESHAPE and the SIGMOID only the gate's own nodes: [its view ->] [a CONT ->]. The
    // kernel reads the CONT's input in place: the copy is not needed.
    ag.gate  = sigmoid->src[0];
    int last = sig_at - 1;  // the last node before the SIGMOID not yet accounted for
    if (last > i + 1 && cgraph->nodes[last] == ag.gate && ag.gate->op == GGML_OP_CONT) {
        ag.gate = ag.gate->src[0];
        --last;
    }
    if (last > i + 1 && cgraph->nodes[last] == ag.gate && flashrt_is_view(ag.gate)) {
        --last;
    }
    if (last != i + 1) {
        return "gate: other nodes between attention and the gate's SIGMOID";
    }
    if (flashrt_view_base(ag.gate) == fa) {
        return "gate: computed from the attention output";
    }
    if (sigmoid->type != GGML_TYPE_F32 || !ggml_are_same_shape(sigmoid, attn) || mul->type != GGML_TYPE_F32 ||
        !ggml_are_same_shape(mul, attn) || mul->nb[0] != sizeof(float) || mul->nb[1] % sizeof(float) != 0 ||
        !gate_strides(ag.gate, d, heads, n_q, ag.gate_head, ag.gate_token)) {
        return "gate: shapes, or a layout the kernel does not read as [d, heads, tokens]";
    }
    ag.out = mul;
    ag.end = sig_at + 1;
    if (const char * miss = flashrt_run_is_private(cgraph, i, ag.end, { mul })) {
        return miss;
    }
    // The kernel writes the MUL's output while it still reads its inputs, and the allocator gives
    // the MUL (in place over the SIGMOID, over the CONT) a block chosen at the CONT, which may be
    // memory the attention read last: Q, or the mask. Q or the gate shared element for element is
    // safe (decode-attention.cuh says why).
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2], *mask = fa->src[3];
    const size_t        f = sizeof(float);
    const bool q_apart =
        !flashrt_overlaps(mul, q) || same_elements(mul, q->data, q->nb[2] / f, q->nb[1] / f, d, heads, n_q);
    const bool gate_apart = !flashrt_overlaps(mul, ag.gate) ||
                            same_elements(mul, ag.gate->data, ag.gate_head, ag.gate_token, d, heads, n_q);
    if (!q_apart || !gate_apart || flashrt_overlaps(mul, k) || flashrt_overlaps(mul, v) ||
        (mask != nullptr && flashrt_overlaps(mul, mask))) {
        return "gate: the MUL's output overlaps the gate or Q other than element for element, or K, V or the mask";
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
    if (!attn_gate_enabled()) {
        return flashrt_hit(1);
    }
    attn_gate ag;
    const char * miss = attn_gate_miss(cgraph, i, ag);
    if (miss == nullptr) {
        return flashrt_hit(ag.end + 1 - i);
    }
    if (miss != attn_gate_none && flashrt_debug_enabled()) {  // still a hit: attention alone
        std::fprintf(stderr, "FlashRT: ATTN_DECODE at node %d (%s): output gate not folded: %s\n", i, fa->name, miss);
    }
    return flashrt_hit(1);
}

void flashrt_run_attn_decode(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
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

    a.split_from = attn_decode_mid_split_enabled() ? FRT_ATTN_DECODE_MAX_KV / 2 + 1 : 0;
    if (m.n_nodes > 1) {  // the gate folded in
        attn_gate ag;
        const char * miss = attn_gate_miss(cgraph, i, ag);
        GGML_ASSERT(miss == nullptr && ag.end == i + m.n_nodes - 1);
        a.gate       = (const float *) ag.gate->data;
        a.gate_head  = ag.gate_head;
        a.gate_token = ag.gate_token;
        a.out        = (float *) ag.out->data;
        a.out_head   = a.d;
        a.out_token  = ag.out->nb[1] / sizeof(float);
        flashrt_global_stats().attn_gates++;
    }
    // A long cache's partials: from the pool, as ggml-cuda's own temporaries (the same address at
    // each capture of the graph).
    const size_t                  scratch_bytes = frt_attn_decode_scratch_bytes(a);
    ggml_cuda_pool_alloc<float>   scratch(ctx.pool());
    if (scratch_bytes > 0) {
        a.scratch = scratch.alloc((scratch_bytes + sizeof(float) - 1) / sizeof(float));
    }
    CUDA_CHECK(frt_attn_decode(a, ctx.stream()));
}
