#include "shexp-gate.cuh"
#include "window-util.cuh"

#include "gated-residual.cuh"
#include "../repack.cuh"

// The other operand of a binary node, given one of them (nullptr if `known` is neither).
static const ggml_tensor * other_src(const ggml_tensor * node, const ggml_tensor * known) {
    if (node->src[0] == known) {
        return node->src[1];
    }
    if (node->src[1] == known) {
        return node->src[0];
    }
    return nullptr;
}

// A [n, tokens] F32 activation with contiguous columns, as the window reads it.
static bool is_plain_activation(const ggml_tensor * t, int64_t n, int64_t tokens) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == n && t->ne[1] == tokens && t->ne[2] == 1 && t->ne[3] == 1 &&
           t->nb[0] == sizeof(float);
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_shexp_gate(const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * dot = cgraph->nodes[i];
    if (dot->op != GGML_OP_MUL_MAT) {
        return flashrt_miss(flashrt_miss_anchor);
    }
    const ggml_tensor * w = dot->src[0];
    const ggml_tensor * x = dot->src[1];
    if (ggml_nrows(w) != 1) {
        return flashrt_miss(flashrt_miss_anchor);  // an ordinary matmul, not a gate: not a candidate
    }
    if (!flashrt_repack_supported(w, flashrt_layout::f32)) {
        return flashrt_miss("gate weight: not a contiguous F32, F16 or BF16 vector");
    }
    const int64_t n = w->ne[0], tokens = x->ne[1];
    if (!is_plain_activation(x, n, tokens) || dot->ne[0] != 1) {
        return flashrt_miss("shape: the input is not [n, tokens] F32 with contiguous columns");
    }
    if (i + 3 >= cgraph->n_nodes) {
        return flashrt_miss("graph ends before SIGMOID, MUL, ADD");
    }
    const ggml_tensor * sig = cgraph->nodes[i + 1];
    if (sig->op != GGML_OP_UNARY || ggml_get_unary_op(sig) != GGML_UNARY_OP_SIGMOID || sig->src[0] != dot) {
        return flashrt_miss("the gate is not followed by its SIGMOID");
    }
    const ggml_tensor * gated = cgraph->nodes[i + 2];
    const ggml_tensor * shexp = gated->op == GGML_OP_MUL ? other_src(gated, sig) : nullptr;
    if (shexp == nullptr || !is_plain_activation(shexp, n, tokens)) {
        return flashrt_miss("the SIGMOID does not scale an [n, tokens] F32 value");
    }
    const ggml_tensor * sum = cgraph->nodes[i + 3];
    const ggml_tensor * moe = sum->op == GGML_OP_ADD ? other_src(sum, gated) : nullptr;
    if (moe == nullptr || !is_plain_activation(moe, n, tokens)) {
        return flashrt_miss("the gated value is not added to an [n, tokens] F32 value");
    }
    for (int node = i; node <= i + 2; ++node) {
        if (!ggml_node_has_n_uses(cgraph, node, 1)) {
            return flashrt_miss("an intermediate result is used outside the window");
        }
    }
    // The residual add that usually follows joins the window when nothing else reads the sum.
    const ggml_tensor * residual = nullptr;
    if (i + 4 < cgraph->n_nodes && ggml_node_has_n_uses(cgraph, i + 3, 1)) {
        const ggml_tensor * next = cgraph->nodes[i + 4];
        const ggml_tensor * r = next->op == GGML_OP_ADD ? other_src(next, sum) : nullptr;
        if (r != nullptr && r != sum && is_plain_activation(r, n, tokens) && is_plain_activation(next, n, tokens)) {
            residual = r;
        }
    }
    const int n_nodes = residual ? 5 : 4;
    const ggml_tensor * out = cgraph->nodes[i + n_nodes - 1];
    if (!is_plain_activation(out, n, tokens)) {
        return flashrt_miss("shape: the output is not [n, tokens] F32");
    }
    for (int node = i; node < i + n_nodes; ++node) {
        if ((cgraph->nodes[node]->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return flashrt_miss("a node of the window is not to be computed");
        }
    }
    for (const ggml_tensor * in : { x, shexp, moe, residual }) {
        if (in != nullptr && !flashrt_same_or_disjoint(out, in)) {
            return flashrt_miss("memory: the output partly overlaps an input");
        }
    }
    if (flashrt_overlaps(out, w)) {
        return flashrt_miss("memory: the output overlaps the gate weight");
    }
    return flashrt_hit(n_nodes);
}

void flashrt_run_shexp_gate(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    const ggml_tensor * dot = cgraph->nodes[i];
    const ggml_tensor * sig = cgraph->nodes[i + 1];
    const ggml_tensor * gated = cgraph->nodes[i + 2];
    const ggml_tensor * sum = cgraph->nodes[i + 3];
    ggml_tensor * out = cgraph->nodes[i + m.n_nodes - 1];
    const ggml_tensor * shexp = other_src(gated, sig);
    const ggml_tensor * moe = other_src(sum, gated);
    const ggml_tensor * residual = m.n_nodes == 5 ? other_src(out, sum) : nullptr;

    const size_t f = sizeof(float);
    frt_gated_residual_args args;
    // F16/BF16 gates (unquantized checkpoints) are read as F32: cached once, or converted per use.
    const flashrt_repacked w(ctx, dot->src[0], flashrt_layout::f32, "SHEXP_GATE");
    args.w = w.f32();
    args.x = (const float *) dot->src[1]->data;
    args.s = (const float *) shexp->data;
    args.a = (const float *) moe->data;
    args.r = residual ? (const float *) residual->data : nullptr;
    args.out = (float *) out->data;
    args.n = (int) dot->src[0]->ne[0];
    args.n_tokens = (int) dot->src[1]->ne[1];
    args.x_token = dot->src[1]->nb[1] / f;
    args.s_token = shexp->nb[1] / f;
    args.a_token = moe->nb[1] / f;
    args.r_token = residual ? residual->nb[1] / f : 0;
    args.out_token = out->nb[1] / f;
    FLASHRT_CHECK("SHEXP_GATE", frt_gated_residual_f32(args, ctx.stream()));
}

void flashrt_prepare_shexp_gate(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i,
                                const flashrt_match & m) {
    GGML_UNUSED(m);
    flashrt_repack_prepare(ctx, cgraph->nodes[i]->src[0], flashrt_layout::f32);
}
