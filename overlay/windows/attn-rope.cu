#include "attn-rope.cuh"
#include "window-util.cuh"

#include "attn-norm-rope.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// Nodes stock's order puts between q's RoPE and k's norm: v's and k's projections and reshapes
// (4 in qwen35; biases or LoRA add a few).
static constexpr int max_between = 16;

// One of q and k: RMS_NORM -> MUL(weight) -> ROPE.
struct attn_rope_side {
    const ggml_tensor * norm;
    const ggml_tensor * mul;
    const ggml_tensor * rope;
    const ggml_tensor * x;       // the norm's input, [head_dim, heads, tokens]
    const ggml_tensor * weight;  // [head_dim]
};

// The run's nodes, as llama.cpp builds them (qwen35moe's build_layer_attn, then build_attn's KV
// cache writes with flash attention: the V cache not transposed).
struct attn_rope_run {
    attn_rope_side      q, k;
    const ggml_tensor * k_set;  // SET_ROWS of k's RoPE (through a VIEW) into the K cache
    const ggml_tensor * v_set;  // SET_ROWS of v into the V cache
    const ggml_tensor * v;      // v_set's rows, [n_embd_v_gqa, tokens]
    int                 k_at;   // index of k's RMS_NORM: the window runs there
    int                 k_set_at;
    int                 end;    // index of v_set
};

// Whether nodes j, j + 1, j + 2 are RMS_NORM -> MUL of it -> ROPE of that.
static bool norm_mul_rope_at(const ggml_cgraph * cgraph, int j, attn_rope_side & s) {
    if (j + 2 >= cgraph->n_nodes) {
        return false;
    }
    s.norm = cgraph->nodes[j];
    s.mul  = cgraph->nodes[j + 1];
    s.rope = cgraph->nodes[j + 2];
    if (s.norm->op != GGML_OP_RMS_NORM || s.mul->op != GGML_OP_MUL ||
        (s.mul->src[0] != s.norm && s.mul->src[1] != s.norm) || s.rope->op != GGML_OP_ROPE || s.rope->src[0] != s.mul) {
        return false;
    }
    s.x      = s.norm->src[0];
    s.weight = s.mul->src[0] == s.norm ? s.mul->src[1] : s.mul->src[0];
    return true;
}

// What the kernel takes of a side: F32 rows of head_dim (even, under 1024 columns: rms_norm_f32's
// 256-thread reduction) with contiguous columns, one weight row for every head, a forward
// multi-section RoPE without frequency factors.
static const char * check_side(const attn_rope_side & s) {
    for (const ggml_tensor * t : { s.x, s.weight, s.norm, s.mul, s.rope }) {
        if (t->type != GGML_TYPE_F32) {
            return "type: not all F32";
        }
    }
    const int64_t D = s.x->ne[0];
    if (D % 2 != 0 || D > FRT_ATTN_ROPE_MAX_HEAD_DIM) {
        return "shape: head width odd or 1024 and over (rms_norm_f32's 1024-thread path)";
    }
    if (s.x->ne[3] != 1 || !ggml_are_same_shape(s.x, s.norm) || !ggml_are_same_shape(s.x, s.mul) ||
        !ggml_are_same_shape(s.x, s.rope) || s.x->nb[0] != sizeof(float) || s.rope->nb[0] != sizeof(float)) {
        return "shape: not [head_dim, heads, tokens] rows with contiguous columns";
    }
    if (s.weight->ne[0] != D || ggml_nrows(s.weight) != 1 || !ggml_is_contiguous(s.weight)) {
        return "shape: the norm weight is not one contiguous row of the head width";
    }
    const int32_t * op   = (const int32_t *) s.rope->op_params;
    const int       mode = op[2];
    if (mode != GGML_ROPE_TYPE_MROPE && mode != GGML_ROPE_TYPE_IMROPE) {
        return "RoPE: not multi-section (MROPE or IMROPE)";
    }
    if (s.rope->src[2] != nullptr) {
        return "RoPE: frequency factors";
    }
    const ggml_tensor * pos = s.rope->src[1];
    if (pos->type != GGML_TYPE_I32 || pos->ne[0] != 4 * s.x->ne[2] || !ggml_is_contiguous(pos)) {
        return "RoPE: positions are not 4 int32 a token";
    }
    const int n_dims = op[1], n_offs = op[15];
    if (n_dims < 0 || n_offs < 0 || n_offs + n_dims > D || op[11] + op[12] + op[13] + op[14] <= 0) {
        return "RoPE: rotated channels past the head, or no sections";
    }
    return nullptr;
}

