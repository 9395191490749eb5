#include "attn-out-gate.cuh"
#include "window-util.cuh"
#include "../counters.cuh"
#include "gemv-pack.cuh"

#include "gate-mul-q8.cuh"

struct out_gate {
    const ggml_tensor * gate = nullptr;  // what the kernel reads: the CONT's input, or the SIGMOID's
    const ggml_tensor * attn = nullptr;  // the MUL's other source
    const ggml_tensor * mul  = nullptr;  // the product
    int64_t             d = 0, heads = 0, gate_head = 0;  // the gate as [d, heads], heads gate_head floats apart
    int                 end = -1;                          // the MUL's node
};

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
static const char * out_gate_miss(const ggml_cgraph * cgraph, int i, out_gate & og) {
    const ggml_tensor * cont = cgraph->nodes[i]->op == GGML_OP_CONT ? cgraph->nodes[i] : nullptr;
    const int           s    = cont != nullptr ? i + 1 : i;  // the SIGMOID's node
    if (s + 1 >= cgraph->n_nodes) {
        return flashrt_miss_anchor;
    }
    const ggml_tensor * sig = cgraph->nodes[s], *mul = cgraph->nodes[s + 1];
    if (sig->op != GGML_OP_UNARY || ggml_get_unary_op(sig) != GGML_UNARY_OP_SIGMOID ||
        (cont != nullptr && sig->src[0] != cont)) {
        return flashrt_miss_anchor;  // not a gate: the common case
    }
    if (mul->op != GGML_OP_MUL || (mul->src[0] != sig && mul->src[1] != sig) || mul->src[0] == mul->src[1]) {
        return "the SIGMOID not followed by the MUL of it and another value";
    }
    const ggml_tensor * attn = mul->src[0] == sig ? mul->src[1] : mul->src[0];
    const ggml_tensor * g    = cont != nullptr ? cont->src[0] : sig->src[0];
    if (g->type != GGML_TYPE_F32 || sig->type != GGML_TYPE_F32 || mul->type != GGML_TYPE_F32 ||
        attn->type != GGML_TYPE_F32) {
        return "types (F32 throughout)";
    }
    if (ggml_nrows(mul) != 1 || !ggml_are_same_shape(mul, attn) || !ggml_are_same_shape(mul, sig) ||
        !ggml_is_contiguous(mul) || !ggml_is_contiguous(attn)) {
        return "not one token's contiguous product of two same-shaped values";
    }
    // The gate as heads of contiguous floats: [d, heads] (the CONT's view), or one row.
    if (g->nb[0] != sizeof(float) || g->nb[1] % sizeof(float) != 0 || g->ne[2] != 1 || g->ne[3] != 1 ||
        g->ne[0] * g->ne[1] != ggml_nelements(mul)) {
        return "the gate not heads of contiguous floats holding the product's elements";
    }
    og.d         = g->ne[0];
    og.heads     = g->ne[1];
    og.gate_head = g->ne[1] > 1 ? (int64_t) (g->nb[1] / sizeof(float)) : og.d;
    frt_gate_mul_q8_args probe = {};
    probe.attn = probe.gate = (const float *) g->data;
    probe.out = (float *) mul->data, probe.d = (int) og.d, probe.heads = (int) og.heads;
    probe.attn_head = og.d, probe.gate_head = og.gate_head;
    if (const char * why = frt_gate_mul_q8_unsupported(probe)) {
        return why;
    }
    // The kernel writes the product while it reads its sources: over the attention element for
    // element at most, never over the gate.
    if (!flashrt_same_or_disjoint(mul, attn) || flashrt_overlaps(mul, g)) {
        return "the MUL's output overlaps the gate, or the attention other than element for element";
    }
    og.gate = g;
    og.attn = attn;
    og.mul  = mul;
    og.end  = s + 1;
    return flashrt_run_is_private(cgraph, i, og.end, { mul });
}

flashrt_match flashrt_match_attn_out_gate(const ggml_cgraph * cgraph, int i) {
    out_gate og;
    if (const char * miss = out_gate_miss(cgraph, i, og)) {
        return flashrt_miss(miss);
    }
    return flashrt_hit(og.end + 1 - i);
}

void flashrt_prepare_attn_out_gate(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                   const flashrt_match & m) {
    GGML_UNUSED(cgraph);
    GGML_UNUSED(i);
    GGML_UNUSED(m);
    flashrt_counters_prepare(ctx);  // the handoff's image; without it the product alone
}

void flashrt_run_attn_out_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    out_gate     og;
    const char * miss = out_gate_miss(cgraph, i, og);
    GGML_ASSERT(miss == nullptr && og.end == i + m.n_nodes - 1);
    frt_gate_mul_q8_args a = {};
    a.attn      = (const float *) og.attn->data;
    a.attn_head = og.d;
    a.gate      = (const float *) og.gate->data;
    a.gate_head = og.gate_head;
    a.out       = (float *) og.mul->data;
    a.d         = (int) og.d;
    a.heads     = (int) og.heads;
    a.x_q8      = flashrt_gemv_handoff_slot(ctx, og.d * og.heads);
    FLASHRT_CHECK("ATTN_OUT_GATE", frt_gate_mul_q8(a, ctx.stream()));
    if (a.x_q8 != nullptr) {
        flashrt_gemv_hand_off(ctx, cgraph, -1, og.mul->data, a.x_q8);
    }
}
