#include "gemv-pack.cuh"
#include "moe-tail.cuh"
#include "moe-topk.cuh"

#include "../counters.cuh"
#include "../diagnostics.cuh"
#include "../repack.cuh"
#include "q8-x.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

// How far after a value its readers are searched. A qwen35moe Gated DeltaNet layer reads its normed
// input ~45 nodes after the norm; the bound keeps the predicates linear in the graph.
static constexpr int flashrt_gemv_lookahead = 160;

static frt_gemv_type gemv_type_of(ggml_type type) {
    switch (type) {
        case GGML_TYPE_F32:  return FRT_GEMV_F32;
        case GGML_TYPE_F16:  return FRT_GEMV_F16;
        case GGML_TYPE_BF16: return FRT_GEMV_BF16;
        case GGML_TYPE_Q4_K: return FRT_GEMV_Q4_K;
        case GGML_TYPE_Q5_K: return FRT_GEMV_Q5_K;
        case GGML_TYPE_Q6_K: return FRT_GEMV_Q6_K;
        case GGML_TYPE_Q8_0: return FRT_GEMV_Q8_0;
        default:             return FRT_GEMV_TYPE_COUNT;
    }
}

// One launch multiplies one of these "direct" types; Q6_K and Q8_0 join any launch (gemv.cuh).
static bool is_direct_type(ggml_type type) {
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16 || type == GGML_TYPE_Q4_K ||
           type == GGML_TYPE_Q5_K;
}

// Whether `w` can join a launch whose direct type so far is *direct (GGML_TYPE_COUNT: none yet);
// takes its type as the launch's when it is the first direct one.
static bool joins_launch(const ggml_tensor * w, ggml_type * direct) {
    if (!is_direct_type(w->type)) {
        return true;
    }
    if (*direct == GGML_TYPE_COUNT) {
        *direct = w->type;
    }
    return *direct == w->type;
}

static bool is_expert_matvec(const ggml_tensor * t) {
    return t->op == GGML_OP_MUL_MAT_ID;
}

// The input vectors of a segment node (MUL_MAT: src[1]; MUL_MAT_ID: src[1] too, ids in src[2]).
static const ggml_tensor * segment_input(const ggml_tensor * node) {
    return node->src[1];
}


// One token's input vector seen two ways: the experts' [k, 1, 1] view and the dense [k, 1] tensor.
// Equal data pointers alone do not make the same vector: ggml-alloc lends a dead tensor's memory to
// a later one (the next layer's normed input lands where this layer's was), so both must also view
// the same tensor.
static bool same_vector(const ggml_tensor * a, const ggml_tensor * b) {
    return a == b || (flashrt_view_base(a) == flashrt_view_base(b) && a->data == b->data && a->type == GGML_TYPE_F32 &&
                      b->type == GGML_TYPE_F32 &&
                      a->ne[0] == b->ne[0] && ggml_nelements(a) == a->ne[0] && ggml_nelements(b) == b->ne[0] &&
                      ggml_is_contiguous(a) && ggml_is_contiguous(b));
}

// A SWIGLU of two tensors, gate then up (ggml_swiglu_split): what ggml-cuda's mmvq fuses with the
// gate/up matvec pair that feeds it, and what an FRT_GEMV_SWIGLU segment computes.
static bool is_split_swiglu(const ggml_tensor * t) {
    return t->op == GGML_OP_GLU && ggml_get_glu_op(t) == GGML_GLU_OP_SWIGLU && t->src[0] != nullptr &&
           t->src[1] != nullptr && ((const int32_t *) t->op_params)[1] == 0;
}

// Whether t is one of the pack's nodes.
static bool is_pack_node(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const ggml_tensor * t) {
    for (int q = 0; q < pack.n; ++q) {
        if (cgraph->nodes[pack.nodes[q]] == t) {
            return true;
        }
    }
    return false;
}

// The matvec an ADD's source shows: the source itself, or the matvec under a RESHAPE (a Gated
// DeltaNet layer's output projection is [n_embd, 1, 1], reshaped to [n_embd, 1] for its residual).
static const ggml_tensor * seen_matvec(const ggml_tensor * src) {
    return src != nullptr && src->op == GGML_OP_RESHAPE ? src->src[0] : src;
}

// Whether node t is a RESHAPE of one of the pack's matvecs: a view, never computed.
static bool is_pack_reshape(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const ggml_tensor * t) {
    return t->op == GGML_OP_RESHAPE && is_pack_node(cgraph, pack, t->src[0]);
}

// Which source of a pack's residual ADD is its matvec (0 or 1); the other is the residual.
static int add_matvec_src(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const ggml_tensor * add) {
    return is_pack_node(cgraph, pack, seen_matvec(add->src[0])) ? 0 : 1;
}

// Whether pack node p (a matvec) is computed by another pack node's segment: the gate or the up of
// one of the pack's SWIGLU nodes, or the matvec one of its ADD nodes adds a residual to.
static bool feeds_pack_epilogue(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, int p) {
    const ggml_tensor * mm = cgraph->nodes[pack.nodes[p]];
    for (int q = 0; q < pack.n; ++q) {
        const ggml_tensor * t = cgraph->nodes[pack.nodes[q]];
        if (t->op == GGML_OP_GLU && (t->src[0] == mm || t->src[1] == mm)) {
            return true;
        }
        if (t->op == GGML_OP_ADD && (seen_matvec(t->src[0]) == mm || seen_matvec(t->src[1]) == mm)) {
            return true;
        }
    }
    return false;
}

// GGML_FLASHRT_GEMV_ONLY=part[,part...] (diagnostic): the GEMV windows take only weights whose
// name contains one of the parts, to find which matvec moves the logits off stock's.
static bool named_in_gemv_only(const ggml_tensor * w) {
    static const std::vector<std::string> parts = [] {
        std::vector<std::string> v;
        const char *             env = std::getenv("GGML_FLASHRT_GEMV_ONLY");
        for (const char * p = env; p != nullptr && *p != '\0';) {
            const char * comma = std::strchr(p, ',');
            const size_t n     = comma != nullptr ? (size_t) (comma - p) : std::strlen(p);
            if (n > 0) {
                v.emplace_back(p, n);
            }
            p = comma != nullptr ? comma + 1 : nullptr;
        }
        return v;
    }();
    if (parts.empty()) {
        return true;
    }
    for (const std::string & part : parts) {
        if (std::strstr(w->name, part.c_str()) != nullptr) {
            return true;
        }
    }
    return false;
}

// The LM head's weight (tied embeddings: the token embedding), as llama.cpp names it.
static bool is_lm_head_weight(const ggml_tensor * w) {
    return std::strcmp(w->name, "output.weight") == 0 || std::strcmp(w->name, "token_embd.weight") == 0;
}

// GGML_FLASHRT_HEAD_BATCH=1: the LM head at up to FLASHRT_GEMV_HEAD_MAX_TOKENS tokens (gemv-pack.cuh).
static bool head_batch() {
    static const bool on = flashrt_env_flag("GGML_FLASHRT_HEAD_BATCH", false);
    return on;
}


// The most tokens a dense matvec of weight `w` may have in a launch of the GEMV windows.
static int64_t max_tokens_of(const ggml_tensor * w) {
    return head_batch() && is_lm_head_weight(w) ? FLASHRT_GEMV_HEAD_MAX_TOKENS : FLASHRT_GEMV_MAX_TOKENS;
}

