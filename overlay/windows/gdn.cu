#include "gdn.cuh"
#include "window-util.cuh"
#include "../counters.cuh"
#include "../diagnostics.cuh"
#include "gemv-pack.cuh"
#include "q8-x.cuh"

#include "gdn-decode.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

// The block spans ~60 nodes, most of them views.
static constexpr int max_block_nodes = 120;

// The nodes of one block, as qwen35moe builds it (n_rs_seq == 0, fused gated_delta_net).
struct gdn_block {
    const ggml_tensor * conv_rows;  // the anchor: GET_ROWS of the conv cache
    const ggml_tensor * concat;
    const ggml_tensor * conv_cpy;
    const ggml_tensor * state_rows;
    const ggml_tensor * conv;
    const ggml_tensor * conv_silu;
    const ggml_tensor * q_norm;
    const ggml_tensor * q_scale;
    const ggml_tensor * k_norm;
    const ggml_tensor * k_scale;
    const ggml_tensor * alpha_add;
    const ggml_tensor * softplus;
    const ggml_tensor * gate;
    const ggml_tensor * beta_sigmoid;
    const ggml_tensor * gdn;
    const ggml_tensor * state_cpy;
    const ggml_tensor * out_norm;
    const ggml_tensor * out_norm_mul;
    const ggml_tensor * z_silu;
    const ggml_tensor * out;
    int                 end;  // index of out

    // What the kernels read.
    const ggml_tensor * qkv;
    const ggml_tensor * alpha;
    const ggml_tensor * beta;
    const ggml_tensor * z;
    const ggml_tensor * conv_w;
    const ggml_tensor * norm_w;
    int                 k_heads, v_heads, n_seqs, dst_row;

    static constexpr int n_nodes = 20;
    std::array<const ggml_tensor *, n_nodes> nodes() const {
        return { conv_rows, concat,  conv_cpy, state_rows, conv,  conv_silu,    q_norm,      q_scale, k_norm, k_scale,
                 alpha_add, softplus, gate,     beta_sigmoid, gdn, state_cpy, out_norm, out_norm_mul, z_silu, out };
    }
};

static const ggml_tensor * strip_reshapes(const ggml_tensor * t) {
    while (t != nullptr && t->op == GGML_OP_RESHAPE) {
        t = t->src[0];
    }
    return t;
}

static bool is_unary(const ggml_tensor * t, ggml_unary_op op) {
    return t != nullptr && t->op == GGML_OP_UNARY && ggml_get_unary_op(t) == op;
}

static bool is_one_row(const ggml_tensor * t, int64_t n) {
    return t->ne[0] == n && ggml_nelements(t) == n && ggml_is_contiguous(t);
}

// The row of a cache that view `dst` starts at, or -1 when it is not a whole-row view of it.
static int64_t cache_row(const ggml_tensor * dst, const ggml_tensor * cache, int64_t row_floats, int64_t n_seqs) {
    const size_t    row_bytes = cache->nb[1];
    const ptrdiff_t offset    = (const char *) dst->data - (const char *) cache->data;
    if (dst->ne[0] != row_floats || dst->ne[1] != n_seqs || dst->nb[0] != sizeof(float) ||
        (n_seqs > 1 && dst->nb[1] != row_bytes) || offset < 0 || offset % row_bytes != 0) {
        return -1;
    }
    const int64_t row = offset / (ptrdiff_t) row_bytes;
    return row + n_seqs <= cache->ne[1] ? row : -1;
}

