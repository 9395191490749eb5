#pragma once

// FlashRT diagnostics, all read once per process:
//   GGML_FLASHRT_DEBUG=1        why candidate windows missed, as graphs are evaluated
//   GGML_FLASHRT_DUMP=<file>    node sequences of the first GGML_FLASHRT_DUMP_MAX (default 4)
//                               computed graphs, with the window that covers each node
//   FRT_STATS=1                 at exit: per-window hits, nodes covered, total nodes, repack cache
//   GGML_FLASHRT_LAUNCH_LOG=<file>  the weight-reading launches windows make (flashrt_log_launch)
//   GGML_FLASHRT_EXACT_TRACE=<file> each exact GEMV block's phases in decode (frt_gemv_trace)
//   GGML_FLASHRT_PERIODS=<file>     the host time of every graph compute call (flashrt_mark_graph_compute)

#include "registry.cuh"

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

constexpr int FLASHRT_MAX_WINDOWS = 64;

struct flashrt_stats {
    std::atomic<uint64_t> graphs{ 0 };         // node-loop passes (captures or uncaptured evaluations)
    std::atomic<uint64_t> begins{ 0 };         // begin-graph hook calls (every graph compute, replays too)
    std::atomic<uint64_t> prepares{ 0 };       // node-loop passes that prepared the windows (a graph's first direct one)
    std::atomic<uint64_t> begin_ns{ 0 };       // host time in the begin-graph hook
    std::atomic<uint64_t> loop_ns{ 0 };        // host time in the node-loop hook (predicates, launches)
    std::atomic<uint64_t> nodes{ 0 };          // compute nodes those passes went through
    std::atomic<uint64_t> nodes_covered{ 0 };  // of which windows ran
    std::atomic<uint64_t> hits[FLASHRT_MAX_WINDOWS] = {};
    std::atomic<uint64_t> covered[FLASHRT_MAX_WINDOWS] = {};
    std::atomic<uint64_t> match_ns[FLASHRT_MAX_WINDOWS] = {};  // host time in each window's predicate
    std::atomic<uint64_t> run_ns[FLASHRT_MAX_WINDOWS] = {};    // and in its runs (planning, launches)
    std::atomic<uint64_t> repack_tensors{ 0 };  // weights put into the repack cache
    std::atomic<uint64_t> repack_bytes{ 0 };    // their size in the cache
    std::atomic<uint64_t> repack_per_use{ 0 };  // conversions made at run time instead (not cached)
    std::atomic<uint64_t> repack_refused{ 0 };  // weights not cached for want of free device memory
    std::atomic<uint64_t> repack_refused_bytes{ 0 };
    std::atomic<uint64_t> handoffs{ 0 };        // GEMV launches that took their input normed and quantized (x_q8)
    std::atomic<uint64_t> attn_gates{ 0 };      // ATTN_DECODE launches that applied the output gate
    std::atomic<uint64_t> orders{ 0 };          // graph_optimize calls (graphs ggml's scheduler planned)
    std::atomic<uint64_t> order_ns{ 0 };        // host time in them (the windows' node order)
};

bool flashrt_debug_enabled();

// A boolean switch in the environment: unset, `by_default`; set, on unless "0" when on by default,
// on only at "1" when off by default. Callers cache it (a static): the environment is read once.
bool flashrt_env_flag(const char * name, bool by_default);
bool flashrt_stats_enabled();
flashrt_stats & flashrt_global_stats();

// GGML_FLASHRT_LAUNCH_LOG=<file>: one line per weight-reading launch a window makes (during a
// capture or an uncaptured evaluation, never on replays): node-loop pass, window, bytes of
// weights read, the weights' tensor names (joined by ` / `), tab-separated. `cargo xtask profile`
// pairs them in order with the traced kernels of a step to rate each launch in TB/s.
bool flashrt_launch_log_enabled();
void flashrt_log_launch(const char * window, uint64_t bytes, const std::string & weights);

// Writes `cgraph` to the dump file if dumping is on and fewer than the maximum were written.
// `labels` names, for each node, the window that would take it (nullptr: stock).
void flashrt_dump_graph(const ggml_cgraph * cgraph,
                        std::vector<const char *> (*labels)(const ggml_cgraph * cgraph));

// GGML_FLASHRT_EXACT_TRACE=<file>: the exact GEMV kernel's trace (frt_gemv_trace in vendor/csrc/gemv.cuh:
// a record of each block's phases, CUDA graph replays included, in a ring of the latest 2^19 blocks,
// ~10 decode steps of qwen36). Started by the first graph evaluation (outside capture); each
// context's end writes the ring and the launches' names to the file (replaced each time),
// tab-separated, for bench/tools/exact-trace.py.
void flashrt_exact_trace_begin();
bool flashrt_exact_trace_on();
// The launch whose first segment reads `w`: its window and weights' names, for the file.
void flashrt_exact_trace_name(const void * w, const char * window, const std::string & weights);
void flashrt_exact_trace_write();

// GGML_FLASHRT_PERIODS=<file>: the host time of each graph compute call and whether ggml-cuda runs
// its node loop for it (a capture or a direct evaluation) or replays a captured graph, written when
// the process exits (`# flashrt-periods 1`, then `NS NODE_LOOP` a call, NS on the steady clock).
// Marked before the overlay's off switch is read, so a stock run of the same binary
// (GGML_CUDA_FLASHRT_DISABLE=1) is measured the same way. Call to call is a decode step's whole
// period, host work included, without a tracer: `cargo xtask profile` reads it from its untraced runs.
void flashrt_mark_graph_compute(bool node_loop);
