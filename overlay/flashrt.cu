#include "flashrt.cuh"
#include "counters.cuh"
#include "fa4.cuh"
#include "diagnostics.cuh"
#include "graph-signature.h"
#include "registry.cuh"
#include "repack.cuh"
#include "windows/attn-decode.cuh"
#include "windows/gdn.cuh"
#include "windows/prefill-fa4.cuh"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <vector>

extern char ** environ;

// Each window's switch, resolved once per process.
struct flashrt_window_state {
    const flashrt_window * window;
    int                    index;
    bool                   enabled;
};

struct flashrt_runtime_state {
    bool                      disabled = false;
    std::vector<flashrt_window_state> windows;
};

static const char * getenv_lookup(const char * name, void *) {
    return std::getenv(name);
}

static const flashrt_runtime_state & runtime() {
    static const flashrt_runtime_state state = [] {
        flashrt_runtime_state s;
        std::vector<std::string> warnings;
        s.disabled = flashrt_layer_disabled(getenv_lookup, nullptr, warnings);
        int n_windows = 0;
        const flashrt_window * windows = flashrt_windows(&n_windows);
        GGML_ASSERT(n_windows <= FLASHRT_MAX_WINDOWS);
        std::vector<std::string> names;
        for (int w = 0; w < n_windows; ++w) {
            const flashrt_switch sw = flashrt_window_switch(windows[w].name, windows[w].tier, getenv_lookup, nullptr, warnings);
            s.windows.push_back({ &windows[w], w, sw.enabled && !s.disabled });
            names.push_back(windows[w].name);
            if (flashrt_debug_enabled()) {
                GGML_LOG_INFO("FlashRT: window %s (%s) %s: %s\n", windows[w].name, flashrt_tier_name(windows[w].tier),
                              sw.enabled ? "on" : "off", sw.reason.c_str());
            }
        }
        if (flashrt_debug_enabled()) {
            GGML_LOG_INFO("FlashRT: %s\n", frt_fa4_summary());
        }
        std::vector<std::string> environment;
        for (char ** e = environ; e && *e; ++e) {
            environment.emplace_back(*e);
        }
        for (const std::string & key : flashrt_unknown_switches(environment, names)) {
            warnings.push_back(key + " names no FlashRT window; ignored");
        }
        for (const std::string & w : warnings) {
            GGML_LOG_WARN("FlashRT: %s\n", w.c_str());
        }
        return s;
    }();
    return state;
}

static const flashrt_window_state * window_named(const char * name) {
    for (const flashrt_window_state & ws : runtime().windows) {
        if (std::strcmp(ws.window->name, name) == 0) {
            return &ws;
        }
    }
    return nullptr;
}

bool flashrt_window_enabled(const char * name) {
    const flashrt_window_state * ws = window_named(name);
    return ws != nullptr && ws->enabled;
}

bool flashrt_multi_token_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_MULTI_TOKEN", true);
    return enabled;
}

bool flashrt_window_runs(const char * name, int cc) {
    const flashrt_window_state * ws = window_named(name);
    return ws != nullptr && ws->enabled && cc >= ws->window->min_cc;
}

static uint64_t elapsed_ns(std::chrono::steady_clock::time_point start) {
    return (uint64_t) std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
        .count();
}

// Calls f; under FRT_STATS adds its host time to `total`.
template <typename F> static void timed(std::atomic<uint64_t> & total, F && f) {
    if (!flashrt_stats_enabled()) {
        f();
        return;
    }
    const auto start = std::chrono::steady_clock::now();
    f();
    total += elapsed_ns(start);
}

// Whether match m at node i would cover or claim one of `taken` (ascending): nodes an earlier window
// of the pass claimed. That window computes them, or folds them into its launch and never writes
// their sources (an ADD's matvec), so a second window must not take them.
static bool covers_taken(const flashrt_match & m, int i, const std::vector<int> & taken) {
    const auto any_in = [&taken](int lo, int hi) {
        const auto it = std::lower_bound(taken.begin(), taken.end(), lo);
        return it != taken.end() && *it < hi;
    };
    if (m.deferred()) {
        return any_in(i, i + m.head) || any_in(m.run_at, m.run_at + m.tail);
    }
    if (any_in(i, i + m.n_nodes)) {
        return true;
    }
    for (int k = 0; k < m.n_claimed; ++k) {
        if (std::binary_search(taken.begin(), taken.end(), m.claimed[k])) {
            return true;
        }
    }
    return false;
}