const char * flashrt_gemv_segment_miss(const ggml_tensor * mm, const ggml_tensor * input) {
    if (mm->op != GGML_OP_MUL_MAT && mm->op != GGML_OP_MUL_MAT_ID) {
        return "a reader is not a matvec";
    }
    if (!named_in_gemv_only(mm->src[0])) {
        return "the weight is not named in GGML_FLASHRT_GEMV_ONLY";
    }
    if (!same_vector(mm->src[1], input) && mm->src[1] != input) {
        return "a matvec reads another input";
    }
    if ((mm->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
        return "a matvec is not to be computed";
    }
    const ggml_tensor * w = mm->src[0];
    if (gemv_type_of(w->type) == FRT_GEMV_TYPE_COUNT) {
        return "weight type";
    }
    if (!ggml_is_contiguous(w) || w->ne[3] != 1 || (!is_expert_matvec(mm) && w->ne[2] != 1)) {
        return "weight layout";
    }
    if (w->ne[0] % 256 != 0 || w->ne[1] > INT32_MAX) {
        return "weight shape (columns not a multiple of 256)";
    }
    if (input->type != GGML_TYPE_F32 || !ggml_is_contiguous(input) || input->ne[3] != 1) {
        return "input layout";
    }
    if (mm->type != GGML_TYPE_F32 || !ggml_is_contiguous(mm)) {
        return "output layout";
    }
    if (is_expert_matvec(mm)) {
        const ggml_tensor * ids = mm->src[2];
        if (ids->type != GGML_TYPE_I32 || ids->nb[0] != sizeof(int32_t) || ids->ne[1] != input->ne[2]) {
            return "expert ids layout";
        }
        if (input->ne[2] > FLASHRT_GEMV_MAX_TOKENS) {
            return "batch (more tokens than the decode GEMV windows take)";
        }
        if (input->ne[1] != 1 && input->ne[1] != ids->ne[0]) {
            return "expert inputs neither shared nor one per expert";
        }
        if ((int64_t) ids->ne[0] * input->ne[2] > FRT_GEMV_MAX_SLOTS) {
            return "too many expert slots";
        }
    } else if (input->ne[1] > max_tokens_of(mm->src[0]) || input->ne[2] != 1) {
        return "batch (more tokens than the decode GEMV windows take)";
    }
    return nullptr;
}

// Two readers of one input can share a launch when they read it the same way: plain matvecs, or
// expert matvecs with the same ids.
static bool same_launch(const ggml_tensor * a, const ggml_tensor * b) {
    return a->op == b->op && (a->op != GGML_OP_MUL_MAT_ID || a->src[2] == b->src[2]);
}

// Whether nodes other than the pack's matvecs read node `value` (the normed value of a norm pack).
static bool read_beyond_pack(const ggml_cgraph * cgraph, int value, const flashrt_gemv_pack & pack) {
    int in_pack = 0;
    for (int p = 0; p < pack.n; ++p) {
        in_pack += cgraph->nodes[pack.nodes[p]]->src[1] == cgraph->nodes[value] ? 1 : 0;
    }
    return ggml_node_get_use_count(cgraph, value) > in_pack;
}

// The dense matvecs of `window`'s weights that read node `value` first, in node order, up to its
// first other reader.
static const char * collect_leading_consumers(const ggml_cgraph * cgraph, int value, const char * window,
                                              flashrt_gemv_pack & pack) {
    const ggml_tensor * v = cgraph->nodes[value];
    pack = flashrt_gemv_pack();
    const int end = std::min(cgraph->n_nodes, value + 1 + flashrt_gemv_lookahead);
    for (int j = value + 1; j < end && pack.n < FRT_GEMV_MAX_SEGMENTS; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (std::find(std::begin(t->src), std::end(t->src), v) == std::end(t->src)) {
            continue;
        }
        const char * of = t->op == GGML_OP_MUL_MAT ? flashrt_gemv_norm_pack_window(t->src[0]) : nullptr;
        if (of == nullptr || std::strcmp(of, window) != 0 || t->src[1] != v ||
            flashrt_gemv_segment_miss(t, v) != nullptr) {
            break;
        }
        pack.nodes[pack.n++] = j;
    }
    return pack.n == 0 ? "no matvec of the window reads the normed value first" : nullptr;
}

const char * flashrt_gemv_collect_all_consumers(const ggml_cgraph * cgraph, int value, flashrt_gemv_pack & pack) {
    const ggml_tensor * v = cgraph->nodes[value];
    pack = flashrt_gemv_pack();
    int found = 0;
    const int end = std::min(cgraph->n_nodes, value + 1 + flashrt_gemv_lookahead);
    for (int j = value + 1; j < end; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        for (int s = 0; s < GGML_MAX_SRC; ++s) {
            if (t->src[s] != v) {
                continue;
            }
            ++found;
            if (const char * miss = flashrt_gemv_segment_miss(t, v)) {
                return miss;
            }
            if (t->op != GGML_OP_MUL_MAT) {
                return "a reader is an expert matvec (ids computed later)";
            }
            if (pack.n == FRT_GEMV_MAX_SEGMENTS) {
                return "more readers than one launch takes";
            }
            pack.nodes[pack.n++] = j;
        }
    }
    if (pack.n == 0) {
        return "no reader";
    }
    if (found != ggml_node_get_use_count(cgraph, value)) {
        return "a reader lies beyond the lookahead";
    }
    return nullptr;
}

// The matvecs from node `first` on that read its input the same way, as many as fit (see
// flashrt_gemv_fold for the dense readers of an expert matvec's vectors).
static const char * collect_same_input(const ggml_cgraph * cgraph, int first, flashrt_gemv_fold fold,
                                       flashrt_gemv_pack & pack) {
    const ggml_tensor * anchor = cgraph->nodes[first];
    if (anchor->op != GGML_OP_MUL_MAT && anchor->op != GGML_OP_MUL_MAT_ID) {
        return flashrt_miss_anchor;
    }
    const ggml_tensor * input = segment_input(anchor);
    if (const char * miss = flashrt_gemv_segment_miss(anchor, input)) {
        return miss;
    }
    const bool experts = is_expert_matvec(anchor);
    if (fold == flashrt_gemv_fold::experts && (!experts || input->ne[1] != 1 || input->ne[2] != 1)) {
        return "not the routed experts' matvec of one token's input";
    }
    pack = flashrt_gemv_pack();
    pack.nodes[pack.n++] = first;
    ggml_type direct = GGML_TYPE_COUNT;
    joins_launch(anchor->src[0], &direct);
    int folded = 0;
    const int end = std::min(cgraph->n_nodes, first + 1 + flashrt_gemv_lookahead);
    for (int j = first + 1; j < end && pack.n < FRT_GEMV_MAX_SEGMENTS; ++j) {
        const ggml_tensor * t = cgraph->nodes[j];
        if (t->op != GGML_OP_MUL_MAT && t->op != GGML_OP_MUL_MAT_ID) {
            continue;
        }
        if (flashrt_gemv_segment_miss(t, input) != nullptr) {
            continue;
        }
        const bool dense_reader_of_expert_vectors = !is_expert_matvec(t) && t->src[1] != input;
        if (!experts && fold == flashrt_gemv_fold::leave && is_expert_matvec(t) && same_vector(t->src[1], input)) {
            break;  // the dense matvecs after this one go with the experts (SHEXP_FOLD)
        }
        ggml_type direct_if_joined = direct;
        if (!joins_launch(t->src[0], &direct_if_joined)) {
            continue;  // another direct type: a launch of its own, at its own node
        }
        if (t->src[1] == input && same_launch(t, anchor)) {
            pack.nodes[pack.n++] = j;
            direct = direct_if_joined;
        } else if (experts && fold == flashrt_gemv_fold::experts && dense_reader_of_expert_vectors) {
            pack.nodes[pack.n++] = j;
            direct = direct_if_joined;
            ++folded;
        }
    }
    if (fold == flashrt_gemv_fold::experts && folded == 0) {
        return "no dense matvec of the experts' input after them (no shared expert to fold)";
    }
    return nullptr;
}

static bool overlaps_any_source(const ggml_tensor * t, const ggml_tensor * out) {
    for (int s = 0; s < GGML_MAX_SRC; ++s) {
        if (t->src[s] != nullptr && t->src[s]->data != nullptr && flashrt_overlaps(t->src[s], out)) {
            return true;
        }
    }
    return false;
}

bool flashrt_gemv_early_safe(const ggml_cgraph * cgraph, int run_at, const flashrt_gemv_pack & pack, int p,
                             const ggml_tensor * x) {
    const ggml_tensor * out = cgraph->nodes[pack.nodes[p]];
    if (flashrt_overlaps(out, x)) {
        return false;
    }
    for (int q = 0; q < pack.n; ++q) {
        const ggml_tensor * w = cgraph->nodes[pack.nodes[q]]->src[0];
        if (flashrt_overlaps(out, w) || (q != p && flashrt_overlaps(out, cgraph->nodes[pack.nodes[q]]))) {
            return false;
        }
    }
    // Everything the loop would have run before this node must leave its memory alone.
    for (int t = run_at; t < pack.nodes[p]; ++t) {
        const ggml_tensor * node = cgraph->nodes[t];
        bool in_pack = false;
        for (int q = 0; q < pack.n; ++q) {
            in_pack = in_pack || pack.nodes[q] == t;
        }
        if (in_pack) {
            continue;  // checked above
        }
        if ((node->data != nullptr && flashrt_overlaps(node, out)) || overlaps_any_source(node, out)) {
            return false;
        }
    }
    return true;
}

// GGML_FLASHRT_GEMV_LATE=1: norm-fed packs compute every matvec where it stands, as they do when the
// allocator lends its output's memory to the nodes before it. test-backend-ops allocates every
// tensor apart, so only this switch takes that path there.
static bool late_for_test() {
    static const bool late = flashrt_env_flag("GGML_FLASHRT_GEMV_LATE", false);
    return late;
}

// GGML_FLASHRT_GEMV_KERNEL=exact|registers|bulk: one frt_gemv kernel for every launch of the
// GEMV windows, so that each can be measured in one build. Unset: see pack_kernel.
static frt_gemv_kernel kernel_override() {
    static const frt_gemv_kernel kernel = [] {
        const char * v = std::getenv("GGML_FLASHRT_GEMV_KERNEL");
        if (v != nullptr && std::strcmp(v, "exact") == 0) {
            return FRT_GEMV_KERNEL_EXACT;
        }
        if (v != nullptr && std::strcmp(v, "bulk") == 0) {
            return FRT_GEMV_KERNEL_BULK;
        }
        if (v != nullptr && std::strcmp(v, "registers") == 0) {
            return FRT_GEMV_KERNEL_REGISTERS;
        }
        return FRT_GEMV_KERNEL_AUTO;
    }();
    return kernel;
}

// The kernel of a launch whose arguments (GGUF layouts) are `a`. Inside the layers, the exact
// kernel wherever it takes the launch: its sums are stock's bit for bit, and decode amplifies any
// other rounding into logits that leave stock's (cargo xtask parity). The LM head's output is
// amplified by nothing, so it keeps frt_gemv's fastest kernel.
static frt_gemv_kernel pack_kernel(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const frt_gemv_args & a) {
    if (kernel_override() != FRT_GEMV_KERNEL_AUTO) {
        return kernel_override();
    }
    if (!flashrt_gemv_pack_reads(cgraph, pack, "HEAD") && frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT) == nullptr) {
        return FRT_GEMV_KERNEL_EXACT;
    }
    return FRT_GEMV_KERNEL_AUTO;
}

