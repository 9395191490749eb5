#include "diagnostics.cuh"
#include "fa4.cuh"
#include "gemv.cuh"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

bool flashrt_env_flag(const char * name, bool by_default) {
    const char * v = std::getenv(name);
    if (v == nullptr) {
        return by_default;
    }
    return by_default ? std::strcmp(v, "0") != 0 : std::strcmp(v, "1") == 0;
}

bool flashrt_debug_enabled() {
    static const bool enabled = flashrt_env_flag("GGML_FLASHRT_DEBUG", false);
    return enabled;
}

static std::FILE * launch_log() {
    static std::FILE * file = [] {
        const char * path = std::getenv("GGML_FLASHRT_LAUNCH_LOG");
        if (path == nullptr || *path == '\0') {
            return (std::FILE *) nullptr;
        }
        std::FILE * f = std::fopen(path, "a");
        if (f == nullptr) {
            std::fprintf(stderr, "FlashRT: cannot open GGML_FLASHRT_LAUNCH_LOG=%s for appending: no launch log\n", path);
        }
        return f;
    }();
    return file;
}

bool flashrt_launch_log_enabled() {
    return launch_log() != nullptr;
}

void flashrt_log_launch(const char * window, uint64_t bytes, const std::string & weights) {
    std::FILE * f = launch_log();
    if (f == nullptr) {
        return;
    }
    static std::mutex           mutex;
    std::lock_guard<std::mutex> lock(mutex);
    std::fprintf(f, "%llu\t%s\t%llu\t%s\n", (unsigned long long) flashrt_global_stats().graphs.load(), window,
                 (unsigned long long) bytes, weights.c_str());
    std::fflush(f);
}

bool flashrt_stats_enabled() {
    static const bool enabled = flashrt_env_flag("FRT_STATS", false);
    return enabled;
}

namespace {
// Prints the statistics when the process exits.
struct stats_at_exit {
    flashrt_stats stats;
    ~stats_at_exit() {
        if (!flashrt_stats_enabled()) {
            return;
        }
        const uint64_t nodes = stats.nodes.load();
        const uint64_t covered = stats.nodes_covered.load();
        std::fprintf(stderr, "FlashRT stats: %llu graph evaluation(s), %llu compute nodes, %llu covered by windows (%.1f%%)\n",
                     (unsigned long long) stats.graphs.load(), (unsigned long long) nodes, (unsigned long long) covered,
                     nodes ? 100.0 * covered / nodes : 0.0);
        const uint64_t graphs = stats.graphs.load();
        std::fprintf(stderr, "FlashRT stats: host time in the node-loop hook %.2f ms a graph evaluation\n",
                     graphs ? stats.loop_ns.load() / 1e6 / graphs : 0.0);
        const uint64_t begins = stats.begins.load();
        std::fprintf(stderr, "FlashRT stats: %llu graph compute call(s), host time in the begin-graph hook %.1f us a "
                     "call (replays take none); %llu node-loop pass(es) prepared the windows (a graph's first direct one)\n",
                     (unsigned long long) begins, begins ? stats.begin_ns.load() / 1e3 / begins : 0.0,
                     (unsigned long long) stats.prepares.load());
        const uint64_t orders = stats.orders.load();
        std::fprintf(stderr, "FlashRT stats: graph order: %llu graph(s) planned by ggml's scheduler, host time in the "
                     "windows' node order %.1f us a graph (between decode steps; none where llama.cpp reuses a graph)\n",
                     (unsigned long long) orders, orders ? stats.order_ns.load() / 1e3 / orders : 0.0);
        int n_windows = 0;
        const flashrt_window * windows = flashrt_windows(&n_windows);
        // Host time per window and graph evaluation: where the node-loop hook's time goes.
        const auto per_graph_us = [graphs](const std::atomic<uint64_t> & ns) {
            return graphs ? ns.load() / 1e3 / graphs : 0.0;
        };
        for (int w = 0; w < n_windows && w < FLASHRT_MAX_WINDOWS; ++w) {
            std::fprintf(stderr, "FlashRT stats:   %-24s hits %8llu  nodes %8llu  predicate %8.1f us  run %8.1f us a graph evaluation\n",
                         windows[w].name, (unsigned long long) stats.hits[w].load(),
                         (unsigned long long) stats.covered[w].load(), per_graph_us(stats.match_ns[w]),
                         per_graph_us(stats.run_ns[w]));
        }
        std::fprintf(stderr, "FlashRT stats: repack cache %llu tensor(s), %.2f MiB; %llu conversion(s) per use; "
                     "%llu tensor(s), %.2f MiB refused (device memory short)\n",
                     (unsigned long long) stats.repack_tensors.load(), stats.repack_bytes.load() / (1024.0 * 1024.0),
                     (unsigned long long) stats.repack_per_use.load(), (unsigned long long) stats.repack_refused.load(),
                     stats.repack_refused_bytes.load() / (1024.0 * 1024.0));
        std::fprintf(stderr, "FlashRT stats: norm handoff: %llu GEMV launch(es) took their input normed and quantized "
                     "by the kernel before (GGML_FLASHRT_NORM_HANDOFF=0: off)\n",
                     (unsigned long long) stats.handoffs.load());
        std::fprintf(stderr, "FlashRT stats: attention gate: %llu ATTN_DECODE launch(es) applied the output gate "
                     "(GGML_FLASHRT_ATTN_GATE=0: off)\n",
                     (unsigned long long) stats.attn_gates.load());
        std::fprintf(stderr, "FlashRT stats: %s\n", frt_fa4_summary());
        std::fprintf(stderr, "FlashRT stats: counts are per captured graph; CUDA graph replays reuse them\n");
    }
};
}  // namespace

