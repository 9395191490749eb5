#include "gdn-gated-norm.cuh"
#include "window-util.cuh"

#include "gated-rms-norm.cuh"

#include <cstring>

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

    const int k = flashrt_skip_views(cgraph, i + 2);
    if (k + 1 >= cgraph->n_nodes) {
        return flashrt_miss("graph ends before SILU, MUL");
    }
    const ggml_tensor * silu = cgraph->nodes[k];
    if (silu->op != GGML_OP_UNARY || ggml_get_unary_op(silu) != GGML_UNARY_OP_SILU) {
        return flashrt_miss("no SILU after the norm (not a gated norm)");
    }
    const ggml_tensor * out = cgraph->nodes[k + 1];
    const bool combines = out->op == GGML_OP_MUL && ((out->src[0] == norm_mul && out->src[1] == silu) ||
                                                     (out->src[0] == silu && out->src[1] == norm_mul));
    if (!combines) {
        return flashrt_miss("the last MUL does not combine the norm and the SILU");
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
    for (int node : { i, i + 1, k }) {
        if (!ggml_node_has_n_uses(cgraph, node, 1)) {
            return flashrt_miss("an intermediate result is used outside the window");
        }
    }
    for (int node = i; node <= k + 1; ++node) {
        const ggml_tensor * t = cgraph->nodes[node];
        if (!flashrt_is_view(t) && (t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return flashrt_miss("a node of the window is not to be computed");
        }
    }
    if (!flashrt_same_or_disjoint(out, x) || !flashrt_same_or_disjoint(out, z) || flashrt_overlaps(out, weight)) {
        return flashrt_miss("memory: the output partly overlaps an input");
    }
    return flashrt_hit(k + 2 - i);
}

void flashrt_run_gdn_gated_norm(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    const ggml_tensor * norm = cgraph->nodes[i];
    const ggml_tensor * norm_mul = cgraph->nodes[i + 1];
    const ggml_tensor * silu = cgraph->nodes[i + m.n_nodes - 2];
    ggml_tensor * out = cgraph->nodes[i + m.n_nodes - 1];
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
    FLASHRT_CHECK("GDN_GATED_NORM", frt_gated_rms_norm_f32(args, ctx.stream()));
}
