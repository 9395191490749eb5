// The node order the decode GEMV packs need (reorder.h says why): the dense matvecs that read one
// normed value (a Gated DeltaNet layer's input projections, an attention layer's q/k/v, the LM head)
// move right after it, so that ggml-alloc plans their outputs there and INPROJ, ATTNQKV and HEAD
// can compute them in one launch; the shared expert's gate vector moves right after the router
// (MATVEC: both F32, one launch) and its other matvecs right after the routed experts' gate/up,
// which SHEXP_FOLD serves them with. Only for those windows when they run; stock's order
// otherwise.

#include "flashrt.cuh"
#include "registry.cuh"
#include "reorder.h"

#include "common.cuh"

#include <cstring>
#include <initializer_list>
#include <unordered_map>
#include <vector>

// The window whose pack the matvec with this weight would join (the names its predicate reads).
static const char * norm_pack_window(const ggml_tensor * w) {
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
    if (std::strcmp(w->name, "output.weight") == 0 || std::strcmp(w->name, "token_embd.weight") == 0) {
        return "HEAD";
    }
    return nullptr;
}

// The tensor a chain of reshapes and views shows (memory is not planned yet: no data pointers).
static const ggml_tensor * underlying(const ggml_tensor * t) {
    while ((t->op == GGML_OP_RESHAPE || t->op == GGML_OP_VIEW) && t->src[0] != nullptr) {
        t = t->src[0];
    }
    return t;
}

void ggml_cuda_flashrt_graph_optimize(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph) {
    const int  cc   = ggml_cuda_info().devices[ctx.device].cc;
    const bool fold   = flashrt_window_runs("SHEXP_FOLD", cc);
    const bool matvec = flashrt_window_runs("MATVEC", cc);
    if (!flashrt_window_runs("INPROJ", cc) && !flashrt_window_runs("ATTNQKV", cc) &&
        !flashrt_window_runs("HEAD", cc) && !fold && !matvec) {
        return;
    }
    const int n = cgraph->n_nodes;
    std::unordered_map<const ggml_tensor *, int> at;
    at.reserve(n);
    for (int i = 0; i < n; ++i) {
        at[cgraph->nodes[i]] = i;
    }
    // Sources among the nodes, through views too.
    std::vector<std::vector<int>> srcs(n);
    for (int i = 0; i < n; ++i) {
        for (int s = 0; s < GGML_MAX_SRC; ++s) {
            for (const ggml_tensor * t = cgraph->nodes[i]->src[s]; t != nullptr; t = t->view_src) {
                const auto it = at.find(t);
                if (it != at.end()) {
                    srcs[i].push_back(it->second);
                }
            }
        }
    }
    // RMS_NORM, then its weight MUL: the MUL's dense matvec readers follow it.
    std::vector<flashrt_pull_group> groups;
    for (int i = 0; i + 1 < n; ++i) {
        const ggml_tensor * norm = cgraph->nodes[i];
        const ggml_tensor * mul  = cgraph->nodes[i + 1];
        if (norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || (mul->src[0] != norm && mul->src[1] != norm)) {
            continue;
        }
        // A layer's readers of its normed value lie within a few hundred nodes (~45 in a Gated
        // DeltaNet layer): the bound keeps this pass linear in the graph.
        flashrt_pull_group group{ i + 1, {} };
        for (int j = i + 2; j < n && j < i + 2 + 400; ++j) {
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op != GGML_OP_MUL_MAT || t->src[1] != mul) {
                continue;
            }
            const char * window = norm_pack_window(t->src[0]);
            if (window != nullptr && flashrt_window_runs(window, cc)) {
                group.members.push_back(j);
            }
        }
        if (!group.members.empty()) {
            groups.push_back(std::move(group));
        }
    }
    // The router, then the shared expert's gate vector (the same input, the same F32 type).
    for (int i = 0; matvec && i < n; ++i) {
        const ggml_tensor * router = cgraph->nodes[i];
        if (router->op != GGML_OP_MUL_MAT || std::strstr(router->src[0]->name, "ffn_gate_inp.") == nullptr) {
            continue;
        }
        flashrt_pull_group group{ i, {} };
        for (int j = i + 1; j < n && j < i + 1 + 400; ++j) {
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op == GGML_OP_MUL_MAT && t->src[1] == router->src[1] &&
                std::strstr(t->src[0]->name, "ffn_gate_inp_shexp") != nullptr) {
                group.members.push_back(j);
            }
        }
        if (!group.members.empty()) {
            groups.push_back(std::move(group));
        }
    }
    // The routed experts' gate/up (MUL_MAT_ID of one token's vector V), then the shared expert's
    // dense matvecs of V (its gate vector goes with the router above when MATVEC runs).
    for (int i = 0; fold && i < n; ++i) {
        const ggml_tensor * experts = cgraph->nodes[i];
        if (experts->op != GGML_OP_MUL_MAT_ID) {
            continue;
        }
        const ggml_tensor * v = underlying(experts->src[1]);
        flashrt_pull_group  group{ i, {} };
        for (int j = i + 1; j < n && j < i + 1 + 400; ++j) {
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op == GGML_OP_MUL_MAT && t->src[1] == v && std::strstr(t->src[0]->name, "_shexp") != nullptr &&
                !(matvec && std::strstr(t->src[0]->name, "ffn_gate_inp_shexp") != nullptr)) {
                group.members.push_back(j);
            }
        }
        if (!group.members.empty()) {
            groups.push_back(std::move(group));
        }
    }
    if (groups.empty()) {
        return;
    }
    const std::vector<int>      order = flashrt_pull_forward(srcs, groups);
    std::vector<ggml_tensor *> nodes(cgraph->nodes, cgraph->nodes + n);
    for (int k = 0; k < n; ++k) {
        cgraph->nodes[k] = nodes[order[k]];
    }
}
