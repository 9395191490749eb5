#pragma once

// Helpers shared by the window predicates.

#include "../registry.cuh"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

// Nodes that launch nothing (ggml-cuda skips them too).
inline bool flashrt_is_view(const ggml_tensor * t) {
    return ggml_is_empty(t) || t->op == GGML_OP_NONE || t->op == GGML_OP_RESHAPE || t->op == GGML_OP_VIEW ||
           t->op == GGML_OP_PERMUTE || t->op == GGML_OP_TRANSPOSE;
}

// The tensor a view looks into (ggml keeps view_src pointing at a tensor that is not a view), or
// the tensor itself.
inline const ggml_tensor * flashrt_view_base(const ggml_tensor * t) {
    return t->view_src != nullptr ? t->view_src : t;
}

// A leaf: a model weight or an input copied in before the graph, which no kernel writes; a kernel
// may read it before its wait for the previous one.
inline bool flashrt_is_constant_leaf(const ggml_tensor * t) {
    return t->op == GGML_OP_NONE && t->view_src == nullptr;
}

// The first node at or after `i` that is not a view (at most 4 views are skipped).
inline int flashrt_skip_views(const ggml_cgraph * cgraph, int i) {
    int k = i;
    while (k < cgraph->n_nodes && k - i < 4 && flashrt_is_view(cgraph->nodes[k])) {
        ++k;
    }
    return k;
}

inline bool flashrt_overlaps(const ggml_tensor * a, const ggml_tensor * b) {
    const uintptr_t a0 = (uintptr_t) a->data, a1 = a0 + ggml_nbytes(a);
    const uintptr_t b0 = (uintptr_t) b->data, b1 = b0 + ggml_nbytes(b);
    return a0 < b1 && b0 < a1;
}

// Row-wise kernels may write in place over an input laid out exactly like the output.
inline bool flashrt_same_or_disjoint(const ggml_tensor * out, const ggml_tensor * in) {
    if (!flashrt_overlaps(out, in)) {
        return true;
    }
    for (int d = 0; d < GGML_MAX_DIMS; ++d) {
        if (out->nb[d] != in->nb[d] || out->ne[d] != in->ne[d]) {
            return false;
        }
    }
    return out->data == in->data;
}

// A failing CUDA call in a window aborts like stock ggml does, naming the window.
#define FLASHRT_CHECK(window, call)                                                              \
    do {                                                                                         \
        const cudaError_t flashrt_err_ = (call);                                                 \
        if (flashrt_err_ != cudaSuccess) {                                                       \
            GGML_ABORT("FlashRT window %s: %s (%s:%d)", window, cudaGetErrorString(flashrt_err_), \
                       __FILE__, __LINE__);                                                      \
        }                                                                                        \
    } while (0)

// What the nodes [first, last] of a run read, for flashrt_read_only_in_run: every source, sorted
// (a sorted list, not a hash map: predicates run at every uncaptured evaluation).
inline void flashrt_collect_run_reads(const ggml_cgraph * cgraph, int first, int last,
                                      std::vector<const ggml_tensor *> & reads) {
    reads.clear();
    for (int u = first; u <= last; ++u) {
        for (const ggml_tensor * src : cgraph->nodes[u]->src) {
            if (src != nullptr) {
                reads.push_back(src);
            }
        }
    }
    std::sort(reads.begin(), reads.end());
}

// Whether node j has all its uses (ggml's use counts) among `reads` (flashrt_collect_run_reads of
// a run): nothing after the run reads it.
inline bool flashrt_read_only_in_run(const ggml_cgraph * cgraph, int j, const std::vector<const ggml_tensor *> & reads) {
    const auto uses = std::equal_range(reads.begin(), reads.end(), cgraph->nodes[j]);
    return (int) (uses.second - uses.first) == ggml_node_get_use_count(cgraph, j);
}

// Whether a window may take the run [first, last] whole: every node is to be computed, and every
// node but the `kept` ones (the run's results) is neither a graph output nor read after the run.
// nullptr, or why not.
inline const char * flashrt_run_is_private(const ggml_cgraph * cgraph, int first, int last,
                                           std::initializer_list<const ggml_tensor *> kept) {
    for (int u = first; u <= last; ++u) {
        if ((cgraph->nodes[u]->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            return "a node of the run is not to be computed";
        }
    }
    thread_local std::vector<const ggml_tensor *> read_in_run;
    flashrt_collect_run_reads(cgraph, first, last, read_in_run);
    for (int u = first; u <= last; ++u) {
        const ggml_tensor * n = cgraph->nodes[u];
        if (std::find(kept.begin(), kept.end(), n) != kept.end()) {
            continue;
        }
        if ((n->flags & GGML_TENSOR_FLAG_OUTPUT) != 0 || !flashrt_read_only_in_run(cgraph, u, read_in_run)) {
            return "an intermediate value is read after the run";
        }
    }
    return nullptr;
}

// Float op parameter k of t (ggml keeps them as int32 words).
inline float flashrt_op_param_f32(const ggml_tensor * t, int k) {
    float v;
    std::memcpy(&v, (const int32_t *) t->op_params + k, sizeof(float));
    return v;
}

// Why FLASH_ATTN_EXT node fa is not plain attention the overlay's kernels take, or nullptr: F32 Q
// and output, F16 K and V, no sinks, ALiBi or softcap, one sequence stream.
inline const char * flashrt_plain_attention_miss(const ggml_tensor * fa) {
    const ggml_tensor * q = fa->src[0], *k = fa->src[1], *v = fa->src[2];
    if (q->type != GGML_TYPE_F32 || k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16 || fa->type != GGML_TYPE_F32) {
        return "types (F32 Q, F16 K and V, F32 output)";
    }
    if (fa->src[4] != nullptr || flashrt_op_param_f32(fa, 1) != 0.0f || flashrt_op_param_f32(fa, 2) != 0.0f) {
        return "attention sinks, ALiBi or a logit softcap";
    }
    if (q->ne[3] != 1 || k->ne[3] != 1 || v->ne[3] != 1) {
        return "more than one sequence stream";
    }
    return nullptr;
}