flashrt_stats & flashrt_global_stats() {
    static stats_at_exit holder;
    return holder.stats;
}

static std::string shape_of(const ggml_tensor * t) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%s[%lld,%lld,%lld,%lld]", ggml_type_name(t->type), (long long) t->ne[0],
                  (long long) t->ne[1], (long long) t->ne[2], (long long) t->ne[3]);
    return buf;
}

void flashrt_dump_graph(const ggml_cgraph * cgraph,
                        std::vector<const char *> (*labels)(const ggml_cgraph * cgraph)) {
    static const char * path = std::getenv("GGML_FLASHRT_DUMP");
    if (path == nullptr || *path == '\0') {
        return;
    }
    static const int max_graphs = [] {
        const char * v = std::getenv("GGML_FLASHRT_DUMP_MAX");
        return v ? std::atoi(v) : 4;
    }();
    static std::mutex mutex;
    static int written = 0;
    std::lock_guard<std::mutex> lock(mutex);
    if (written >= max_graphs) {
        return;
    }
    FILE * f = std::fopen(path, written == 0 ? "w" : "a");
    if (f == nullptr) {
        GGML_LOG_WARN("FlashRT: cannot write GGML_FLASHRT_DUMP=%s\n", path);
        written = max_graphs;
        return;
    }
    const std::vector<const char *> windows = labels(cgraph);
    // Tab-separated, one node a line; read by `cargo xtask coverage`.
    std::fprintf(f, "#graph\t%d\tnodes\t%d\n", written, cgraph->n_nodes);
    std::fprintf(f, "#index\top\tname\tshape\twindow\tsources\n");
    for (int i = 0; i < cgraph->n_nodes; ++i) {
        const ggml_tensor * t = cgraph->nodes[i];
        std::string sources;
        for (int s = 0; s < GGML_MAX_SRC && t->src[s]; ++s) {
            sources += (s ? ";" : "") + shape_of(t->src[s]) + ":" + t->src[s]->name;
        }
        std::fprintf(f, "%d\t%s\t%s\t%s\t%s\t%s\n", i, ggml_op_desc(t), t->name, shape_of(t).c_str(),
                     windows[i] ? windows[i] : "-", sources.c_str());
    }
    std::fclose(f);
    ++written;
}

namespace {
struct period_marks {
    const char *                         path = nullptr;
    std::mutex                           mutex;
    std::vector<std::pair<int64_t, int>> marks;

    period_marks() {
        const char * p = std::getenv("GGML_FLASHRT_PERIODS");
        if (p != nullptr && *p != '\0') {
            path = p;
            marks.reserve(1 << 16);
        }
    }