static bool is_row_ids(const ggml_tensor * ids, int64_t tokens) {
    return (ids->type == GGML_TYPE_I64 || ids->type == GGML_TYPE_I32) && ids->ne[0] == tokens && ids->ne[1] == 1 &&
           ids->ne[2] == 1 && ids->ne[3] == 1;
}

// A SET_ROWS into an F16 cache of rows of `cols` columns from `tokens` rows of F32.
static bool is_cache_write(const ggml_tensor * set, int64_t cols, int64_t tokens) {
    const ggml_tensor * rows = set->src[0];
    return set->op == GGML_OP_SET_ROWS && set->type == GGML_TYPE_F16 && set->ne[0] == cols &&
           set->nb[0] == sizeof(ggml_fp16_t) && set->ne[2] == 1 && set->ne[3] == 1 && rows->type == GGML_TYPE_F32 &&
           rows->ne[0] == cols && rows->ne[1] == tokens && rows->ne[2] == 1 && rows->ne[3] == 1 &&
           rows->nb[0] == sizeof(float) && is_row_ids(set->src[1], tokens);
}

static const char * attn_rope_collect(const ggml_cgraph * cgraph, int i, attn_rope_run & r) {
    if (!norm_mul_rope_at(cgraph, i, r.q)) {
        return flashrt_miss_anchor;  // not a norm ahead of a RoPE
    }
    const int after = flashrt_skip_views(cgraph, i + 3);
    if (after < cgraph->n_nodes && cgraph->nodes[after]->op == GGML_OP_SET_ROWS &&
        flashrt_view_base(cgraph->nodes[after]->src[0]) == r.q.rope) {
        return flashrt_miss_anchor;  // k's norm, whose run starts at q's
    }
    if (r.q.x->ne[2] > FRT_ATTN_ROPE_MAX_TOKENS) {
        return "batch: more than 8 tokens";
    }
    if (r.q.x->ne[2] > 1 && !flashrt_multi_token_enabled()) {
        return "batch: several tokens (GGML_FLASHRT_MULTI_TOKEN=0)";
    }
    if (const char * miss = check_side(r.q)) {
        return miss;
    }
    // k's norm: the next RMS_NORM, past v's and k's projections when stock's order has them there.
    r.k_at = -1;
    for (int j = i + 3; j < cgraph->n_nodes && j <= i + 3 + max_between; ++j) {
        if (cgraph->nodes[j]->op == GGML_OP_RMS_NORM) {
            r.k_at = j;
            break;
        }
    }
    if (r.k_at < 0 || !norm_mul_rope_at(cgraph, r.k_at, r.k)) {
        return "no RMS_NORM -> MUL -> ROPE (k's) within a few nodes after q's RoPE";
    }
    if (const char * miss = check_side(r.k)) {
        return miss;
    }
    if (r.k.rope->src[1] != r.q.rope->src[1] ||
        std::memcmp(r.k.rope->op_params, r.q.rope->op_params, 16 * sizeof(int32_t)) != 0) {
        return "q's and k's RoPE differ in positions or parameters";
    }
    const int64_t D = r.q.x->ne[0], T = r.q.x->ne[2];
    if (r.k.x->ne[0] != D || r.k.x->ne[2] != T) {
        return "shape: q and k differ in head width or tokens";
    }
    // build_attn's cache writes: k's RoPE through a VIEW of its [head_dim * heads, tokens] rows, then v.
    r.k_set_at = flashrt_skip_views(cgraph, r.k_at + 3);
    if (r.k_set_at >= cgraph->n_nodes) {
        return "graph ends";
    }
    r.k_set                    = cgraph->nodes[r.k_set_at];
    const ggml_tensor * k_view = r.k_set->src[0];
    if (!is_cache_write(r.k_set, D * r.k.x->ne[1], T) || flashrt_view_base(k_view) != r.k.rope || k_view->view_offs != 0 ||
        !ggml_is_contiguous(k_view) || !ggml_is_contiguous(r.k.rope)) {
        return "k's RoPE is not written whole into an F16 cache by a SET_ROWS after it";
    }
    r.end = flashrt_skip_views(cgraph, r.k_set_at + 1);
    if (r.end >= cgraph->n_nodes) {
        return "graph ends";
    }
    r.v_set = cgraph->nodes[r.end];
    if (r.v_set->op != GGML_OP_SET_ROWS || !is_cache_write(r.v_set, r.v_set->ne[0], T)) {
        return "the K cache write is not followed by an F16 V cache write (no flash attention: V transposed?)";
    }
    r.v = r.v_set->src[0];
    for (const ggml_tensor * t : { r.q.norm, r.q.mul, r.q.rope, r.k.norm, r.k.mul, r.k.rope }) {
        if (flashrt_view_base(r.v) == t) {
            return "v is a value of the run";
        }
    }
    return nullptr;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_attn_rope(const ggml_cgraph * cgraph, int i) {
    attn_rope_run r;
    if (const char * miss = attn_rope_collect(cgraph, i, r)) {
        return flashrt_miss(miss);
    }
    for (const ggml_tensor * t : { r.q.norm, r.q.mul, r.q.rope, r.k.norm, r.k.mul, r.k.rope, r.k_set, r.v_set }) {
        if ((t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return flashrt_miss("a node of the run is not to be computed");
        }
    }
    // q's norm and MUL, and every node of the tail but the cache writes (k's norm, MUL, RoPE, the
    // views of the rows), are read only inside the run (q's three nodes and the tail) and are no
    // graph outputs: the kernel never writes them. q's RoPE is the run's output.
    thread_local std::vector<const ggml_tensor *> read_in_run, read_in_tail;
    flashrt_collect_run_reads(cgraph, i, i + 2, read_in_run);
    flashrt_collect_run_reads(cgraph, r.k_at, r.end, read_in_tail);
    read_in_run.insert(read_in_run.end(), read_in_tail.begin(), read_in_tail.end());
    std::sort(read_in_run.begin(), read_in_run.end());
    const auto intermediate = [&](int u) {
        return (cgraph->nodes[u]->flags & GGML_TENSOR_FLAG_OUTPUT) == 0 && flashrt_read_only_in_run(cgraph, u, read_in_run);
    };
    bool kept = !intermediate(i) || !intermediate(i + 1);
    for (int u = r.k_at; u < r.end && !kept; ++u) {
        kept = u != r.k_set_at && !intermediate(u);
    }
    if (kept) {
        return flashrt_miss("an intermediate value is read outside the run");
    }
    // Memory: every block reads its row of q or k whole before writing, so q's output may lie over
    // q element for element; nothing written may touch another input, and the caches nothing else.
    const ggml_tensor * pos      = r.q.rope->src[1];
    const ggml_tensor * inputs[] = { r.q.x, r.q.weight, r.k.x, r.k.weight, r.v, pos, r.k_set->src[1], r.v_set->src[1] };
    if (!flashrt_same_or_disjoint(r.q.rope, r.q.x)) {
        return flashrt_miss("memory: q's output overlaps q other than element for element");
    }
    for (const ggml_tensor * in : inputs) {
        if ((in != r.q.x && flashrt_overlaps(r.q.rope, in)) || flashrt_overlaps(r.k_set, in) ||
            flashrt_overlaps(r.v_set, in)) {
            return flashrt_miss("memory: an output overlaps an input");
        }
    }
    if (flashrt_overlaps(r.k_set, r.v_set) || flashrt_overlaps(r.q.rope, r.k_set) || flashrt_overlaps(r.q.rope, r.v_set)) {
        return flashrt_miss("memory: the outputs overlap");
    }
    // The nodes between q's RoPE and k's norm run on stock kernels before the window: they must not
    // read q's values (not computed yet) nor write what q's part reads or writes.
    for (int u = i + 3; u < r.k_at; ++u) {
        const ggml_tensor * t = cgraph->nodes[u];
        if (flashrt_is_view(t)) {
            continue;
        }
        for (const ggml_tensor * src : t->src) {
            const ggml_tensor * base = src != nullptr ? flashrt_view_base(src) : nullptr;
            if (base != nullptr && (base == r.q.norm || base == r.q.mul || base == r.q.rope)) {
                return flashrt_miss("a node between q's RoPE and k's norm reads q's values");
            }
        }
        if (flashrt_overlaps(t, r.q.x) || flashrt_overlaps(t, r.q.weight) || flashrt_overlaps(t, pos) ||
            flashrt_overlaps(t, r.q.rope)) {
            return flashrt_miss("memory: a node between q's RoPE and k's norm writes what q's part reads or writes");
        }
    }
    return flashrt_hit_deferred(3, r.k_at, r.end + 1 - r.k_at);
}

void flashrt_run_attn_rope(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    GGML_UNUSED(m);
    attn_rope_run r;
    const char * miss = attn_rope_collect(cgraph, i, r);
    GGML_ASSERT(miss == nullptr);
    const size_t f = sizeof(float), h = sizeof(ggml_fp16_t);
    const auto   rows_of = [](const ggml_tensor * ids) {
        return frt_attn_rope_rows{ ids->data, (int64_t) (ids->nb[0] / ggml_type_size(ids->type)),
                                   ids->type == GGML_TYPE_I32 };
    };
    frt_attn_rope_args a = {};
    a.head_dim           = (int) r.q.x->ne[0];
    a.n_head_q           = (int) r.q.x->ne[1];
    a.n_head_kv          = (int) r.k.x->ne[1];
    a.tokens             = (int) r.q.x->ne[2];
    a.q                  = (const float *) r.q.x->data;
    a.q_head             = r.q.x->nb[1] / f;
    a.q_token            = r.q.x->nb[2] / f;
    a.q_weight           = (const float *) r.q.weight->data;
    memcpy(&a.q_eps, r.q.norm->op_params, sizeof(float));
    a.q_out       = (float *) r.q.rope->data;
    a.q_out_head  = r.q.rope->nb[1] / f;
    a.q_out_token = r.q.rope->nb[2] / f;
    a.k           = (const float *) r.k.x->data;
    a.k_head      = r.k.x->nb[1] / f;
    a.k_token     = r.k.x->nb[2] / f;
    a.k_weight    = (const float *) r.k.weight->data;
    memcpy(&a.k_eps, r.k.norm->op_params, sizeof(float));
    a.weights_constant = flashrt_is_constant_leaf(r.q.weight) && flashrt_is_constant_leaf(r.k.weight);
    a.k_cache     = (__half *) r.k_set->data;
    a.k_cache_row = r.k_set->nb[1] / h;
    a.k_rows      = rows_of(r.k_set->src[1]);
    a.v           = (const float *) r.v->data;
    a.v_token     = r.v->nb[1] / f;
    a.v_cols      = (int) r.v->ne[0];
    a.v_cache     = (__half *) r.v_set->data;
    a.v_cache_row = r.v_set->nb[1] / h;
    a.v_rows      = rows_of(r.v_set->src[1]);

    // RoPE's parameters as ggml-cuda's rope reads them; theta_scale and the YaRN correction dims
    // computed on the host with the same calls.
    const int32_t * op = (const int32_t *) r.q.rope->op_params;
    float           freq_base, beta_fast, beta_slow;
    memcpy(&freq_base, op + 5, sizeof(float));
    memcpy(&a.freq_scale, op + 6, sizeof(float));
    memcpy(&a.ext_factor, op + 7, sizeof(float));
    memcpy(&a.attn_factor, op + 8, sizeof(float));
    memcpy(&beta_fast, op + 9, sizeof(float));
    memcpy(&beta_slow, op + 10, sizeof(float));
    memcpy(a.sections, op + 11, 4 * sizeof(int32_t));
    a.pos         = (const int32_t *) r.q.rope->src[1]->data;
    a.n_dims      = op[1];
    a.n_offs      = op[15];
    a.imrope      = op[2] == GGML_ROPE_TYPE_IMROPE;
    a.theta_scale = powf(freq_base, -2.0f / a.n_dims);
    ggml_rope_yarn_corr_dims(a.n_dims, op[4], freq_base, beta_fast, beta_slow, a.corr_dims);
    FLASHRT_CHECK("ATTN_ROPE", frt_attn_rope(a, ctx.stream()));
}
