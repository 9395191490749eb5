// The node order the decode GEMV packs need (reorder.h says why): the dense matvecs that read one
// normed value (a Gated DeltaNet layer's input projections, an attention layer's q/k/v, the LM head,
// an MoE FFN's router and shared-expert gate vector) move right after it, so that ggml-alloc plans
// their outputs there and INPROJ, ATTNQKV, HEAD and ROUTER can compute them in one launch; the shared expert's gate vector moves right after the router
// (MATVEC: both F32, one launch) and its other matvecs right after the routed experts' gate/up,
// which SHEXP_FOLD serves them with, their SWIGLU right after them (the launch writes it). Only for
// those windows when they run, and only for values of one token (the windows' packs take one
// token): at 2-8 tokens (a server decoding several sequences) the moves would only split the
// gate/up/GLU runs that stock fuses into one kernel. With MOE_TAIL on, the shared expert's down
// projection moves right after the routed experts' (one token), so that the FFN's tail is one run
// of nodes. One exception: with GDN on, a Gated DeltaNet
// layer's input projections move at up to 8 tokens too (stock's kernels run them there), so that
// the layer's block is one run of nodes for GDN. Stock's order otherwise.

#include "diagnostics.cuh"
#include "flashrt.cuh"
#include "registry.cuh"
#include "reorder.h"
#include "windows/gemv-pack.cuh"

#include <chrono>
#include <cstring>
#include <unordered_map>
#include <vector>

// The tensor a chain of reshapes and views shows (memory is not planned yet: no data pointers).
static const ggml_tensor * underlying(const ggml_tensor * t) {
    while ((t->op == GGML_OP_RESHAPE || t->op == GGML_OP_VIEW) && t->src[0] != nullptr) {
        t = t->src[0];
    }
    return t;
}