    ~period_marks() {
        if (path == nullptr) {
            return;
        }
        std::FILE * f = std::fopen(path, "w");
        if (f == nullptr) {
            std::fprintf(stderr, "FlashRT: cannot write GGML_FLASHRT_PERIODS=%s\n", path);
            return;
        }
        std::fprintf(f, "# flashrt-periods 1\n");
        for (const auto & [ns, node_loop] : marks) {
            std::fprintf(f, "%lld %d\n", (long long) ns, node_loop);
        }
        std::fclose(f);
    }
};

period_marks & periods() {
    static period_marks p;
    return p;
}
}  // namespace

void flashrt_mark_graph_compute(bool node_loop) {
    period_marks & p = periods();
    if (p.path == nullptr) {
        return;
    }
    const int64_t ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.marks.emplace_back(ns, node_loop ? 1 : 0);
}

namespace {
struct exact_trace_state {
    std::mutex                                           mutex;
    bool                                                 started = false, on = false;
    std::map<uintptr_t, std::pair<std::string, std::string>> names;  // first segment's weights -> window, weights
};

exact_trace_state & exact_trace() {
    static exact_trace_state state;
    return state;
}

const char * exact_trace_path() {
    static const char * path = std::getenv("GGML_FLASHRT_EXACT_TRACE");
    return path != nullptr && *path != '\0' ? path : nullptr;
}
}  // namespace

void flashrt_exact_trace_begin() {
    if (exact_trace_path() == nullptr) {
        return;
    }
    exact_trace_state &         t = exact_trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.started) {
        return;
    }
    t.started             = true;
    const cudaError_t err = frt_gemv_trace(1 << 19);
    t.on                  = err == cudaSuccess;
    if (!t.on) {
        GGML_LOG_WARN("FlashRT: GGML_FLASHRT_EXACT_TRACE: no trace (%s)\n", cudaGetErrorString(err));
    }
}

bool flashrt_exact_trace_on() {
    return exact_trace_path() != nullptr && exact_trace().on;
}

void flashrt_exact_trace_name(const void * w, const char * window, const std::string & weights) {
    exact_trace_state &         t = exact_trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.names[(uintptr_t) w] = { window, weights };
}

void flashrt_exact_trace_write() {
    if (!flashrt_exact_trace_on()) {
        return;
    }
    exact_trace_state &         t = exact_trace();
    std::lock_guard<std::mutex> lock(t.mutex);
    std::vector<frt_gemv_trace_record> records(1 << 19);
    int                                n   = 0;
    const cudaError_t                  err = frt_gemv_trace_records(records.data(), (int) records.size(), &n);
    if (err != cudaSuccess) {
        GGML_LOG_WARN("FlashRT: GGML_FLASHRT_EXACT_TRACE: cannot read the trace (%s)\n", cudaGetErrorString(err));
        return;
    }
    std::FILE * f = std::fopen(exact_trace_path(), "w");
    if (f == nullptr) {
        GGML_LOG_WARN("FlashRT: cannot write GGML_FLASHRT_EXACT_TRACE=%s\n", exact_trace_path());
        return;
    }
    std::fprintf(f, "#launch\ttag\twindow\tweights\n");
    for (const auto & [tag, name] : t.names) {
        std::fprintf(f, "launch\t%llx\t%s\t%s\n", (unsigned long long) tag, name.first.c_str(), name.second.c_str());
    }
    std::fprintf(f, "#block\ttag\tblock\tgrid\tsm\tkind\tstart_ns\tend_ns\twaited\tissued\tnormed\tprologue\t"
                    "landed\tproducts\tstored\n");
    for (int i = 0; i < n; ++i) {
        const frt_gemv_trace_record & r = records[i];
        std::fprintf(f, "block\t%llx\t%u\t%u\t%u\t%u\t%llu\t%llu\t%u\t%u\t%u\t%u\t%u\t%u\t%u\n",
                     (unsigned long long) r.tag, (unsigned) r.block, (unsigned) r.grid, r.sm, r.kind,
                     (unsigned long long) r.start_ns, (unsigned long long) r.end_ns, r.waited, r.issued, r.normed,
                     r.prologue, r.landed, r.products, r.stored);
    }
    std::fclose(f);
}