// The enabled window that matches at node i for a device of compute capability cc, if any, and
// takes none of the nodes in `taken`.
static const flashrt_window_state * find_window(const ggml_cgraph * cgraph, int i, int cc, flashrt_match & m,
                                               bool report, const std::vector<int> & taken) {
    const ggml_op op = cgraph->nodes[i]->op;
    for (const flashrt_window_state & ws : runtime().windows) {
        if (!ws.enabled || cc < ws.window->min_cc || !flashrt_anchored_at(*ws.window, op)) {
            continue;
        }
        timed(flashrt_global_stats().match_ns[ws.index], [&] { m = ws.window->match(cgraph, i); });
        if (m.hit() && !taken.empty() && covers_taken(m, i, taken)) {
            m = flashrt_miss("a node of the run is claimed by an earlier window");
        }
        if (m.hit()) {
            return &ws;
        }
        if (report && m.miss != flashrt_miss_anchor) {
            GGML_LOG_INFO("FlashRT: node %d (%s %s): %s missed: %s\n", i, ggml_op_desc(cgraph->nodes[i]),
                          cgraph->nodes[i]->name, ws.window->name, m.miss);
        }
    }
    return nullptr;
}

// For the dump: the window covering each node, as the node loop would run them.
static std::vector<const char *> dump_labels(const ggml_cgraph * cgraph) {
    std::vector<const char *> labels(cgraph->n_nodes, nullptr);
    for (int i = 0; i < cgraph->n_nodes; ++i) {
        const ggml_tensor * t = cgraph->nodes[i];
        if (labels[i] != nullptr || (t->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) {
            continue;
        }
        flashrt_match m;
        // Every registered window counts here, whatever the device: the dump describes the graph.
        const flashrt_window_state * ws = find_window(cgraph, i, INT_MAX, m, false, {});
        if (ws == nullptr) {
            continue;
        }
        const int head = m.deferred() ? m.head : m.n_nodes;
        for (int k = 0; k < head; ++k) {
            labels[i + k] = ws->window->name;
        }
        for (int k = 0; m.deferred() && k < m.tail; ++k) {
            labels[m.run_at + k] = ws->window->name;
        }
        for (int k = 0; k < m.n_claimed; ++k) {
            labels[m.claimed[k]] = ws->window->name;
        }
    }
    return labels;
}

// A deferred window between its match and its run (per thread: one node loop per thread).
struct flashrt_pending_window {
    const ggml_cgraph *  cgraph = nullptr;
    const flashrt_window_state * window = nullptr;
    int                  anchor = -1;
    flashrt_match        match;
};

// The graph's identity for the match cache and the prepared graphs (graph-signature.h).
static uint64_t graph_signature(const ggml_cgraph * cgraph) {
    return flashrt_graph_signature(cgraph->nodes, cgraph->n_nodes);
}

// How many graphs a context remembers as prepared, and a node-loop thread keeps the windows of:
// a server alternates a few batch shapes, each its own graph.
constexpr size_t flashrt_graphs_remembered = 8;

// The graphs each context prepared last. Never destroyed: a context may outlive static destructors.
struct flashrt_prepared_graphs {
    std::mutex                                                          mutex;
    std::map<const ggml_backend_cuda_context *, std::deque<uint64_t>> signatures;
};

static flashrt_prepared_graphs & prepared_graphs() {
    static flashrt_prepared_graphs * p = new flashrt_prepared_graphs;
    return *p;
}

// Whether ctx prepared this very graph recently (and remember it). The repack cache keeps what a
// preparation put in it, so a graph seen again needs none.
static bool already_prepared(const ggml_backend_cuda_context & ctx, uint64_t signature) {
    flashrt_prepared_graphs & p = prepared_graphs();
    std::lock_guard<std::mutex> lock(p.mutex);
    std::deque<uint64_t> & seen = p.signatures[&ctx];
    if (std::find(seen.begin(), seen.end(), signature) != seen.end()) {
        return true;
    }
    seen.push_front(signature);
    if (seen.size() > flashrt_graphs_remembered) {
        seen.pop_back();
    }
    return false;
}

// Whether a node-loop pass over this graph prepares each window it runs (the weights it reads
// repacked when the repack cache is on, GDN's flags, FA4's modules) just before running it: a pass
// that evaluates the graph directly, the first over it. Preparing allocates, converts and loads
// modules, which a capture may not hold, and ggml-cuda evaluates every graph directly before it
// captures it (its warm-up), so captures find their graph prepared. A capture that did not (its
// windows convert per use or read weights in place) leaves it to the next direct pass.
static bool prepares_windows(ggml_backend_cuda_context & ctx, uint64_t signature) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx.stream(), &capture) != cudaSuccess) {
        (void) cudaGetLastError();
        return false;
    }
    if (capture != cudaStreamCaptureStatusNone || already_prepared(ctx, signature)) {
        return false;
    }
    flashrt_global_stats().prepares++;
    return true;
}