// The block's structure from its anchor (node i) up to the gated norm's MUL; nullptr on success.
// Cheap (the block's own nodes): run calls it again to find its tensors.
static const char * gdn_collect(const ggml_cgraph * cgraph, int i, gdn_block & b) {
    const ggml_tensor * anchor = cgraph->nodes[i];
    if (anchor->op != GGML_OP_GET_ROWS || anchor->src[0]->op != GGML_OP_RESHAPE) {
        return flashrt_miss_anchor;
    }
    const int limit = std::min(cgraph->n_nodes, i + max_block_nodes);
    int       gi    = -1;
    for (int j = i + 1; j < limit && gi < 0; ++j) {
        gi = cgraph->nodes[j]->op == GGML_OP_GATED_DELTA_NET ? j : -1;
    }
    if (gi < 0) {
        return flashrt_miss_anchor;
    }
    const ggml_tensor * g = cgraph->nodes[gi];
    b.gdn = g;

    // From the delta net back to the anchor: the conv input must start from it.
    b.q_scale = g->src[0];
    b.k_scale = g->src[1];
    b.q_norm  = b.q_scale->src[0];
    b.k_norm  = b.k_scale->src[0];
    const ggml_tensor * v = g->src[2];
    if (b.q_scale->op != GGML_OP_SCALE || b.k_scale->op != GGML_OP_SCALE || b.q_norm->op != GGML_OP_RMS_NORM ||
        b.k_norm->op != GGML_OP_RMS_NORM) {
        return "q or k is not SCALE(RMS_NORM(.)) (the L2 norm of qwen35)";
    }
    const ggml_tensor * q_view = b.q_norm->src[0];
    const ggml_tensor * k_view = b.k_norm->src[0];
    b.conv_silu                = q_view->src[0];
    if (q_view->op != GGML_OP_VIEW || k_view->op != GGML_OP_VIEW || v->op != GGML_OP_VIEW ||
        k_view->src[0] != b.conv_silu || v->src[0] != b.conv_silu || !is_unary(b.conv_silu, GGML_UNARY_OP_SILU)) {
        return "q, k and v are not views of one SILU";
    }
    b.conv = b.conv_silu->src[0];
    if (b.conv->op != GGML_OP_SSM_CONV) {
        return "the SILU is not of an SSM_CONV";
    }
    b.concat = b.conv->src[0];
    if (b.concat->op != GGML_OP_CONCAT || ggml_get_op_params_i32(b.concat, 0) != 0 ||
        b.concat->src[0]->op != GGML_OP_RESHAPE || b.concat->src[0]->src[0] != anchor) {
        return flashrt_miss_anchor;  // a GET_ROWS, but not of this block's conv states
    }
    if (b.concat->src[1]->op != GGML_OP_TRANSPOSE) {
        return "the conv input's new column is not a TRANSPOSE of the projection";
    }
    b.conv_rows = anchor;
    b.qkv       = b.concat->src[1]->src[0];

    b.gate = strip_reshapes(g->src[3]);
    if (b.gate->op != GGML_OP_MUL || !is_unary(b.gate->src[0], GGML_UNARY_OP_SOFTPLUS) ||
        b.gate->src[0]->src[0]->op != GGML_OP_ADD) {
        return "the gate is not MUL(SOFTPLUS(ADD(alpha, dt)), a)";
    }
    b.softplus  = b.gate->src[0];
    b.alpha_add = b.softplus->src[0];
    b.alpha     = b.alpha_add->src[0];
    b.beta_sigmoid = g->src[4];
    if (!is_unary(b.beta_sigmoid, GGML_UNARY_OP_SIGMOID)) {
        return "beta is not a SIGMOID";
    }
    b.beta       = b.beta_sigmoid->src[0];
    b.state_rows = strip_reshapes(g->src[5]);
    if (b.state_rows->op != GGML_OP_GET_ROWS || b.state_rows->src[0]->op != GGML_OP_RESHAPE ||
        b.state_rows->src[1]->data != anchor->src[1]->data) {
        return "the state is not a GET_ROWS of its cache with the conv states' ids";
    }
    if (ggml_get_op_params_i32(g, 0) != 1) {
        return "GATED_DELTA_NET keeps state snapshots (K > 1)";
    }

    // Shapes: head size 128, one token per sequence, at most 8 sequences, conv kernel 4.
    const int64_t S = FRT_GDN_HEAD_DIM;
    b.k_heads       = (int) b.q_scale->ne[1];
    b.v_heads       = (int) v->ne[1];
    b.n_seqs        = (int) v->ne[3];
    if (v->ne[0] != S || b.q_scale->ne[0] != S || b.k_scale->ne[1] != b.k_heads || b.v_heads % b.k_heads != 0) {
        return "shape: heads are not 128 wide, or value heads are not a multiple of key heads";
    }
    if (v->ne[2] != 1 || b.q_scale->ne[2] != 1 || b.q_scale->ne[3] != b.n_seqs) {
        return "shape: more than one token per sequence (prefill)";
    }
    if (b.n_seqs > FRT_GDN_MAX_SEQS) {
        return "shape: more than 8 sequences";
    }
    if (b.n_seqs > 1 && !flashrt_multi_token_enabled()) {
        return "batch: several sequences (GGML_FLASHRT_MULTI_TOKEN=0)";
    }
    if (g->src[3]->ne[0] != 1) {
        return "shape: a gate per column (KDA), not per head";
    }
    const int64_t C = (2 * b.k_heads + b.v_heads) * S;
    const ggml_tensor * conv_w = b.conv_w = b.conv->src[1];
    if (b.concat->ne[0] != 4 || b.concat->ne[1] != C || b.concat->ne[2] != b.n_seqs || conv_w->ne[0] != 4 ||
        conv_w->ne[1] != C || !ggml_is_contiguous(conv_w) || anchor->ne[0] != 3 * C) {
        return "shape: the conv is not 4 taps over q, k and v's channels";
    }
    const size_t f = sizeof(float);
    if (q_view->view_offs != 0 || k_view->view_offs != b.k_heads * S * f || v->view_offs != 2 * b.k_heads * S * f ||
        q_view->nb[1] != S * f || k_view->nb[1] != S * f || v->nb[1] != S * f || !ggml_is_contiguous(b.conv_silu)) {
        return "layout: q, k and v are not the conv output's consecutive head blocks";
    }
    if (b.qkv->ne[0] != C || b.qkv->ne[1] != 1 || b.qkv->ne[2] != b.n_seqs || b.qkv->nb[0] != f) {
        return "layout: the projection is not [channels, 1, sequences]";
    }
    if (b.alpha->ne[0] != b.v_heads || b.alpha->ne[1] != 1 || b.alpha->ne[2] != b.n_seqs || b.alpha->ne[3] != 1 ||
        b.alpha->nb[0] != f ||
        !ggml_are_same_shape(b.alpha, b.alpha_add) || !is_one_row(b.alpha_add->src[1], b.v_heads) ||
        !is_one_row(b.gate->src[1], b.v_heads) || !ggml_are_same_shape(b.gate, b.alpha_add)) {
        return "layout: alpha, dt or a are not one value a head";
    }
    if (b.beta->ne[0] != 1 || b.beta->ne[1] != b.v_heads || b.beta->ne[2] != 1 || b.beta->ne[3] != b.n_seqs ||
        b.beta->nb[1] != f) {
        return "layout: beta is not [1, heads, 1, sequences]";
    }
    if (anchor->src[1]->type != GGML_TYPE_I32 || anchor->src[1]->ne[0] != b.n_seqs || anchor->src[1]->nb[0] != 4 ||
        anchor->ne[1] != b.n_seqs ||
        b.state_rows->ne[0] != S * S * b.v_heads || b.state_rows->ne[1] != b.n_seqs) {
        return "shape: the cache rows are not one a sequence";
    }

    // After the delta net: the copies into the caches and the gated norm.
    b.conv_cpy = b.state_cpy = b.out_norm = b.out_norm_mul = b.z_silu = b.out = nullptr;
    b.end = -1;
    for (int j = i + 1; j < limit && b.end < 0; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (t->op == GGML_OP_CPY && t->src[0]->view_src == b.concat) {
            b.conv_cpy = t;
        } else if (t->op == GGML_OP_CPY && t->src[0]->view_src == g) {
            b.state_cpy = t;
        } else if (t->op == GGML_OP_RMS_NORM && t->src[0]->view_src == g) {
            b.out_norm = t;
        } else if (t->op == GGML_OP_MUL && b.out_norm != nullptr && (t->src[0] == b.out_norm || t->src[1] == b.out_norm)) {
            b.out_norm_mul = t;
        } else if (t->op == GGML_OP_MUL && b.out_norm_mul != nullptr &&
                   (t->src[0] == b.out_norm_mul || t->src[1] == b.out_norm_mul)) {
            b.out    = t;
            b.z_silu = t->src[0] == b.out_norm_mul ? t->src[1] : t->src[0];
            b.end    = j;
        }
    }
    if (b.conv_cpy == nullptr || b.state_cpy == nullptr || b.out == nullptr || !is_unary(b.z_silu, GGML_UNARY_OP_SILU)) {
        return "the block does not end in its cache copies and the gated norm (RMS_NORM, MUL, SILU(z), MUL)";
    }
    b.z = b.z_silu->src[0];

    // The copies: the conv window's last 3 columns and the new state, into the rows of the
    // sequences (the same rows in both caches).
    const ggml_tensor * conv_last = b.conv_cpy->src[0];
    const ggml_tensor * new_state = b.state_cpy->src[0];
    const ggml_tensor * attn      = b.out_norm->src[0];
    if (conv_last->op != GGML_OP_VIEW || conv_last->view_offs != f || conv_last->ne[0] != 3 || conv_last->ne[1] != C ||
        conv_last->ne[2] != b.n_seqs) {
        return "layout: the conv cache copy is not the window's last 3 columns";
    }
    if (new_state->view_offs != S * b.v_heads * b.n_seqs * f || !ggml_is_contiguous(new_state) ||
        ggml_nelements(new_state) != S * S * b.v_heads * b.n_seqs || attn->view_offs != 0 || attn->ne[0] != S ||
        attn->ne[1] != b.v_heads || attn->ne[3] != b.n_seqs) {
        return "layout: the delta net's output or state views are not the fused op's";
    }
    const ggml_tensor * conv_cache = anchor->src[0];
    const ggml_tensor * ssm_cache  = b.state_rows->src[0];
    const int64_t conv_row = cache_row(b.conv_cpy->src[1], conv_cache, 3 * C, b.n_seqs);
    const int64_t ssm_row  = cache_row(b.state_cpy->src[1], ssm_cache, S * S * b.v_heads, b.n_seqs);
    if (conv_row < 0 || conv_row != ssm_row || conv_cache->nb[0] != f || ssm_cache->nb[0] != f ||
        conv_cache->nb[1] % f != 0 || ssm_cache->nb[1] % f != 0) {
        return "layout: the cache copies are not whole rows of the caches the states came from, at one row";
    }
    b.dst_row = (int) conv_row;

    const ggml_tensor * norm_w = b.norm_w =
        b.out_norm_mul->src[0] == b.out_norm ? b.out_norm_mul->src[1] : b.out_norm_mul->src[0];
    if (!is_one_row(norm_w, S) || !ggml_are_same_shape(b.z, attn) || !ggml_are_same_shape(b.out, attn) ||
        b.z->nb[0] != f || b.out->nb[0] != f || b.z->ne[2] != 1 || b.out->ne[2] != 1) {
        return "layout: the gated norm is not over 128-wide heads with one weight row";
    }
    for (const ggml_tensor * t : { b.q_scale, b.k_scale }) {
        if (ggml_get_op_params_f32(t, 1) != 0.0f) {
            return "the L2 norm's SCALE has a bias";
        }
    }
    if (ggml_get_op_params_f32(b.q_norm, 0) != ggml_get_op_params_f32(b.k_norm, 0) ||
        ggml_get_op_params_f32(b.q_scale, 0) != ggml_get_op_params_f32(b.k_scale, 0)) {
        return "q and k are normalised differently";
    }
    for (const ggml_tensor * t : b.nodes()) {
        if (t->type != GGML_TYPE_F32) {
            return "type: not all F32";
        }
    }
    for (const ggml_tensor * t : std::initializer_list<const ggml_tensor *>{
             b.qkv, b.alpha, b.beta, b.z, conv_w, norm_w, conv_cache, ssm_cache, b.alpha_add->src[1], b.gate->src[1] }) {
        if (t->type != GGML_TYPE_F32) {
            return "type: not all F32";
        }
    }
    return nullptr;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_gdn(const ggml_cgraph * cgraph, int i) {
    gdn_block b;
    if (const char * miss = gdn_collect(cgraph, i, b)) {
        return flashrt_miss(miss);
    }
    const auto block    = b.nodes();
    const auto in_block = [&](const ggml_tensor * t) { return std::find(block.begin(), block.end(), t) != block.end(); };
    // The run [i, end] holds the block's nodes and views, nothing else (an input projection
    // computed in between would not be computed at all).
    int found = 0;
    for (int j = i; j <= b.end; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (in_block(t)) {
            ++found;
            if ((t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
                return flashrt_miss("a node of the window is not to be computed");
            }
        } else if (!flashrt_is_view(t)) {
            return flashrt_miss("a node inside the block is not part of it (INPROJ's graph order not applied?)");
        }
    }
    if (found != gdn_block::n_nodes) {
        return flashrt_miss("a node of the block lies outside its run");
    }
    // Only the output (and the caches, written in place) may be read after the block: every other
    // value of the run, and every view of one, has all its uses (ggml's use counts) inside the run.
    // Counted over the run's ~60 nodes, not the rest of the graph: at several sequences the
    // predicates run at every step (no CUDA graphs).
    thread_local std::vector<const ggml_tensor *> read_in_run;
    flashrt_collect_run_reads(cgraph, i, b.end, read_in_run);
    for (int j = i; j <= b.end; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        const bool intermediate = in_block(t) || (t->view_src != nullptr && in_block(t->view_src));
        if (!intermediate || t == b.out || t == b.conv_cpy || t == b.state_cpy) {
            continue;  // views of the caches, weights and inputs
        }
        if (t->flags & GGML_TENSOR_FLAG_OUTPUT) {
            return flashrt_miss("an intermediate result is a graph output");
        }
        if (!flashrt_read_only_in_run(cgraph, j, read_in_run)) {
            return flashrt_miss("an intermediate result is read after the block");
        }
    }
    // The output is written last (recur), after everything but z is read.
    const ggml_tensor * conv_cache = b.conv_rows->src[0];
    const ggml_tensor * ssm_cache  = b.state_rows->src[0];
    if (!flashrt_same_or_disjoint(b.out, b.z) || flashrt_overlaps(b.out, conv_cache) ||
        flashrt_overlaps(b.out, ssm_cache)) {
        return flashrt_miss("memory: the output overlaps z partly or a cache");
    }
    return flashrt_hit(b.end + 1 - i);
}

// The one-launch path's flags, through which the value heads sharing a key head get its q and k
// (frt_gdn_decode_args::flags): per context, zeroed once outside capture, zero after each launch
// (overlay/counters). On by default (measured with ROUTER and MOE_TAIL, registry.cu);
// GGML_FLASHRT_GDN_ONE_LAUNCH=0 keeps two launches.
static bool gdn_one_launch_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_GDN_ONE_LAUNCH", true);
    return enabled;
}

// GDN's handoff (gemv-pack.cuh): at one sequence the kernel also writes its output quantized for
// ssm_out's launch. On unless GGML_FLASHRT_GDN_HANDOFF=0.
static bool gdn_handoff_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_GDN_HANDOFF", true);
    return enabled;
}

