#pragma once

// The window registry: every window the overlay knows, as a table (registry.cu). A new window is
// one file in windows/ plus one row there.

#include "common.cuh"
#include "switches.h"

// What a window's predicate found at a node.
struct flashrt_match {
    int          n_nodes = 0;        // nodes covered, starting at the matched node (>= 2 on a hit)
    const char * miss    = nullptr;  // on a miss: the first predicate that failed
    bool hit() const { return miss == nullptr && n_nodes >= 2; }
};

// Miss reason of a window whose first node is not even the right op: the common case, never
// printed by GGML_FLASHRT_DEBUG.
extern const char * const flashrt_miss_anchor;

inline flashrt_match flashrt_miss(const char * reason) {
    flashrt_match m;
    m.miss = reason;
    return m;
}

inline flashrt_match flashrt_hit(int n_nodes) {
    flashrt_match m;
    m.n_nodes = n_nodes;
    return m;
}

struct flashrt_window {
    const char * name;    // switch key: GGML_FLASHRT_NO_<name>, FRT_<name>_SWAP
    flashrt_tier tier;
    int          min_cc;  // lowest compute capability its kernels are built for (ggml's numbering, 900 = sm_90)
    flashrt_match (*match)(const ggml_cgraph * cgraph, int i);
    // Runs the matched nodes on ctx.stream(); capture-safe (no sync, no allocation outside ctx.pool()).
    void (*run)(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
};

// The registered windows, in the order they are tried at each node.
const flashrt_window * flashrt_windows(int * n_windows);