static void reorder_for_windows(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph) {
    const int  cc     = ggml_cuda_info().devices[ctx.device].cc;
    const bool fold   = flashrt_window_runs("SHEXP_FOLD", cc);
    const bool matvec = flashrt_window_runs("MATVEC", cc);
    const bool gdn    = flashrt_window_runs("GDN", cc);
    const bool tail   = flashrt_window_runs("MOE_TAIL", cc);
    if (!flashrt_window_runs("INPROJ", cc) && !flashrt_window_runs("ATTNQKV", cc) &&
        !flashrt_window_runs("HEAD", cc) && !flashrt_window_runs("ROUTER", cc) && !fold && !matvec && !gdn && !tail) {
        return;
    }
    const int n = cgraph->n_nodes;
    std::vector<flashrt_pull_group> groups;
    // The dense matvecs of `input` within a few hundred nodes after node `after` (a layer's
    // readers of a value lie within ~50) that `joins` takes: they follow `after`.
    const auto pull = [&](int after, const ggml_tensor * input, auto joins) {
        flashrt_pull_group group{ after, {} };
        for (int j = after + 1; j < n && j <= after + 400; ++j) {
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op == GGML_OP_MUL_MAT && t->src[1] == input && joins(t->src[0])) {
                group.members.push_back(j);
            }
        }
        if (!group.members.empty()) {
            groups.push_back(std::move(group));
        }
    };
    // The SWIGLUs of a gate and an up among the group's members go right after them: planned at
    // its node, the shared expert's SWIGLU took memory that the routed experts' values free (their
    // SwiGLU, after the down projection reads it), so the pack could not write it early (the
    // SwiGLU epilogue declined, 80 separate GLU launches a step where stock has 30).
    const auto follow_with_swiglus = [&](flashrt_pull_group & group) {
        const auto member = [&](const ggml_tensor * src) {
            for (int m : group.members) {
                if (cgraph->nodes[m] == src) {
                    return true;
                }
            }
            return false;
        };
        const int last = group.members.back();
        for (int j = last + 1; j < n && j <= group.after + 400; ++j) {
            const ggml_tensor * t = cgraph->nodes[j];
            if (t->op == GGML_OP_GLU && ggml_get_glu_op(t) == GGML_GLU_OP_SWIGLU && t->src[1] != nullptr &&
                member(t->src[0]) && member(t->src[1])) {
                group.members.push_back(j);
            }
        }
    };
    const auto named = [](const ggml_tensor * w, const char * part) { return std::strstr(w->name, part) != nullptr; };
    const auto one_token = [](const ggml_tensor * v) { return v->ne[1] == 1 && v->ne[2] == 1 && v->ne[3] == 1; };
    const auto few_tokens = [](const ggml_tensor * v) { return v->ne[1] <= 8 && v->ne[2] == 1 && v->ne[3] == 1; };
    for (int i = 0; i < n; ++i) {
        const ggml_tensor * t = cgraph->nodes[i];
        if (t->op == GGML_OP_MUL && i > 0 && cgraph->nodes[i - 1]->op == GGML_OP_RMS_NORM &&
            (t->src[0] == cgraph->nodes[i - 1] || t->src[1] == cgraph->nodes[i - 1]) &&
            (one_token(t) || (gdn && few_tokens(t)))) {
            // RMS_NORM, then its weight MUL: the projections of the normed value.
            const bool packs = one_token(t);
            pull(i, t, [cc, packs, gdn](const ggml_tensor * w) {
                const char * window = flashrt_gemv_norm_pack_window(w);
                return window != nullptr && ((packs && flashrt_window_runs(window, cc)) ||
                                             (gdn && std::strcmp(window, "INPROJ") == 0));
            });
        } else if (matvec && t->op == GGML_OP_MUL_MAT && named(t->src[0], "ffn_gate_inp.") && one_token(t->src[1])) {
            // The router, then the shared expert's gate vector (the same input, the same F32 type).
            pull(i, t->src[1], [&](const ggml_tensor * w) { return named(w, "ffn_gate_inp_shexp"); });
        } else if (fold && t->op == GGML_OP_MUL_MAT_ID && t->src[2]->ne[1] == 1) {  // ids: [n_used, tokens]
            // The routed experts' gate/up (of one token's vector V), then the shared expert's dense
            // matvecs of V (its gate vector goes with the router above when MATVEC runs).
            pull(i, underlying(t->src[1]), [&](const ggml_tensor * w) {
                return named(w, "_shexp") && !(matvec && named(w, "ffn_gate_inp_shexp"));
            });
            if (!groups.empty() && groups.back().after == i) {
                follow_with_swiglus(groups.back());
            }
        }
        if (tail && t->op == GGML_OP_MUL_MAT_ID && named(t->src[0], "ffn_down_exps") && t->src[2]->ne[1] == 1) {
            // The shared expert's down projection right after the routed experts' (its input is
            // ready there when SHEXP_FOLD moved its SwiGLU up), out of the way of MOE_TAIL's run.
            flashrt_pull_group group{ i, {} };
            for (int j = i + 1; j < n && j <= i + 400; ++j) {
                const ggml_tensor * d = cgraph->nodes[j];
                if (d->op == GGML_OP_MUL_MAT && named(d->src[0], "ffn_down_shexp")) {
                    group.members.push_back(j);
                    break;
                }
            }
            if (!group.members.empty()) {
                groups.push_back(std::move(group));
            }
        }
    }
    if (groups.empty()) {
        return;
    }
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
    const std::vector<int>      order = flashrt_pull_forward(srcs, groups);
    std::vector<ggml_tensor *> nodes(cgraph->nodes, cgraph->nodes + n);
    for (int k = 0; k < n; ++k) {
        cgraph->nodes[k] = nodes[order[k]];
    }
}

// Timed for FRT_STATS: ggml's scheduler calls it on every graph it plans, on the host between two
// decode steps, unless llama.cpp reuses the step's graph as it stands.
void ggml_cuda_flashrt_graph_optimize(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph) {
    const auto start = std::chrono::steady_clock::now();
    reorder_for_windows(ctx, cgraph);
    flashrt_stats & stats = flashrt_global_stats();
    stats.orders++;
    stats.order_ns += (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count();
}