// Whether the norm's input and weight stay as they are from node `from` until node `until`, so that a
// launch there can still fold the norm.
static bool norm_inputs_intact(const ggml_cgraph * cgraph, int from, int until, const ggml_tensor * x,
                               const ggml_tensor * weight) {
    for (int t = from; t < until; ++t) {
        const ggml_tensor * node = cgraph->nodes[t];
        if (node->data != nullptr && !flashrt_is_view(node) &&
            (flashrt_overlaps(node, x) || flashrt_overlaps(node, weight))) {
            return false;
        }
    }
    return true;
}

flashrt_match flashrt_gemv_match(const flashrt_gemv_pack & pack, int i, int n_nodes) {
    flashrt_match m = flashrt_hit(n_nodes);
    for (int p = 0; p < pack.n; ++p) {
        if (pack.nodes[p] >= i + n_nodes) {
            m.claimed_runs_there[m.n_claimed] = pack.there[p];
            m.claimed[m.n_claimed++] = pack.nodes[p];
        }
    }
    if (pack.tail >= 0) {  // after the pack's nodes (add_moe_tail)
        m.fused_run = pack.tail;
        for (int t = 0; t < pack.n_tail_nodes; ++t) {
            m.claimed[m.n_claimed++] = pack.tail_nodes[t];
        }
    }
    return m;
}

flashrt_gemv_pack flashrt_gemv_pack_of(const ggml_cgraph * cgraph, const flashrt_match & m, int i, bool norm_folded) {
    flashrt_gemv_pack pack;
    if (norm_folded) {
        pack.norm = i;
    } else {
        for (int k = 0; k < m.n_nodes; ++k) {
            pack.nodes[pack.n++] = i + k;
        }
    }
    for (int k = 0; k < m.n_claimed; ++k) {
        if (m.fused_run >= 0 && m.claimed[k] >= m.fused_run) {
            break;  // the MOE_TAIL run the launch computes
        }
        pack.there[pack.n] = m.claimed_runs_there[k];
        pack.nodes[pack.n++] = m.claimed[k];
    }
    pack.tail = m.fused_run;
    pack.keep_normed = norm_folded && read_beyond_pack(cgraph, i + 1, pack);
    return pack;
}

// The launch's arguments, every weight in its GGUF layout.
static void fill_args(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, frt_gemv_args & a) {
    a = frt_gemv_args();
    // Every node of a pack reads the same input: the first describes it.
    const ggml_tensor * first = cgraph->nodes[pack.nodes[0]];
    const ggml_tensor * input = segment_input(first);
    const ggml_tensor * x = input;
    if (pack.norm >= 0) {
        const ggml_tensor * norm = cgraph->nodes[pack.norm];
        const ggml_tensor * mul = cgraph->nodes[pack.norm + 1];
        x = norm->src[0];
        a.norm = (const float *) (mul->src[0] == norm ? mul->src[1] : mul->src[0])->data;
        std::memcpy(&a.eps, norm->op_params, sizeof(float));
    }
    a.x = (const float *) x->data;
    a.k = (int) input->ne[0];
    if (pack.norm >= 0 && (pack.keep_normed || (cgraph->nodes[pack.norm + 1]->flags & GGML_TENSOR_FLAG_OUTPUT))) {
        // The graph keeps the normed value (llama.cpp's final norm), or readers the pack does not
        // take read it: the launch writes it too.
        const ggml_tensor * kept = cgraph->nodes[pack.norm + 1];
        a.x_normed = (float *) kept->data;
        a.x_normed_stride = kept->nb[1] / sizeof(float);
    }
    if (is_expert_matvec(first)) {
        a.tokens = (int) input->ne[2];
        a.x_per_token = (int) input->ne[1];
        a.x_stride = (a.x_per_token == 1 ? input->nb[2] : input->nb[1]) / sizeof(float);
    } else {
        a.tokens = (int) input->ne[1];
        a.x_per_token = 1;
        a.x_stride = x->nb[1] / sizeof(float);
    }
    a.n_segments = 0;
    for (int p = 0; p < pack.n; ++p) {
        if (pack.there[p] || feeds_pack_epilogue(cgraph, pack, p)) {
            continue;  // computed where it stands, or by its SWIGLU's segment
        }
        const ggml_tensor * out = cgraph->nodes[pack.nodes[p]];
        // A SWIGLU node: its up matvec's segment, with the gate's weights beside, writing its output.
        // An ADD node: its matvec's segment, adding the other operand (the residual).
        const bool          glu  = out->op == GGML_OP_GLU;
        const bool          add  = out->op == GGML_OP_ADD;
        const int           mm_src = add ? add_matvec_src(cgraph, pack, out) : 0;
        const ggml_tensor * node = glu ? out->src[1] : add ? seen_matvec(out->src[mm_src]) : out;
        const ggml_tensor * w = node->src[0];
        frt_gemv_segment & s = a.seg[a.n_segments++];
        s.type = gemv_type_of(w->type);
        s.w = w->data;
        s.rows = (int) w->ne[1];
        s.row_stride = w->nb[1];
        s.out = (float *) out->data;
        s.out_stride = out->nb[1] / sizeof(float);
        s.epilogue = glu ? FRT_GEMV_SWIGLU : add ? FRT_GEMV_ADD : FRT_GEMV_STORE;
        s.w_gate = glu ? out->src[0]->src[0]->data : nullptr;
        if (!is_expert_matvec(node) && segment_input(node)->data != input->data) {
            s.x = (const float *) segment_input(node)->data;  // its own vector (add_own_input_matvec)
        }
        if (add) {
            const ggml_tensor * residual = out->src[1 - mm_src];
            s.residual = (const float *) residual->data;
            s.residual_stride = residual->nb[1] / sizeof(float);
        }
        if (is_expert_matvec(node)) {
            const ggml_tensor * ids = node->src[2];
            s.ids = (const int32_t *) ids->data;
            s.ids_stride = ids->nb[1] / sizeof(int32_t);
            s.n_used = (int) ids->ne[0];
            s.n_experts = (int) w->ne[2];
            s.expert_stride = w->nb[2];
        }
    }
    flashrt_moe_tail_run tail;
    if (pack.tail >= 0 && flashrt_moe_tail_run_at(cgraph, pack.tail, tail) == nullptr) {
        a.tail.out      = (float *) tail.out->data;
        a.tail.weights  = (const float *) tail.weights->data;
        a.tail.gate     = (const float *) tail.gate->data;
        a.tail.residual = (const float *) tail.residual->data;
        a.tail.experts_seg = a.tail.shexp_seg = -1;
        for (int si = 0; si < a.n_segments; ++si) {
            if (a.seg[si].out == (const float *) tail.experts->data && a.seg[si].ids != nullptr) {
                a.tail.experts_seg = si;
            } else if (a.seg[si].out == (const float *) tail.shexp->data && a.seg[si].ids == nullptr) {
                a.tail.shexp_seg = si;
            }
        }
    }
    flashrt_moe_topk_run r;
    if (pack.routing >= 0 && flashrt_moe_topk_run_at(cgraph, pack.routing, r) == nullptr) {
        a.route_logits    = (const float *) r.logits->data;
        a.route_n_experts = r.n_experts;
        a.route_norm      = r.norm;
        a.route_clamp     = r.clamp;
        a.route_scale     = r.scale;
        a.route_ids       = (int32_t *) r.ids->data;
        a.route_weights   = (float *) r.weights->data;
    }
}

