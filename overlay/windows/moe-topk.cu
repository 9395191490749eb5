#include "moe-topk.cuh"
#include "gemv-pack.cuh"
#include "window-util.cuh"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

// How far after the run the experts' gate is looked for (qwen35moe: the FFN input's RESHAPE and the
// shared expert's matvecs lie in between).
static constexpr int moe_topk_lookahead = 24;

// The node after `prev` when it is `op` reading `prev` as its first source.
static const ggml_tensor * next_reading(const ggml_cgraph * cgraph, int at, ggml_op op, const ggml_tensor * prev) {
    if (at >= cgraph->n_nodes) {
        return nullptr;
    }
    const ggml_tensor * t = cgraph->nodes[at];
    return t->op == op && t->src[0] == prev ? t : nullptr;
}

const char * flashrt_moe_topk_run_at(const ggml_cgraph * cgraph, int i, flashrt_moe_topk_run & r) {
    const ggml_tensor * softmax = cgraph->nodes[i];
    if (softmax->op != GGML_OP_SOFT_MAX) {
        return flashrt_miss_anchor;
    }
    const ggml_tensor * logits = softmax->src[0];
    if (logits->ne[1] != 1 || logits->ne[2] != 1 || logits->ne[3] != 1) {
        return "batch (one token only)";
    }
    if (softmax->src[1] != nullptr || softmax->src[2] != nullptr || flashrt_op_param_f32(softmax, 0) != 1.0f ||
        flashrt_op_param_f32(softmax, 1) != 0.0f) {
        return "a softmax with a mask, sinks, a scale or an ALiBi bias";
    }
    if (logits->type != GGML_TYPE_F32 || !ggml_is_contiguous(logits) || softmax->type != GGML_TYPE_F32) {
        return "logits not contiguous F32";
    }
    r        = flashrt_moe_topk_run();
    r.logits = logits;
    r.n_experts = (int) logits->ne[0];
    if (r.n_experts != 32 && r.n_experts != 64 && r.n_experts != 128 && r.n_experts != 256 && r.n_experts != 512) {
        return "expert count (32, 64, 128, 256 or 512)";
    }
    // SOFT_MAX -> RESHAPE -> ARGSORT -> VIEW -> GET_ROWS, as ggml-cuda's topk-moe fusion wants them.
    const ggml_tensor * probs   = next_reading(cgraph, i + 1, GGML_OP_RESHAPE, softmax);
    const ggml_tensor * argsort = next_reading(cgraph, i + 2, GGML_OP_ARGSORT, softmax);
    const ggml_tensor * ids     = next_reading(cgraph, i + 3, GGML_OP_VIEW, argsort);
    const ggml_tensor * rows    = next_reading(cgraph, i + 4, GGML_OP_GET_ROWS, probs);
    if (probs == nullptr || argsort == nullptr || ids == nullptr || rows == nullptr || rows->src[1] != ids) {
        return "not SOFT_MAX -> RESHAPE -> ARGSORT -> VIEW -> GET_ROWS";
    }
    if (((const int32_t *) argsort->op_params)[0] != GGML_SORT_ORDER_DESC || ids->type != GGML_TYPE_I32 ||
        ids->view_offs != 0 || ids->ne[1] != 1 || ids->nb[1] != (size_t) r.n_experts * sizeof(int32_t)) {
        return "the ids are not the first of a descending argsort's row";
    }
    r.ids    = ids;
    r.n_used = (int) ids->ne[0];
    if (r.n_used < 1 || r.n_used > 32) {
        return "1 to 32 experts a token";
    }
    r.weights = rows;
    r.end     = i + 4;
    // [RESHAPE -> SUM_ROWS -> CLAMP -> DIV -> RESHAPE]: the weights normalised by their sum.
    const ggml_tensor * flat = next_reading(cgraph, i + 5, GGML_OP_RESHAPE, rows);
    const ggml_tensor * sum  = flat ? next_reading(cgraph, i + 6, GGML_OP_SUM_ROWS, flat) : nullptr;
    const ggml_tensor * clamped = sum ? next_reading(cgraph, i + 7, GGML_OP_CLAMP, sum) : nullptr;
    const ggml_tensor * div  = clamped && i + 8 < cgraph->n_nodes ? cgraph->nodes[i + 8] : nullptr;
    const ggml_tensor * back = div ? next_reading(cgraph, i + 9, GGML_OP_RESHAPE, div) : nullptr;
    if (back != nullptr && div->op == GGML_OP_DIV && div->src[0] == flat && div->src[1] == clamped &&
        flashrt_op_param_f32(clamped, 1) == INFINITY) {
        r.norm    = true;
        r.clamp   = flashrt_op_param_f32(clamped, 0);
        r.weights = back;
        r.end     = i + 9;
    }
    // [SCALE]
    if (const ggml_tensor * scaled = next_reading(cgraph, r.end + 1, GGML_OP_SCALE, r.weights)) {
        if (flashrt_op_param_f32(scaled, 1) != 0.0f) {
            return "the weights are scaled with a bias";
        }
        r.scale   = flashrt_op_param_f32(scaled, 0);
        r.weights = scaled;
        r.end += 1;
    }
    if (r.weights->type != GGML_TYPE_F32 || !ggml_is_contiguous(r.weights)) {
        return "weights not contiguous F32";
    }
    return nullptr;
}