// The signature of the graph the begin-graph hook saw last on this thread: the node loop that
// follows it (same thread, same graph) takes it instead of hashing every node again.
struct flashrt_begun_graph {
    const ggml_cgraph * cgraph    = nullptr;
    uint64_t            signature = 0;
};
static thread_local flashrt_begun_graph begun;

static std::atomic<uint64_t> evaluations{ 0 };

uint64_t flashrt_evaluation() {
    return evaluations.load();
}

bool ggml_cuda_flashrt_begin_graph(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, bool node_loop) {
    GGML_UNUSED(ctx);  // windows prepare in the node loop now
    flashrt_mark_graph_compute(node_loop);  // stock's calls too (GGML_FLASHRT_PERIODS)
    if (runtime().disabled) {
        return true;
    }
    flashrt_stats & stats = flashrt_global_stats();
    stats.begins++;
    flashrt_exact_trace_begin();  // outside any capture: it allocates
    // Only an opt-in window reads inputs on the host: decode replays pay nothing for this.
    static const bool prefill_fa4 = flashrt_window_enabled("PREFILL_FA4");
    const bool        uncaptured  = prefill_fa4 && flashrt_prefill_fa4_reads_host(cgraph);
    if (!node_loop && !uncaptured) {
        return true;
    }
    evaluations++;
    const auto start = std::chrono::steady_clock::now();
    flashrt_dump_graph(cgraph, dump_labels);
    begun = { cgraph, graph_signature(cgraph) };
    stats.begin_ns += elapsed_ns(start);
    return !uncaptured;
}

void ggml_cuda_flashrt_free_context(ggml_backend_cuda_context & ctx) {
    flashrt_exact_trace_write();
    flashrt_repack_free(ctx);
    flashrt_free_counters(ctx);
    flashrt_prepared_graphs & p = prepared_graphs();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.signatures.erase(&ctx);
}

static int try_window(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i);

// The windows a node-loop pass found in a graph, kept for later passes over the same graph:
// ggml-cuda captures anew whenever its graph changed (a server alternating batch shapes), and the
// predicates, functions of the graph alone, would find the same windows again.
// GGML_FLASHRT_MATCH_CACHE=0 asks the predicates at every pass.
struct flashrt_found_window {
    int                          node;
    const flashrt_window_state * window;
    flashrt_match                match;
};

struct flashrt_pass_windows {
    uint64_t                          signature = 0;
    std::vector<flashrt_found_window> found;  // by node, ascending
};

static bool match_cache_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_MATCH_CACHE", true);
    return enabled;
}

int ggml_cuda_flashrt_try_window(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    if (runtime().disabled) {
        return 0;
    }
    if (!flashrt_stats_enabled()) {
        return try_window(ctx, cgraph, i);
    }
    // Host time of the windows' predicates and launches, on every capture: decode pays it again
    // whenever ggml-cuda captures anew.
    const auto start    = std::chrono::steady_clock::now();
    const int  consumed = try_window(ctx, cgraph, i);
    flashrt_global_stats().loop_ns += elapsed_ns(start);
    return consumed;
}