// For the kernels that read repacked layouts (not the exact one): dense Q6_K/Q8_0 weights from
// the repack cache, where it holds them.
static void use_repacked(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack,
                         frt_gemv_args & a) {
    int si = 0;
    for (int p = 0; p < pack.n; ++p) {
        if (pack.there[p]) {
            continue;
        }
        const ggml_tensor * node = cgraph->nodes[pack.nodes[p]];
        const ggml_tensor * w    = node->src[0];
        frt_gemv_segment &  s    = a.seg[si++];
        if (is_expert_matvec(node) || !flashrt_repack_supported(w, flashrt_layout::gemv)) {
            continue;
        }
        if (const void * repacked = flashrt_repack_lookup(ctx, w, flashrt_layout::gemv)) {
            s.type       = frt_gemv_repacked_type(s.type);
            s.w          = repacked;
            s.row_stride = frt_gemv_row_bytes(s.type, a.k);
        }
    }
}

// What the kernel itself refuses (alignment, shared memory), asked with the GGUF layout.
// What the kernel refuses of the launch at the anchor and of each launch of one node (there).
static const char * kernel_miss(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack) {
    frt_gemv_args a;
    fill_args(cgraph, pack, a);
    if (a.n_segments > 0) {
        if (const char * miss = frt_gemv_unsupported(a, pack_kernel(cgraph, pack, a))) {
            return miss;
        }
    }
    for (int p = 0; p < pack.n; ++p) {
        if (!pack.there[p]) {
            continue;
        }
        flashrt_gemv_pack one;
        one.norm = pack.norm;
        one.nodes[one.n++] = pack.nodes[p];
        fill_args(cgraph, one, a);
        if (const char * miss = frt_gemv_unsupported(a, pack_kernel(cgraph, one, a))) {
            return miss;
        }
    }
    return nullptr;
}

// The launch's line in GGML_FLASHRT_LAUNCH_LOG: the bytes of weights it reads (every expert slot
// a matrix, as the kernel reads them) and their tensor names; and its name in the exact trace.
static void log_launch(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const frt_gemv_args & a,
                       const char * window) {
    uint64_t    bytes = 0;
    std::string names;
    int         si    = 0;
    for (int p = 0; p < pack.n; ++p) {
        if (pack.there[p] || feeds_pack_epilogue(cgraph, pack, p)) {
            continue;
        }
        const ggml_tensor *      node  = cgraph->nodes[pack.nodes[p]];
        const bool               glu   = node->op == GGML_OP_GLU;
        const frt_gemv_segment & s     = a.seg[si++];
        if (node->op == GGML_OP_ADD) {
            node = seen_matvec(node->src[add_matvec_src(cgraph, pack, node)]);
        }
        const int64_t            slots = s.ids != nullptr ? (int64_t) a.tokens * s.n_used : 1;
        bytes += (uint64_t) ((glu ? 2 : 1) * slots * s.rows * frt_gemv_row_bytes(s.type, a.k));
        names += (names.empty() ? "" : " / ") +
                 (glu ? std::string(node->src[0]->src[0]->name) + " / " + node->src[1]->src[0]->name
                      : std::string(node->src[0]->name));
    }
    if (flashrt_launch_log_enabled()) {
        flashrt_log_launch(window, bytes, names);
    }
    if (flashrt_exact_trace_on() && a.n_segments > 0) {
        flashrt_exact_trace_name(a.seg[0].w, window, names);
    }
}

// How far before a routed experts' matvec its top-k run is looked for.
static constexpr int guess_lookback = 64;

// add_guess, on unless GGML_FLASHRT_GUESS_EXPERTS=0 (tg128 1.350x -> 1.379x, the same bits:
// bench/results/2026-12-01-f122c62-h200-guess-serve).
static bool guess_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_GUESS_EXPERTS", true);
    return enabled;
}

// An exact launch of routed experts whose ids a softmax top-k run chose (MOE_TOPK's pattern) and
// that does not compute them itself (the experts' down projection): the router's logits as the
// launch's guess (frt_gemv_args::guess_logits), so that its blocks stage their experts' rows before
// the wait. Left out where a node between the run and the launch writes over the logits (the guess
// would miss and the rows be copied twice), and where the kernel refuses a guess (the SwiGLU
// gate/up). The guess changes no output: the ids decide after the wait.
static void add_guess(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, frt_gemv_args & a) {
    if (!guess_enabled() || a.route_logits != nullptr) {
        return;
    }
    int                 at  = -1;
    const ggml_tensor * ids = nullptr;
    for (int p = 0; p < pack.n && ids == nullptr; ++p) {
        const ggml_tensor * t = cgraph->nodes[pack.nodes[p]];
        const ggml_tensor * mm = t->op == GGML_OP_GLU ? t->src[1] : t;
        if (mm != nullptr && mm->op == GGML_OP_MUL_MAT_ID) {
            at  = pack.nodes[p];
            ids = mm->src[2];
        }
    }
    if (ids == nullptr || ids->op != GGML_OP_VIEW || ids->src[0] == nullptr || ids->src[0]->op != GGML_OP_ARGSORT) {
        return;
    }
    const ggml_tensor * softmax = ids->src[0]->src[0];
    for (int t = at - 1; t >= 0 && t >= at - guess_lookback; --t) {
        if (cgraph->nodes[t] != softmax) {
            continue;
        }
        flashrt_moe_topk_run r;
        if (flashrt_moe_topk_run_at(cgraph, t, r) != nullptr || r.ids != ids) {
            return;
        }
        for (int u = t + 1; u < at; ++u) {
            const ggml_tensor * n = cgraph->nodes[u];
            if (!flashrt_is_view(n) && n->data != nullptr && flashrt_overlaps(n, r.logits)) {
                return;
            }
        }
        if (a.tail.out != nullptr) {
            // No guess where the tail's output (fill_args) overlaps the logits: late blocks would
            // still read them while a group's tail is written.
            const char * out    = (const char *) a.tail.out;
            const char * logits = (const char *) r.logits->data;
            const size_t bytes  = (size_t) a.seg[a.tail.experts_seg].rows * sizeof(float);
            if (out < logits + ggml_nbytes(r.logits) && logits < out + bytes) {
                return;
            }
        }
        a.guess_logits = (const float *) r.logits->data;
        if (frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT) != nullptr) {
            a.guess_logits = nullptr;
        }
        return;
    }
}

// add_prefetch, with GGML_FLASHRT_L2_PREFETCH=1 (an experiment until measured in decode).
static bool l2_prefetch_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_L2_PREFETCH", false);
    return enabled;
}

// How far after a launch's last node the matvecs it prefetches for are looked for, and how many of
// their weights' bytes at most (a fraction of the H200's 50 MB L2, that the launches between
// stream through too).
static constexpr int     prefetch_lookahead = 96;
static constexpr int64_t prefetch_budget    = 16 << 20;