// Whether any source of `t` is one of the run's nodes [first, last], or a view into one.
static bool reads_run(const ggml_cgraph * cgraph, const ggml_tensor * t, int first, int last) {
    for (const ggml_tensor * src : t->src) {
        if (src == nullptr) {
            continue;
        }
        for (int u = first; u <= last; ++u) {
            const ggml_tensor * n = cgraph->nodes[u];
            if (src == n || (src->view_src != nullptr && src->view_src == flashrt_view_base(n))) {
                return true;
            }
        }
    }
    return false;
}

// Predicate first; each miss names its reason (GGML_FLASHRT_DEBUG=1 prints them).
flashrt_match flashrt_match_moe_topk(const ggml_cgraph * cgraph, int i) {
    flashrt_moe_topk_run r;
    if (const char * miss = flashrt_moe_topk_run_at(cgraph, i, r)) {
        return flashrt_miss(miss);
    }
    // Nothing is computed at the run: only the ids and the weights may be read after it (as stock's
    // fusion requires), and nothing else in it may be a graph output.
    if (const char * miss = flashrt_run_is_private(cgraph, i, r.end, { r.ids, r.weights })) {
        return flashrt_miss(miss);
    }
    // The experts' gate: the first matvec reading the ids after the run. Until it runs, no node
    // may read the run's values (they are not written yet) or overwrite the logits.
    int j = -1;
    for (int t = r.end + 1; t < cgraph->n_nodes && t <= r.end + moe_topk_lookahead; ++t) {
        const ggml_tensor * n = cgraph->nodes[t];
        if (n->op == GGML_OP_MUL_MAT_ID && n->src[2] == r.ids) {
            j = t;
            break;
        }
        if (!flashrt_is_view(n) && reads_run(cgraph, n, i, r.end)) {  // a view reads nothing itself
            return flashrt_miss("a node before the experts' launch reads the top-k's values");
        }
        if (!flashrt_is_view(n) && n->data != nullptr && flashrt_overlaps(n, r.logits)) {
            return flashrt_miss("memory: the logits are overwritten before the experts' launch");
        }
    }
    if (j < 0) {
        return flashrt_miss("no experts' matvec reads the ids soon after the top-k");
    }
    flashrt_gemv_pack pack;
    if (const char * miss = flashrt_gemv_match_routed(cgraph, i, j, pack)) {
        return flashrt_miss(miss);
    }
    // Every block reads the logits and block 0 writes ids and weights while the launch writes its
    // outputs: all of those apart (the pack's input and weights are apart from its outputs already).
    const ggml_tensor * x = cgraph->nodes[j]->src[1];
    if (flashrt_overlaps(r.ids, r.weights) || flashrt_overlaps(r.ids, r.logits) ||
        flashrt_overlaps(r.weights, r.logits) || flashrt_overlaps(r.ids, x) || flashrt_overlaps(r.weights, x) ||
        flashrt_overlaps(r.logits, x)) {
        return flashrt_miss("memory: ids, weights, logits and the experts' input are not apart");
    }
    for (int p = 0; p < pack.n; ++p) {
        const ggml_tensor * out = cgraph->nodes[pack.nodes[p]];
        if (flashrt_overlaps(out, r.ids) || flashrt_overlaps(out, r.weights) || flashrt_overlaps(out, r.logits)) {
            return flashrt_miss("memory: an output of the experts' launch overlaps ids, weights or logits");
        }
    }
    // The run at i; the pack's first node (j) claimed to run there, the rest of it (ascending)
    // claimed as computed by that launch.
    if (pack.n > FLASHRT_MAX_CLAIMED) {
        return flashrt_miss("the experts' launch takes more nodes than a window may claim");
    }
    std::sort(pack.nodes, pack.nodes + pack.n);
    flashrt_match m = flashrt_hit(r.end + 1 - i);
    for (int p = 0; p < pack.n; ++p) {
        m.claimed_runs_there[m.n_claimed] = pack.nodes[p] == j;
        m.claimed[m.n_claimed++]          = pack.nodes[p];
    }
    return m;
}

void flashrt_run_moe_topk(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m) {
    // Nothing at the run: the experts' launch computes it (flashrt_run_claimed_moe_topk).
    GGML_UNUSED(ctx);
    GGML_UNUSED(cgraph);
    GGML_UNUSED(i);
    GGML_UNUSED(m);
}

void flashrt_run_claimed_moe_topk(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i,
                                  const flashrt_match & m, int node) {
    flashrt_gemv_pack pack;
    for (int k = 0; k < m.n_claimed; ++k) {
        pack.nodes[pack.n++] = m.claimed[k];
    }
    GGML_ASSERT(pack.n > 0 && pack.nodes[0] == node);
    pack.routing = i;
    flashrt_gemv_run_pack(ctx, cgraph, pack, "MOE_TOPK");
}