static int try_window(ggml_backend_cuda_context & ctx, ggml_cgraph * cgraph, int i) {
    flashrt_stats & stats = flashrt_global_stats();
    // A new pass of the node loop starts when the index goes back (or the graph changes).
    thread_local const ggml_cgraph * pass_graph = nullptr;
    thread_local int pass_last = INT_MAX;
    thread_local flashrt_pending_window pending;
    // Nodes that windows of this pass claimed, ascending: computed already, or to be computed
    // when the loop gets there.
    struct claim {
        int                          node;
        const flashrt_window_state * window;
        int                          anchor;
        bool                         runs_there;
        flashrt_match                match;
        bool operator<(const claim & o) const { return node < o.node; }
    };
    thread_local std::vector<claim> claimed;
    // This pass's windows: found by the predicates and recorded, or replayed from an earlier pass
    // over the same graph (most recent graphs first).
    thread_local std::list<flashrt_pass_windows> passes;
    thread_local flashrt_pass_windows *          recording = nullptr;
    thread_local const flashrt_pass_windows *    replaying = nullptr;
    thread_local size_t                          cursor    = 0;
    thread_local bool                            preparing = false;
    const bool new_pass = cgraph != pass_graph || i <= pass_last;
    if (new_pass) {
        stats.graphs++;
        // Claimed nodes the loop did not reach were computed anyway: nothing is lost.
        claimed.clear();
        recording = nullptr;
        replaying = nullptr;
        cursor    = 0;
        const uint64_t signature = begun.cgraph == cgraph ? begun.signature : graph_signature(cgraph);
        preparing                = prepares_windows(ctx, signature);
        if (match_cache_enabled()) {
            auto seen = std::find_if(passes.begin(), passes.end(),
                                     [signature](const flashrt_pass_windows & p) { return p.signature == signature; });
            if (seen != passes.end()) {
                passes.splice(passes.begin(), passes, seen);
                replaying = &passes.front();
            } else {
                passes.push_front(flashrt_pass_windows{ signature, {} });
                if (passes.size() > flashrt_graphs_remembered) {
                    passes.pop_back();
                }
                recording = &passes.front();
            }
        }
    }
    pass_graph = cgraph;

    // Nodes a window claimed: done earlier in the pass, or computed now.
    while (!claimed.empty() && claimed.front().node < i) {
        if (claimed.front().runs_there) {
            // Skipped by the loop (a stock fusion took it): its result would be missing.
            GGML_ABORT("FlashRT window %s claimed node %d to compute there, which the node loop skipped",
                       claimed.front().window->window->name, claimed.front().node);
        }
        claimed.erase(claimed.begin());
    }
    if (!claimed.empty() && claimed.front().node == i) {
        const claim c = claimed.front();
        claimed.erase(claimed.begin());
        if (c.runs_there) {
            timed(stats.run_ns[c.window->index],
                  [&] { c.window->window->run_claimed(ctx, cgraph, c.anchor, c.match, i); });
        }
        stats.nodes++;
        stats.nodes_covered++;
        stats.covered[c.window->index]++;
        pass_last = i;
        return 1;
    }

    if (pending.window != nullptr) {
        if (new_pass || i > pending.match.run_at) {
            // The nodes it took were never computed: results would be wrong.
            GGML_ABORT("FlashRT window %s was deferred from node %d to node %d, which the node loop did not reach",
                       pending.window->window->name, pending.anchor, pending.match.run_at);
        }
        if (i < pending.match.run_at) {
            // Nodes in between run on stock kernels; no other window starts meanwhile.
            stats.nodes++;
            pass_last = i;
            return 0;
        }
        const flashrt_window_state * ws = pending.window;
        timed(stats.run_ns[ws->index], [&] { ws->window->run(ctx, cgraph, pending.anchor, pending.match); });
        const int tail = pending.match.tail;
        pending = flashrt_pending_window();
        stats.nodes += tail;
        stats.nodes_covered += tail;
        stats.covered[ws->index] += tail;
        pass_last = i + tail - 1;
        return tail;
    }

    flashrt_match                m;
    const flashrt_window_state * ws = nullptr;
    if (replaying != nullptr) {
        while (cursor < replaying->found.size() && replaying->found[cursor].node < i) {
            ++cursor;
        }
        if (cursor < replaying->found.size() && replaying->found[cursor].node == i) {
            ws = replaying->found[cursor].window;
            m  = replaying->found[cursor].match;
        }
    } else {
        const int cc = ggml_cuda_info().devices[ctx.device].cc;
        thread_local std::vector<int> taken;
        taken.clear();
        for (const claim & c : claimed) {
            taken.push_back(c.node);
        }
        ws = find_window(cgraph, i, cc, m, flashrt_debug_enabled(), taken);
        if (ws != nullptr && recording != nullptr) {
            recording->found.push_back({ i, ws, m });
        }
    }
    if (ws == nullptr) {
        stats.nodes++;
        pass_last = i;
        return 0;
    }
    stats.hits[ws->index]++;
    if (preparing && ws->window->prepare != nullptr) {
        ws->window->prepare(ctx, cgraph, i, m);
    }
    if (m.deferred()) {
        GGML_ASSERT(m.head >= 2 && m.tail >= 2 && m.run_at >= i + m.head && m.n_claimed == 0);
        pending.cgraph = cgraph;
        pending.window = ws;
        pending.anchor = i;
        pending.match = m;
        stats.nodes += m.head;
        stats.nodes_covered += m.head;
        stats.covered[ws->index] += m.head;
        pass_last = i + m.head - 1;
        return m.head;
    }
    timed(stats.run_ns[ws->index], [&] { ws->window->run(ctx, cgraph, i, m); });
    for (int k = 0; k < m.n_claimed; ++k) {
        GGML_ASSERT(m.claimed[k] >= i + m.n_nodes && (k == 0 || m.claimed[k] > m.claimed[k - 1]));
        GGML_ASSERT(!m.claimed_runs_there[k] || ws->window->run_claimed != nullptr);
        claimed.push_back({ m.claimed[k], ws, i, m.claimed_runs_there[k], m });
    }
    std::sort(claimed.begin(), claimed.end());
    stats.nodes += m.n_nodes;
    stats.nodes_covered += m.n_nodes;
    stats.covered[ws->index] += m.n_nodes;
    pass_last = i + m.n_nodes - 1;
    return m.n_nodes;
}