// Whether w is model weights in plain memory of this device (a model-weights buffer that is not
// host memory and no split tensor's), 16-byte aligned: what a launch may prefetch.
static bool prefetchable(const ggml_tensor * w) {
    return w != nullptr && w->buffer != nullptr && w->extra == nullptr &&
           ggml_backend_buffer_get_usage(w->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS &&
           !ggml_backend_buffer_is_host(w->buffer) && (uintptr_t) w->data % 16 == 0;
}

// An exact launch's prefetch (frt_gemv_args::prefetch): the model weights of the dense matvecs
// after its nodes, in graph order, up to the next routed experts' matvec (whose own copies, issued
// once their experts are known, should not queue behind prefetches), until the budget,
// FRT_GEMV_MAX_PREFETCH tensors or the lookahead run out; the bytes rounded down to 16. Which
// experts that matvec reads is not known here, except in a launch that selects them itself: when
// it reads the ids this launch writes (the experts' down projection after their gate/up), those
// experts' matrices are prefetched whole. Every range meets frt_gemv_unsupported's rules by
// construction (prefetchable, 16-byte multiples, at most FRT_GEMV_MAX_PREFETCH).
static void add_prefetch(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, frt_gemv_args & a) {
    if (!l2_prefetch_enabled()) {
        return;
    }
    int last = pack.norm;
    for (int p = 0; p < pack.n; ++p) {
        last = std::max(last, pack.nodes[p]);
    }
    for (int t = 0; t < pack.n_tail_nodes; ++t) {
        last = std::max(last, pack.tail_nodes[t]);
    }
    int64_t left = prefetch_budget;
    for (int i = last + 1; i < cgraph->n_nodes && i <= last + prefetch_lookahead && left > 0 &&
                           a.prefetch.n < FRT_GEMV_MAX_PREFETCH;
         ++i) {
        const ggml_tensor * mm = cgraph->nodes[i];
        if (mm->op == GGML_OP_MUL_MAT_ID && a.route_logits != nullptr && a.prefetch.experts == nullptr &&
            mm->src[2] != nullptr && mm->src[2]->data == (void *) a.route_ids && prefetchable(mm->src[0]) &&
            mm->src[0]->ne[2] == a.route_n_experts && mm->src[0]->nb[2] % 16 == 0) {
            a.prefetch.experts       = mm->src[0]->data;
            a.prefetch.expert_stride = (int64_t) mm->src[0]->nb[2];
            a.prefetch.expert_bytes  = (int64_t) mm->src[0]->nb[2];
        }
        if (mm->op == GGML_OP_MUL_MAT_ID) {
            break;
        }
        const ggml_tensor * w = mm->op == GGML_OP_MUL_MAT ? mm->src[0] : nullptr;
        if (!prefetchable(w)) {
            continue;
        }
        bool seen = false;
        for (int r = 0; r < a.prefetch.n; ++r) {
            seen = seen || a.prefetch.ptr[r] == w->data;
        }
        const int64_t bytes = std::min<int64_t>(left, (int64_t) ggml_nbytes(w)) / 16 * 16;
        if (seen || bytes == 0) {
            continue;
        }
        a.prefetch.ptr[a.prefetch.n]     = w->data;
        a.prefetch.bytes[a.prefetch.n++] = bytes;
        left -= bytes;
    }
}

// On unless GGML_FLASHRT_NORM_HANDOFF=0: the tail that norms takes ~2.5 µs longer (its 8 blocks
// meeting at a counter then; ~1 µs less since they meet at tagged sums), the launches it feeds ~3.3
// µs less (tg128 +0.9% and +1.0% on the H100, bench/results/2026-12-06-20af5b6-h100-experiments).
static bool norm_handoff_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_NORM_HANDOFF", true);
    return enabled;
}

// On unless GGML_FLASHRT_ROUTER_HANDOFF=0: a launch on the router kernel (ROUTER: the FFN norm, the
// router and the shared expert's gate vector) also writes the normed x it keeps as the image the
// next launch reads (frt_gemv_args::x_normed_q8), and hands it to the experts' gate/up launch, which
// then copies it instead of reading and quantizing the normed x after its wait: that launch 14.36 ->
// 12.46 µs in decode's trace, tg128 +1.9% on the H100 (bench/results/2026-12-07-3f271b9-h100-router-handoff).
static bool router_handoff_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_ROUTER_HANDOFF", true);
    return enabled;
}

// The last handoff of this thread's node loop: which vector of which evaluation its image holds
// (x: the vector's memory; norm: the node of the norm it went through, or -1).
struct handoff_note_t {
    const ggml_backend_cuda_context * ctx        = nullptr;
    const ggml_cgraph *               cgraph     = nullptr;
    uint64_t                          evaluation = 0;
    int                               norm       = -1;
    const void *                      x          = nullptr;
    const void *                      image      = nullptr;
};
static thread_local handoff_note_t handoff_note;

bool flashrt_gemv_handoff_wanted(const ggml_cgraph * cgraph, int norm, const float ** weight, float * eps) {
    if (!norm_handoff_enabled()) {
        return false;
    }
    flashrt_gemv_pack pack;
    if (flashrt_gemv_match_norm_pack(cgraph, norm, pack) != nullptr) {
        return false;
    }
    const bool taken = (flashrt_window_enabled("INPROJ") && flashrt_gemv_pack_reads(cgraph, pack, "INPROJ")) ||
                       (flashrt_window_enabled("ATTNQKV") && flashrt_gemv_pack_reads(cgraph, pack, "ATTNQKV"));
    if (!taken) {
        return false;
    }
    frt_gemv_args a;
    fill_args(cgraph, pack, a);
    if (a.n_segments == 0 || pack_kernel(cgraph, pack, a) != FRT_GEMV_KERNEL_EXACT) {
        return false;
    }
    alignas(16) static const uint8_t any_image[16] = {};  // only its presence and alignment are checked
    a.x_q8 = any_image;
    if (frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT) != nullptr) {
        return false;
    }
    *weight = a.norm;
    *eps    = a.eps;
    return true;
}

void flashrt_gemv_hand_off(const ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int norm, const void * x,
                           const void * image) {
    handoff_note = { &ctx, cgraph, flashrt_evaluation(), norm, x, image };
}

void * flashrt_gemv_handoff_slot(const ggml_backend_cuda_context & ctx, int64_t k) {
    if (k % 256 != 0 || k > FRT_X_Q8_MAX_K) {
        return nullptr;
    }
    return flashrt_counters_of(ctx, flashrt_counter_use::handoff);
}

// The image of the launch's input, when the kernel before handed it off in this evaluation (h:
// the note as the launch found it).
static void take_handoff(const handoff_note_t & h, const ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph,
                         const flashrt_gemv_pack & pack, frt_gemv_args & a) {
    if (h.image == nullptr || h.ctx != &ctx || h.cgraph != cgraph || h.norm != pack.norm || h.x != a.x ||
        h.evaluation != flashrt_evaluation()) {
        return;
    }
    a.x_q8 = h.image;
    if (frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT) != nullptr) {
        a.x_q8 = nullptr;
        return;
    }
    flashrt_global_stats().handoffs++;
}

void flashrt_gemv_run_pack(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack,
                           const char * window) {
    // A note is for the next GEMV launch only. Kept longer, a later launch whose input ggml's
    // allocator placed at the same address (another vector, of the same size or not) could take it.
    const handoff_note_t note = handoff_note;
    handoff_note              = handoff_note_t();
    frt_gemv_args a;
    fill_args(cgraph, pack, a);
    if (a.n_segments == 0) {
        return;  // every matvec is computed where it stands
    }
    const frt_gemv_kernel kernel = pack_kernel(cgraph, pack, a);
    if (kernel != FRT_GEMV_KERNEL_EXACT) {
        use_repacked(ctx, cgraph, pack, a);
    } else {
        add_guess(cgraph, pack, a);
        add_prefetch(cgraph, pack, a);
        take_handoff(note, ctx, cgraph, pack, a);
    }
    bool tail_apart = false;
    if (a.tail.out != nullptr) {
        a.tail.counters = flashrt_counters_of(ctx, flashrt_counter_use::moe_tail);
        if (a.tail.counters == nullptr) {  // a capture no direct evaluation prepared: the tail's own kernel
            a.tail     = frt_gemv_moe_tail();
            tail_apart = true;
        }
    }
    if (kernel == FRT_GEMV_KERNEL_EXACT) {  // none without a direct evaluation's prepare: a block a chunk
        a.chunk_counters = flashrt_counters_of(ctx, flashrt_counter_use::exact_chunks);
    }
    if (kernel == FRT_GEMV_KERNEL_EXACT && router_handoff_enabled() && a.x_normed != nullptr) {
        a.x_normed_q8 = flashrt_gemv_handoff_slot(ctx, a.k);
        if (a.x_normed_q8 != nullptr && frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT) != nullptr) {
            a.x_normed_q8 = nullptr;  // not a launch on the router kernel
        }
    }
    FLASHRT_CHECK(window, frt_gemv(a, ctx.stream(), kernel));
    if (a.x_normed_q8 != nullptr) {
        flashrt_gemv_hand_off(ctx, cgraph, -1, a.x_normed, a.x_normed_q8);
    }
    if (tail_apart) {
        flashrt_run_moe_tail_at(ctx, cgraph, pack.tail, false);
    }
    if (flashrt_launch_log_enabled() || flashrt_exact_trace_on()) {
        log_launch(cgraph, pack, a, window);
    }
}

void flashrt_gemv_run_there(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int norm, int node,
                            const char * window) {
    flashrt_gemv_pack one;
    one.norm = norm;
    one.nodes[one.n++] = node;
    flashrt_gemv_run_pack(ctx, cgraph, one, window);
}

