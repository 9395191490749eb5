#pragma once

// The window registry: every window the overlay knows, as a table. A new window is one file in
// windows/ plus one row in registry.cu.

#include "common.cuh"

enum class flashrt_tier {
    safe,     // on by default, quality-neutral
    full,     // opt-in, may trade accuracy for speed
    archive,  // opt-in, kept for A/B comparisons
};

struct flashrt_match {
    int         n_nodes = 0;        // nodes the window covers, starting at the matched node
    const char * miss   = nullptr;  // on a miss: the first predicate that failed
};

struct flashrt_window {
    const char * name;  // switch key: GGML_FLASHRT_NO_<name>, FRT_<name>_SWAP
    flashrt_tier tier;
    int          min_cc;  // lowest compute capability the kernels are built for (e.g. 900)
    flashrt_match (*match)(const ggml_cgraph * cgraph, int i);
    void (*run)(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
};

// The registered windows, in the order they are tried at each node.
const flashrt_window * flashrt_windows(int * n_windows);
