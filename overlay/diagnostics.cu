#include "diagnostics.cuh"
#include "fa4.cuh"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

static bool env_is_one(const char * name) {
    const char * v = std::getenv(name);
    return v != nullptr && std::strcmp(v, "1") == 0;
}

bool flashrt_debug_enabled() {
    static const bool enabled = env_is_one("GGML_FLASHRT_DEBUG");
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
    static const bool enabled = env_is_one("FRT_STATS");
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