void flashrt_gemv_prepare_pack(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph,
                               const flashrt_gemv_pack & pack) {
    frt_gemv_args a;
    fill_args(cgraph, pack, a);
    const bool exact = a.n_segments > 0 && pack_kernel(cgraph, pack, a) == FRT_GEMV_KERNEL_EXACT;
    if (exact || pack.tail >= 0 || (router_handoff_enabled() && a.x_normed != nullptr)) {
        // Without them the tail runs in its own kernel, the router hands nothing off, the exact
        // launches' blocks take a chunk each.
        flashrt_counters_prepare(ctx);
    }
    if (exact) {
        return;  // it reads the GGUF layouts
    }
    for (int p = 0; p < pack.n; ++p) {
        const ggml_tensor * node = cgraph->nodes[pack.nodes[p]];
        if (node->op == GGML_OP_MUL_MAT && flashrt_repack_supported(node->src[0], flashrt_layout::gemv)) {
            flashrt_repack_prepare(ctx, node->src[0], flashrt_layout::gemv);
        }
    }
}

const char * flashrt_gemv_match_norm_pack(const ggml_cgraph * cgraph, int i, flashrt_gemv_pack & pack,
                                          const char * leading) {
    const ggml_tensor * norm = cgraph->nodes[i];
    if (norm->op != GGML_OP_RMS_NORM) {
        return flashrt_miss_anchor;
    }
    if (i + 2 >= cgraph->n_nodes) {
        return "graph ends";
    }
    const ggml_tensor * mul = cgraph->nodes[i + 1];
    if (mul->op != GGML_OP_MUL || (mul->src[0] != norm && mul->src[1] != norm)) {
        return "the norm is not followed by its weight MUL";
    }
    const ggml_tensor * weight = mul->src[0] == norm ? mul->src[1] : mul->src[0];
    const ggml_tensor * x = norm->src[0];
    if (x->ne[1] > FLASHRT_GEMV_MAX_TOKENS) {
        // Before any scan (prefill); the LM head may take a batch (GGML_FLASHRT_HEAD_BATCH=1), and
        // llama.cpp computes it right after the final norm's MUL.
        const ggml_tensor * next = cgraph->nodes[i + 2];
        if (next->op != GGML_OP_MUL_MAT || next->src[1] != mul || x->ne[1] > max_tokens_of(next->src[0])) {
            return "batch (more tokens than the decode GEMV windows take)";
        }
    }
    if (!ggml_node_has_n_uses(cgraph, i, 1)) {
        return "the norm is read by more than its MUL";
    }
    if (x->type != GGML_TYPE_F32 || weight->type != GGML_TYPE_F32 || !ggml_is_contiguous(weight) ||
        ggml_nelements(weight) != x->ne[0] || x->nb[0] != sizeof(float) || x->ne[2] != 1 || x->ne[3] != 1) {
        return "norm shapes (one weight vector over F32 rows)";
    }
    if ((norm->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || (mul->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
        return "the norm is not to be computed";
    }
    if (const char * miss = leading != nullptr ? collect_leading_consumers(cgraph, i + 1, leading, pack)
                                               : flashrt_gemv_collect_all_consumers(cgraph, i + 1, pack)) {
        return miss;
    }
    pack.norm        = i;
    pack.keep_normed = read_beyond_pack(cgraph, i + 1, pack);
    // A normed value the graph keeps, or that later nodes read, is written by the launch itself,
    // while its blocks still read the norm's input: apart from that input, the weight and every
    // matvec's output.
    const bool kept = pack.keep_normed || (mul->flags & GGML_TENSOR_FLAG_OUTPUT) != 0;
    if (kept) {
        if (!ggml_is_contiguous(mul) || flashrt_overlaps(mul, x) || flashrt_overlaps(mul, weight)) {
            return "memory: the kept normed value overlaps the norm's input";
        }
        for (int p = 0; p < pack.n; ++p) {
            if (flashrt_overlaps(mul, cgraph->nodes[pack.nodes[p]])) {
                return "memory: the kept normed value overlaps a matvec's output";
            }
        }
    }
    ggml_type direct = GGML_TYPE_COUNT;
    for (int p = 0; p < pack.n; ++p) {
        const ggml_tensor * w = cgraph->nodes[pack.nodes[p]]->src[0];
        ggml_type direct_if_joined = direct;
        const bool joins = joins_launch(w, &direct_if_joined);
        if (joins && !late_for_test() && flashrt_gemv_early_safe(cgraph, i, pack, p, x)) {
            direct = direct_if_joined;
            continue;
        }
        const ggml_tensor * out = cgraph->nodes[pack.nodes[p]];
        // Another direct type than the launch's, or its memory is lent out until its turn: compute
        // it there, if the norm's inputs last.
        if (flashrt_overlaps(out, x) || flashrt_overlaps(out, weight) ||
            !norm_inputs_intact(cgraph, i + 2, pack.nodes[p], x, weight)) {
            return "memory: a matvec runs apart and the norm's input does not last until it";
        }
        pack.there[p] = true;
    }
    if (kept && std::all_of(pack.there, pack.there + pack.n, [](bool there) { return there; })) {
        return "the kept normed value needs a launch at the norm";
    }
    if (pack.keep_normed && std::any_of(pack.there, pack.there + pack.n, [](bool there) { return there; })) {
        // A launch of its own later would write the normed value again, where its memory may be
        // lent out by then.
        return "memory: a matvec runs apart while other readers need the normed value";
    }
    return kernel_miss(cgraph, pack);
}

// Whether the output of pack node `node` (a SWIGLU or an ADD that the launch computes) may be
// written by the launch at node run_at: apart from the input, every weight and every other output
// of the launch, and untouched by the nodes the loop would run before it (the allocator may lend
// its memory to them).
static bool epilogue_out_safe(const ggml_cgraph * cgraph, int run_at, const flashrt_gemv_pack & pack, int node,
                              const ggml_tensor * x) {
    const ggml_tensor * out = cgraph->nodes[node];
    if (flashrt_overlaps(out, x)) {
        return false;
    }
    for (int q = 0; q < pack.n; ++q) {
        const ggml_tensor * t = cgraph->nodes[pack.nodes[q]];
        if (pack.nodes[q] == node) {
            continue;
        }
        const bool matvec = t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_MUL_MAT_ID;
        if (matvec && flashrt_overlaps(out, t->src[0])) {
            return false;  // a weight
        }
        if ((!matvec || !feeds_pack_epilogue(cgraph, pack, q)) && flashrt_overlaps(out, t)) {
            return false;  // another output of the launch
        }
    }
    for (int t = run_at; t < node; ++t) {
        const ggml_tensor * other = cgraph->nodes[t];
        if (std::find(pack.nodes, pack.nodes + pack.n, t) != pack.nodes + pack.n || is_pack_reshape(cgraph, pack, other)) {
            continue;  // not computed by the loop
        }
        if ((other->data != nullptr && flashrt_overlaps(other, out)) || overlaps_any_source(other, out)) {
            if (flashrt_debug_enabled()) {
                std::fprintf(stderr, "FlashRT: %s's memory is used by node %d (%s %s) before its turn\n", out->name, t,
                             ggml_op_desc(other), other->name);
            }
            return false;
        }
    }
    return true;
}

// The first node before `end` that reads node `at` as its first or second source, or -1.
static int first_reader(const ggml_cgraph * cgraph, int at, int end) {
    const ggml_tensor * value = cgraph->nodes[at];
    for (int j = at + 1; j < end; ++j) {
        if (cgraph->nodes[j]->src[0] == value || cgraph->nodes[j]->src[1] == value) {
            return j;
        }
    }
    return -1;
}

// Whether any matvec of the pack is read first by a split SWIGLU (a pack the GLU epilogue is for).
static bool is_split_swiglu_reader(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack) {
    const int end = std::min(cgraph->n_nodes, pack.nodes[0] + 1 + flashrt_gemv_lookahead);
    for (int p = 0; p < pack.n; ++p) {
        const int user = first_reader(cgraph, pack.nodes[p], end);
        if (user >= 0 && is_split_swiglu(cgraph->nodes[user])) {
            return true;
        }
    }
    return false;
}

// Adds to `pack` (matvecs from node i, none computed apart) the SWIGLU nodes its matvecs feed, when
// every matvec is the gate or the up of one (the kernel takes the epilogue on all segments of a
// launch or on none), each read by that node alone, the pairs alike (type, shape, ids), and each
// SWIGLU's output can be written at i. Returns nullptr when it did, else why not.
static const char * add_glu_nodes(const ggml_cgraph * cgraph, int i, const ggml_tensor * x, flashrt_gemv_pack & pack) {
    int       glus[FRT_GEMV_MAX_SEGMENTS];
    int       n_glu = 0;
    const int end   = std::min(cgraph->n_nodes, i + 1 + flashrt_gemv_lookahead);
    for (int p = 0; p < pack.n; ++p) {
        if (pack.there[p]) {
            return "a matvec is computed where it stands";
        }
        if (!ggml_node_has_n_uses(cgraph, pack.nodes[p], 1)) {
            return "a matvec has more than one reader";
        }
        const int user = first_reader(cgraph, pack.nodes[p], end);
        if (user < 0 || !is_split_swiglu(cgraph->nodes[user])) {
            return "a matvec's reader is not a split SWIGLU";
        }
        if (std::find(glus, glus + n_glu, user) == glus + n_glu) {
            glus[n_glu++] = user;
        }
    }
    if (pack.n + n_glu > FRT_GEMV_MAX_SEGMENTS || pack.n + n_glu - 1 > FLASHRT_MAX_CLAIMED) {
        return "too many nodes for one launch";
    }
    for (int g = 0; g < n_glu; ++g) {
        const ggml_tensor * glu  = cgraph->nodes[glus[g]];
        const ggml_tensor * gate = glu->src[0];
        const ggml_tensor * up   = glu->src[1];
        const ggml_tensor * wg = gate->src[0];
        const ggml_tensor * wu = up->src[0];
        if (!is_pack_node(cgraph, pack, gate) || !is_pack_node(cgraph, pack, up)) {
            return "a SWIGLU's gate or up is not in the pack";
        }
        if (!same_launch(gate, up) || gate->src[1] != up->src[1] || wg->type != wu->type ||
            !ggml_are_same_shape(wg, wu) || wg->nb[1] != wu->nb[1] || wg->nb[2] != wu->nb[2]) {
            return "a SWIGLU's gate and up differ (input, ids, type, shape or strides)";
        }
        if (glu->type != GGML_TYPE_F32 || !ggml_are_same_shape(glu, up) || glu->nb[0] != sizeof(float) ||
            glu->nb[1] != up->nb[1] || (glu->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return "a SWIGLU's output is not an F32 tensor laid out as its up";
        }
    }
    flashrt_gemv_pack with = pack;
    for (int g = 0; g < n_glu; ++g) {
        with.nodes[with.n++] = glus[g];
    }
    std::sort(with.nodes, with.nodes + with.n);
    for (int g = 0; g < n_glu; ++g) {
        if (!epilogue_out_safe(cgraph, i, with, glus[g], x)) {
            return "memory: a SWIGLU's output is in use until its turn";
        }
    }
    pack = with;
    return nullptr;
}

// The residual add after a dense matvec (an output projection's `ADD(projection, residual)`),
// computed by the matvec's launch as FRT_GEMV_ADD, as stock's mmvq fuses a following ADD: the
// matvec read by the ADD alone, the other operand an F32 tensor of the same shape that exists at
// node i, is not written before the ADD and is not written by the launch (other than in place,
// row for row, by the ADD's own output).
static bool residual_ready(const ggml_cgraph * cgraph, int run_at, const flashrt_gemv_pack & pack, int add,
                           const ggml_tensor * residual) {
    const ggml_tensor * out = cgraph->nodes[add];
    if (flashrt_overlaps(out, residual) && (out->data != residual->data || out->nb[1] != residual->nb[1])) {
        return false;
    }
    for (int q = 0; q < pack.n; ++q) {
        const ggml_tensor * t = cgraph->nodes[pack.nodes[q]];
        const bool matvec = t->op == GGML_OP_MUL_MAT || t->op == GGML_OP_MUL_MAT_ID;
        if (pack.nodes[q] != add && (!matvec || !feeds_pack_epilogue(cgraph, pack, q)) && flashrt_overlaps(t, residual)) {
            return false;
        }
    }
    for (int t = run_at; t < add; ++t) {
        const ggml_tensor * node = cgraph->nodes[t];
        if (std::find(pack.nodes, pack.nodes + pack.n, t) == pack.nodes + pack.n && !is_pack_reshape(cgraph, pack, node) &&
            node->data != nullptr && flashrt_overlaps(node, residual)) {
            return false;
        }
    }
    return true;
}

// Adds to `pack` the ADD nodes of residuals after its dense matvecs (residual_ready), read directly
// or through a RESHAPE that keeps the rows (left to the loop: a view), each only when its output can
// be written at node i. Returns whether it added any.
static bool add_residual_adds(const ggml_cgraph * cgraph, int i, const ggml_tensor * x, flashrt_gemv_pack & pack) {
    const int end   = std::min(cgraph->n_nodes, i + 1 + flashrt_gemv_lookahead);
    bool      added = false;
    const int n_mm  = pack.n;
    for (int p = 0; p < n_mm; ++p) {
        const int           at = pack.nodes[p];
        const ggml_tensor * mm = cgraph->nodes[at];
        if (pack.there[p] || mm->op != GGML_OP_MUL_MAT || !ggml_node_has_n_uses(cgraph, at, 1) ||
            pack.n == FRT_GEMV_MAX_SEGMENTS || pack.n - 1 >= FLASHRT_MAX_CLAIMED) {
            continue;
        }
        int user = first_reader(cgraph, at, end);
        if (user < 0) {
            continue;
        }
        // The matvec as the ADD reads it: itself, or a RESHAPE of it that keeps its rows, read once.
        const ggml_tensor * value = mm;
        if (cgraph->nodes[user]->op == GGML_OP_RESHAPE) {
            const ggml_tensor * reshape = cgraph->nodes[user];
            // (ggml_node_has_n_uses refuses every view; the matvec's own single use is the RESHAPE.)
            if (reshape->ne[0] != mm->ne[0] || !ggml_is_contiguous(mm) || !ggml_is_contiguous(reshape) ||
                ggml_node_get_use_count(cgraph, user) != 1 || (reshape->flags & GGML_TENSOR_FLAG_OUTPUT)) {
                continue;
            }
            value = reshape;
            user  = first_reader(cgraph, user, end);
            if (user < 0) {
                continue;
            }
        }
        const ggml_tensor * add = cgraph->nodes[user];
        if (add->op != GGML_OP_ADD || (add->src[0] == value) == (add->src[1] == value)) {
            continue;
        }
        const ggml_tensor * residual = add->src[0] == value ? add->src[1] : add->src[0];
        if (value != mm && residual->op == GGML_OP_NONE) {
            // Through a RESHAPE, a residual stream only (a computed value): a Gated DeltaNet
            // layer's alpha also reaches ADD(., dt bias) through one, inside GDN's block.
            continue;
        }
        if (residual->type != GGML_TYPE_F32 || !ggml_are_same_shape(residual, value) || residual->nb[0] != sizeof(float) ||
            residual->data == nullptr || is_pack_node(cgraph, pack, residual) || add->type != GGML_TYPE_F32 ||
            !ggml_are_same_shape(add, value) || add->nb[0] != sizeof(float) || (add->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            continue;
        }
        flashrt_gemv_pack with = pack;
        with.nodes[with.n++] = user;
        std::sort(with.nodes, with.nodes + with.n);
        bool safe = epilogue_out_safe(cgraph, i, with, user, x) && residual_ready(cgraph, i, with, user, residual);
        for (int q = 0; q < with.n && safe; ++q) {
            const ggml_tensor * t = cgraph->nodes[with.nodes[q]];
            if (t->op == GGML_OP_ADD && with.nodes[q] != user) {  // the ones added before still hold
                safe = epilogue_out_safe(cgraph, i, with, with.nodes[q], x) &&
                       residual_ready(cgraph, i, with, with.nodes[q],
                                      t->src[1 - add_matvec_src(cgraph, with, t)]);
            }
        }
        if (safe) {
            pack  = with;
            added = true;
        }
    }
    return added;
}

// The routed experts' down projection reads one input a slot. The shared expert's down projection
// right after it (the order MOE_TAIL sets: a dense matvec of the same width reading its own, already
// computed vector) joins its launch with that input (frt_gemv_segment::x) when the kernel takes it
// and the memory allows; otherwise the pack stays as it is.
static void add_own_input_matvec(const ggml_cgraph * cgraph, int i, const ggml_tensor * input,
                                 flashrt_gemv_pack & pack) {
    // GGML_FLASHRT_DOWN_PAIR=0: the shared expert's down projection keeps a launch of its own (to
    // bisect).
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_DOWN_PAIR", true);
    const ggml_tensor * anchor = cgraph->nodes[i];
    if (!enabled) {
        return;
    }
    if (!is_expert_matvec(anchor) || input->ne[1] == 1 || input->ne[2] != 1 || pack.n >= FRT_GEMV_MAX_SEGMENTS) {
        return;
    }
    const int j = flashrt_skip_views(cgraph, i + 1);  // nothing computed in between
    if (j >= cgraph->n_nodes || cgraph->nodes[j]->op != GGML_OP_MUL_MAT) {
        return;
    }
    const ggml_tensor * t   = cgraph->nodes[j];
    const ggml_tensor * own = segment_input(t);
    if (own->type != GGML_TYPE_F32 || own->ne[0] != input->ne[0] || ggml_nelements(own) != own->ne[0] ||
        !ggml_is_contiguous(own) || flashrt_gemv_segment_miss(t, own) != nullptr) {
        return;
    }
    ggml_type direct = GGML_TYPE_COUNT;
    for (int p = 0; p < pack.n; ++p) {
        joins_launch(cgraph->nodes[pack.nodes[p]]->src[0], &direct);
    }
    if (!joins_launch(t->src[0], &direct)) {
        return;
    }
    flashrt_gemv_pack with = pack;
    with.nodes[with.n++] = j;
    // Its output apart from the launch's inputs and outputs (and unused until j), and its input
    // apart from every output of the launch.
    if (flashrt_overlaps(t, input) || !flashrt_gemv_early_safe(cgraph, i, with, with.n - 1, own)) {
        return;
    }
    for (int p = 0; p < pack.n; ++p) {
        if (flashrt_overlaps(own, cgraph->nodes[pack.nodes[p]])) {
            return;
        }
    }
    if (kernel_miss(cgraph, with) == nullptr) {
        pack = with;
    }
}

// GGML_FLASHRT_DOWN_TAIL=1 (experiment): the FFN's tail right after the experts' down pair
// (MOE_TAIL's run, in the order that window sets) computed by the pair's launch
// (frt_gemv_args::tail) instead of a kernel of its own, when MOE_TAIL is on, its experts and shared
// expert are the pair's two outputs at one token (MOE_TAIL's predicate checks that its output
// overlaps those and the residual only element for element) and its output leaves alone everything
// the launch reads (other blocks may still read it when a group's tail is written). Otherwise the
// pack stays as it is. Off by default: the H200 trace has the fused launch slower than the two
// (bench/results/2026-12-01-a79dd2b-h200-down-tail-v2).
static void add_moe_tail(const ggml_cgraph * cgraph, const ggml_tensor * input, flashrt_gemv_pack & pack) {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_DOWN_TAIL", false);
    if (!enabled || !flashrt_window_enabled("MOE_TAIL") || pack.n != 2 || pack.there[0] || pack.there[1]) {
        return;
    }
    const ggml_tensor * down  = cgraph->nodes[pack.nodes[0]];
    const ggml_tensor * sdown = cgraph->nodes[pack.nodes[1]];
    if (!is_expert_matvec(down) || sdown->op != GGML_OP_MUL_MAT || segment_input(sdown) == input) {
        return;  // not the down pair (add_own_input_matvec)
    }
    const int            k = flashrt_skip_views(cgraph, pack.nodes[1] + 1);
    flashrt_moe_tail_run r;
    if (k >= cgraph->n_nodes || flashrt_moe_tail_run_at(cgraph, k, r) != nullptr || r.tokens != 1 ||
        r.experts != down || flashrt_view_base(r.shexp) != sdown || r.shexp->data != sdown->data ||
        (r.out->ne[0] + FRT_GEMV_TAIL_ROWS_A_COUNTER - 1) / FRT_GEMV_TAIL_ROWS_A_COUNTER >
            flashrt_counters_size(flashrt_counter_use::moe_tail)) {
        return;
    }
    for (const ggml_tensor * t : { down, sdown }) {
        for (int s = 0; s < GGML_MAX_SRC; ++s) {
            if (t->src[s] != nullptr && flashrt_overlaps(r.out, t->src[s])) {
                return;  // an input, a weight or the ids
            }
        }
    }
    flashrt_gemv_pack with = pack;
    with.tail              = k;
    with.n_tail_nodes      = 0;
    for (int t = k; t <= r.end; ++t) {
        if (flashrt_is_view(cgraph->nodes[t])) {
            continue;
        }
        if (pack.n - 1 + with.n_tail_nodes == FLASHRT_MAX_CLAIMED) {
            return;
        }
        with.tail_nodes[with.n_tail_nodes++] = t;
    }
    if (kernel_miss(cgraph, with) == nullptr) {
        pack = with;
    }
}

const char * flashrt_gemv_match_same_input(const ggml_cgraph * cgraph, int i, flashrt_gemv_fold fold,
                                           flashrt_gemv_pack & pack) {
    if (const char * miss = collect_same_input(cgraph, i, fold, pack)) {
        return miss;
    }
    // Later readers whose memory is lent out until their turn run there, in their own launch.
    const ggml_tensor * input = segment_input(cgraph->nodes[i]);
    flashrt_gemv_pack safe;
    int folded = 0;
    for (int p = 0; p < pack.n; ++p) {
        if (flashrt_gemv_early_safe(cgraph, i, pack, p, input)) {
            folded += is_expert_matvec(cgraph->nodes[pack.nodes[p]]) ? 0 : 1;
            safe.nodes[safe.n++] = pack.nodes[p];
        } else if (p == 0) {
            return "memory: the output overlaps the input or a weight";
        }
    }
    if (fold == flashrt_gemv_fold::experts && folded == 0) {
        return "memory: the shared expert's outputs are lent out until their turn";
    }
    pack = safe;
    add_own_input_matvec(cgraph, i, input, pack);
    add_moe_tail(cgraph, input, pack);
    // Gate/up pairs that feed SWIGLUs: the launch computes the SWIGLUs too, as stock fuses them.
    flashrt_gemv_pack with_glu = pack;
    const char *      glu_miss = add_glu_nodes(cgraph, i, input, with_glu);
    if (glu_miss == nullptr) {
        glu_miss = kernel_miss(cgraph, with_glu);
        if (glu_miss == nullptr) {
            pack = with_glu;
            return nullptr;
        }
    }
    if (flashrt_debug_enabled() && is_split_swiglu_reader(cgraph, pack)) {
        // On stderr: llama-bench and the server silence ggml's log.
        std::fprintf(stderr, "FlashRT: SwiGLU epilogue declined at node %d (%s): %s\n", i, cgraph->nodes[i]->name,
                     glu_miss);
    }
    // Residual adds after its matvecs: the launch adds them, as stock fuses them.
    flashrt_gemv_pack with_adds = pack;
    if (add_residual_adds(cgraph, i, input, with_adds) && kernel_miss(cgraph, with_adds) == nullptr) {
        pack = with_adds;
        return nullptr;
    }
    return kernel_miss(cgraph, pack);
}

const char * flashrt_gemv_match_routed(const ggml_cgraph * cgraph, int softmax, int j, flashrt_gemv_pack & pack) {
    const char * miss = nullptr;
    if (flashrt_window_enabled("SHEXP_FOLD")) {
        miss = flashrt_gemv_match_same_input(cgraph, j, flashrt_gemv_fold::experts, pack);
        if (miss != nullptr) {
            pack = flashrt_gemv_pack();  // as MATVEC then forms it
            miss = flashrt_gemv_match_same_input(cgraph, j, flashrt_gemv_fold::leave, pack);
        }
    } else {
        miss = flashrt_gemv_match_same_input(cgraph, j, flashrt_gemv_fold::none, pack);
    }
    if (miss != nullptr) {
        return miss;
    }
    pack.routing = softmax;
    frt_gemv_args a;
    fill_args(cgraph, pack, a);
    if (a.n_segments == 0 || a.route_logits == nullptr) {
        return "the experts' launch has no routed segment";
    }
    if (pack_kernel(cgraph, pack, a) != FRT_GEMV_KERNEL_EXACT) {
        return "the experts' launch is not on the exact kernel (the only one that routes)";
    }
    return kernel_miss(cgraph, pack);
}

const char * flashrt_gemv_norm_pack_window(const ggml_tensor * w) {
    const auto any = [w](std::initializer_list<const char *> parts) {
        for (const char * part : parts) {
            if (std::strstr(w->name, part) != nullptr) {
                return true;
            }
        }
        return false;
    };
    if (any({ "attn_qkv", "ssm_alpha", "ssm_beta", "ssm_ba", "attn_gate" })) {
        return "INPROJ";
    }
    if (any({ "attn_q.", "attn_k.", "attn_v." })) {
        return "ATTNQKV";
    }
    if (is_lm_head_weight(w)) {
        return "HEAD";
    }
    if (any({ "ffn_gate_inp" })) {  // the router, and ffn_gate_inp_shexp: the shared expert's gate vector
        return "ROUTER";
    }
    return nullptr;
}

bool flashrt_gemv_pack_reads(const ggml_cgraph * cgraph, const flashrt_gemv_pack & pack, const char * window) {
    for (int p = 0; p < pack.n; ++p) {
        const char * of = flashrt_gemv_norm_pack_window(cgraph->nodes[pack.nodes[p]]->src[0]);
        if (of != nullptr && std::strcmp(of, window) == 0) {
            return true;
        }
    }
    return false;
}
