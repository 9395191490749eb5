#include "gdn-gated-norm.cuh"
#include "window-util.cuh"

#include "gated-rms-norm.cuh"

#include <cstring>

// Nodes the graph may place between the norm and its gate (qwen35moe computes z there).
static constexpr int max_between = 8;

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_gdn_gated_norm(const ggml_cgraph * cgraph, int i) {
    const ggml_tensor * norm = cgraph->nodes[i];
    if (norm->op != GGML_OP_RMS_NORM) {
        return flashrt_miss(flashrt_miss_anchor);
    }
    if (i + 1 >= cgraph->n_nodes) {
        return flashrt_miss("graph ends after RMS_NORM");
    }
    const ggml_tensor * norm_mul = cgraph->nodes[i + 1];
    if (norm_mul->op != GGML_OP_MUL || (norm_mul->src[0] != norm && norm_mul->src[1] != norm)) {
        return flashrt_miss("RMS_NORM is not followed by a MUL of it");
    }
    const ggml_tensor * weight = norm_mul->src[0] == norm ? norm_mul->src[1] : norm_mul->src[0];

    // The gate: out = MUL(norm_mul, SILU(z)), a few nodes on.
    int out_idx = -1;
    for (int j = i + 2; j < cgraph->n_nodes && j <= i + 2 + max_between; ++j) {
        if (cgraph->nodes[j]->src[0] == norm_mul || cgraph->nodes[j]->src[1] == norm_mul) {
            out_idx = j;
            break;
        }
    }
    if (out_idx < 0) {
        return flashrt_miss("the normed value is not used within a few nodes (not a gated norm)");
    }
    const ggml_tensor * out = cgraph->nodes[out_idx];
    const ggml_tensor * silu = out->src[0] == norm_mul ? out->src[1] : out->src[0];
    if (out->op != GGML_OP_MUL || silu == nullptr || silu->op != GGML_OP_UNARY ||
        ggml_get_unary_op(silu) != GGML_UNARY_OP_SILU) {
        return flashrt_miss("the normed value is not multiplied by a SILU (not a gated norm)");
    }
    int silu_idx = -1;
    for (int j = out_idx - 1; j > i + 1; --j) {
        if (cgraph->nodes[j] == silu) {
            silu_idx = j;
            break;
        }
        if (!flashrt_is_view(cgraph->nodes[j])) {
            break;
        }
    }
    if (silu_idx < 0) {
        return flashrt_miss("the SILU does not come right before the gating MUL");
    }

    const ggml_tensor * x = norm->src[0];
    const ggml_tensor * z = silu->src[0];
    for (const ggml_tensor * t : { x, weight, z, norm, norm_mul, silu, out }) {
        if (t->type != GGML_TYPE_F32) {
            return flashrt_miss("type: not all F32");
        }
    }
    if (!ggml_are_same_shape(x, z) || !ggml_are_same_shape(x, out) || !ggml_are_same_shape(x, norm_mul)) {
        return flashrt_miss("shape: x, z and the output differ");
    }
    if (weight->ne[0] != x->ne[0] || ggml_nrows(weight) != 1 || !ggml_is_contiguous(weight)) {
        return flashrt_miss("shape: the norm weight is not one contiguous row of x's width");
    }
    if (x->nb[0] != sizeof(float) || z->nb[0] != sizeof(float) || out->nb[0] != sizeof(float)) {
        return flashrt_miss("stride: rows are not contiguous");
    }
    if (x->ne[2] > 65535 || x->ne[3] > 65535) {
        return flashrt_miss("shape: more channels or samples than a grid holds");
    }
    for (int node : { i, i + 1, silu_idx }) {
        if (!ggml_node_has_n_uses(cgraph, node, 1)) {
            return flashrt_miss("an intermediate result is used outside the window");
        }
    }
    for (int node : { i, i + 1, silu_idx, out_idx }) {
        if ((cgraph->nodes[node]->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return flashrt_miss("a node of the window is not to be computed");
        }
    }
    if (!flashrt_same_or_disjoint(out, x) || !flashrt_same_or_disjoint(out, z) || flashrt_overlaps(out, weight)) {
        return flashrt_miss("memory: the output partly overlaps an input");
    }

    // Only views between the norm and the gate: one contiguous window.
    bool only_views = true;
    for (int j = i + 2; j < silu_idx; ++j) {
        only_views = only_views && flashrt_is_view(cgraph->nodes[j]);
    }
    if (only_views) {
        return flashrt_hit(out_idx + 1 - i);
    }
    // Otherwise the norm waits for the gate. The nodes in between cannot read the norm (its
    // results have one use each, inside the window) but the allocator may hand x's memory to them
    // once the RMS_NORM is done: then the window cannot wait.
    for (int j = i + 2; j < silu_idx; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (!flashrt_is_view(t) && (flashrt_overlaps(t, x) || flashrt_overlaps(t, weight))) {
            return flashrt_miss("memory: a node between the norm and its gate reuses x's buffer");
        }
    }
    return flashrt_hit_deferred(2, silu_idx, out_idx + 1 - silu_idx);
}

void flashrt_run_gdn_gated_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    const ggml_tensor * norm = cgraph->nodes[i];
    const ggml_tensor * norm_mul = cgraph->nodes[i + 1];
    const int last = m.deferred() ? m.run_at + m.tail - 1 : i + m.n_nodes - 1;
    ggml_tensor * out = cgraph->nodes[last];
    const ggml_tensor * silu = out->src[0] == norm_mul ? out->src[1] : out->src[0];
    const ggml_tensor * x = norm->src[0];
    const ggml_tensor * weight = norm_mul->src[0] == norm ? norm_mul->src[1] : norm_mul->src[0];
    const ggml_tensor * z = silu->src[0];

    frt_gated_rms_norm_args args;
    args.x = (const float *) x->data;
    args.w = (const float *) weight->data;
    args.z = (const float *) z->data;
    args.out = (float *) out->data;
    args.ncols = (int) x->ne[0];
    args.nrows = (int) x->ne[1];
    args.nchannels = (int) x->ne[2];
    args.nsamples = (int) x->ne[3];
    const size_t f = sizeof(float);
    args.x_row = x->nb[1] / f, args.x_channel = x->nb[2] / f, args.x_sample = x->nb[3] / f;
    args.z_row = z->nb[1] / f, args.z_channel = z->nb[2] / f, args.z_sample = z->nb[3] / f;
    args.out_row = out->nb[1] / f, args.out_channel = out->nb[2] / f, args.out_sample = out->nb[3] / f;
    memcpy(&args.eps, norm->op_params, sizeof(float));
    args.w_constant = flashrt_is_constant_leaf(weight);
    FLASHRT_CHECK("GDN_GATED_NORM", frt_gated_rms_norm_f32(args, ctx.stream()));
}
