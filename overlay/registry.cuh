#pragma once

// The window registry: every window the overlay knows, as a table (registry.cu). A new window is
// one file in windows/ plus one row there.

#include "common.cuh"
#include "switches.h"

// What a window's predicate found at node i.
//
// Most windows cover a contiguous run [i, i + n_nodes) and run at i. Some inputs of a window are
// produced by unrelated nodes that the graph places inside the run (qwen35moe computes z between
// the norm and its gate): such a window is deferred. Its first `head` nodes are taken at i and
// not computed, the nodes in between run on stock kernels, and the window runs at `run_at`,
// taking `tail` nodes from there. The predicate must prove that nothing in between reads the
// head's results or overwrites the window's inputs.
//
// An immediate window may also compute nodes further on, out of the run (the matmuls of a layer
// that read one normed input sit between other nodes): it claims them, and the node loop skips
// them when it gets there. The predicate must prove that no node between the run and a claimed
// node reads or writes the claimed node's memory (the allocator may lend it to them, since in
// graph order it is not yet live).
// (24: the experts' down launch with the shared expert's and the FFN's tail, 16 experts a token.)
constexpr int FLASHRT_MAX_CLAIMED = 24;

struct flashrt_match {
    int          n_nodes = 0;        // immediate: nodes covered from i (>= 1 on a hit)
    const char * miss    = nullptr;  // on a miss: the first predicate that failed
    int          run_at  = -1;       // deferred: the node where the window runs (> i)
    int          head    = 0;        // deferred: nodes taken at i (>= 2)
    int          tail    = 0;        // deferred: nodes taken at run_at (>= 2)
    int          n_claimed = 0;      // immediate: later nodes this window computes, ascending,
    int          claimed[FLASHRT_MAX_CLAIMED] = {};  // each >= i + n_nodes
    // Per claimed node: false, computed by the run at i; true, computed when the loop reaches it,
    // by the window's run_claimed (its output's memory is lent to nodes in between until then).
    bool         claimed_runs_there[FLASHRT_MAX_CLAIMED] = {};
    // Immediate: the first node of a run of another window's nodes that this window's launch
    // computes besides its own (MATVEC: MOE_TAIL's, in the experts' down launch), or -1; those of
    // its nodes that launch anything are claimed.
    int          fused_run = -1;

    bool hit() const { return miss == nullptr && (deferred() || n_nodes >= 1); }
    bool deferred() const { return run_at >= 0; }
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

inline flashrt_match flashrt_hit_deferred(int head, int run_at, int tail) {
    flashrt_match m;
    m.head   = head;
    m.run_at = run_at;
    m.tail   = tail;
    return m;
}

struct flashrt_window {
    const char * name;    // switch key: GGML_FLASHRT_NO_<name>, FRT_<name>_SWAP
    flashrt_tier tier;
    int          min_cc;  // lowest compute capability its kernels are built for (ggml's numbering, 900 = sm_90)
    // The ops its match can start at (GGML_OP_COUNT: none): the node loop asks the predicate only
    // there, since it runs at every node of every uncaptured evaluation.
    ggml_op      anchors[2];
    flashrt_match (*match)(const ggml_cgraph * cgraph, int i);
    // Runs the matched nodes on ctx.stream() (i is the node the match was made at, also when
    // deferred); capture-safe: no sync, no allocation outside ctx.pool().
    void (*run)(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m);
    // Optional (nullptr: nothing to prepare). Called just before the window's run in the first
    // node-loop pass over a graph that is evaluated directly (never under capture): fills the repack
    // cache with the weights run reads, allocates or loads what run needs. run must still work
    // unprepared (a capture of a graph never evaluated directly): per-use conversion, or stock.
    void (*prepare)(ggml_backend_cuda_context & ctx, const ggml_cgraph * cgraph, int i, const flashrt_match & m);
    // Optional (nullptr: the window never sets claimed_runs_there). Computes claimed node `node` of
    // the match made at node i, when the node loop reaches it. Capture-safe, like run.
    void (*run_claimed)(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i, const flashrt_match & m,
                        int node) = nullptr;
};

// The registered windows, in the order they are tried at each node.
const flashrt_window * flashrt_windows(int * n_windows);

// Whether a node of op `op` is one a window's match can start at (its anchors).
inline bool flashrt_anchored_at(const flashrt_window & w, ggml_op op) {
    return op == w.anchors[0] || op == w.anchors[1];
}

// Whether the window called `name` is on in this process (switches and tier; false when the layer
// is disabled or no window has that name). For windows whose predicates leave nodes to another.
bool flashrt_window_enabled(const char * name);

// Whether the decode windows that take several sequences or tokens a step (GDN, ATTN_ROPE,
// ATTN_DECODE) take
// them: on unless GGML_FLASHRT_MULTI_TOKEN=0, which leaves a server's batched steps to stock (to
// measure them against it: bench/device/diagnose.sh multiseq).
bool flashrt_multi_token_enabled();

// The graph evaluation under way: increases at each begin-graph hook that runs the node loop (a
// capture or an evaluation without one). For per-evaluation caches of what a window reads from the
// device (PREFILL_FA4's mask check).
uint64_t flashrt_evaluation();

// Whether the window called `name` is on and runs on a device of compute capability cc.
bool flashrt_window_runs(const char * name, int cc);