void flashrt_prepare_gdn(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(cgraph);
    GGML_UNUSED(i);
    GGML_UNUSED(m);
    if (gdn_one_launch_enabled() || gdn_handoff_enabled()) {
        flashrt_counters_prepare(ctx);  // without them the two launches, and no handoff
    }
}

void flashrt_run_gdn(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    gdn_block b;
    const char * miss = gdn_collect(cgraph, i, b);
    GGML_ASSERT(miss == nullptr);
    const size_t f = sizeof(float);

    frt_gdn_decode_args a = {};
    a.n_seqs    = b.n_seqs;
    a.k_heads   = b.k_heads;
    a.v_heads   = b.v_heads;
    a.qkv       = (const float *) b.qkv->data;
    a.qkv_seq   = b.qkv->nb[2] / f;
    a.z         = (const float *) b.z->data;
    a.z_head    = b.z->nb[1] / f;
    a.z_seq     = b.z->nb[3] / f;
    a.alpha     = (const float *) b.alpha->data;
    a.alpha_seq = b.alpha->nb[2] / f;
    a.beta      = (const float *) b.beta->data;
    a.beta_seq  = b.beta->nb[3] / f;

    const ggml_tensor * conv_w = b.conv_w;
    const ggml_tensor * norm_w = b.norm_w;
    a.conv_w  = (const float *) conv_w->data;
    a.dt_bias = (const float *) b.alpha_add->src[1]->data;
    a.a       = (const float *) b.gate->src[1]->data;
    a.norm_w  = (const float *) norm_w->data;
    a.weights_constant = flashrt_is_constant_leaf(conv_w) && flashrt_is_constant_leaf(norm_w);

    const ggml_tensor * conv_cache = b.conv_rows->src[0];
    const ggml_tensor * ssm_cache  = b.state_rows->src[0];
    a.ids        = (const int32_t *) b.conv_rows->src[1]->data;
    a.conv_state = (float *) conv_cache->data;
    a.conv_row   = conv_cache->nb[1] / f;
    a.ssm_state  = (float *) ssm_cache->data;
    a.ssm_row    = ssm_cache->nb[1] / f;
    a.dst_row    = b.dst_row;

    a.out      = (float *) b.out->data;
    a.out_head = b.out->nb[1] / f;
    a.out_seq  = b.out->nb[3] / f;

    a.l2_eps     = ggml_get_op_params_f32(b.q_norm, 0);
    a.l2_scale   = ggml_get_op_params_f32(b.q_scale, 0);
    a.norm_eps   = ggml_get_op_params_f32(b.out_norm, 0);
    a.attn_scale = 1.0f / sqrtf((float) FRT_GDN_HEAD_DIM);  // gated_delta_net's

    ggml_cuda_pool_alloc<char> scratch(ctx.pool(), frt_gdn_decode_scratch_bytes(b.n_seqs, b.k_heads, b.v_heads));
    a.scratch = scratch.get();
    a.flags   = b.n_seqs == 1 && b.k_heads <= flashrt_counters_size(flashrt_counter_use::gdn_flags) && gdn_one_launch_enabled()
                    ? (int *) flashrt_counters_of(ctx, flashrt_counter_use::gdn_flags)
                    : nullptr;
    const int k = b.v_heads * FRT_GDN_HEAD_DIM;
    if (gdn_handoff_enabled() && b.n_seqs == 1 && a.out_head == FRT_GDN_HEAD_DIM) {
        a.x_q8 = flashrt_gemv_handoff_slot(ctx, k);
    }
    FLASHRT_CHECK("GDN", frt_gdn_decode(a, ctx.stream()));
    if (a.x_q8 != nullptr) {
        flashrt_gemv_hand_off(ctx, cgraph, -1, b.out->data, a.x_q8);
    }
}
