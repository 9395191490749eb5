// Decode GEMV microbenchmark, our side (issue 10): frt_gemv (vendor/csrc/gemv.cu) at every weight
// matvec shape of a qwen36-35b-a3b decode step (the names of bench/tools/gemv-stock.cpp, which
// times stock ggml; bench/tools/gemv-table.py joins the two) plus the packs our windows launch as
// one kernel, at 1..8 tokens. With --lab: the decode GEMV v2 experiments instead (gemv-lab.cuh;
// docs/perf-notes.md, "decode GEMV v2: hypotheses"): probes of the launch and streaming floors, and
// the candidate's variants side by side with v1 at the dense single-matrix shapes.
//
// Each (shape, tokens) is a CUDA graph of L launches, launch i reading weight copy i % C (C copies
// of >= --stream-mib MiB in all, default 120: twice the H200's L2, so each launch reads DRAM; the
// LM head alone is 417 MB) and, for experts, the i-th of 32 disjoint selections of 8 of 256
// experts a token. The time per launch is the median over replays of the graph's time / L, so it
// includes what a launch costs inside a graph, as in decode (with programmatic dependent launch
// between neighbours, as ggml-cuda launches). Per row: bytes = the GGUF bytes of the weights read
// (experts: 8 distinct matrices a token; repacked Q6_K rows of k = 512 are 2.9% longer than GGUF's,
// not counted), floor = bytes / 4.38 TB/s, budget = bytes / (0.7 x 4.38 TB/s) + 1.5 us, achieved
// TB/s, pass = within the budget. Before timing, one launch is checked against the float64
// reference of vendor/csrc/tests/test-gemv-reference.cuh on up to 512 rows a segment (fatal: the
// benchmark would time something else than the product; lab variants that skip x or the math
// are timing probes and are not checked).
//
// Writes one JSON line per (shape, tokens) to OUT (keys shape, out, in, type, tokens, bytes,
// us_median as gemv-stock's, plus impl "frt", experts, us_min, us_max, floor_us, budget_us, tbps,
// pass, launches, copies) and prints a markdown table last. --lab: impl "frt" (v1), "lab:NAME" or
// "probe:NAME" (shape: the bytes read), and its tables.
//
// Usage: gemv-bench OUT.jsonl [--shapes a,b] [--tokens 1,2,4] [--replays 30] [--stream-mib 120]
//                  [--graph-ms 2] [--impls frt,frt-bulk,frt-exact] [--between] [--list]
//                  [--lab [--variants a,b]]
//   --impls: which kernels to time (default all three; frt: what frt_gemv picks)
//   --graph-ms: the least work a graph holds (launches = max(copies, 32 for experts, this / floor))
//   --between: a small kernel between the launches, as in decode, where a GEMV follows a norm, an
//     add or the routing rather than another GEMV: one block of 1024 threads, launched with PDL,
//     waiting for its predecessor and then writing the next launch's input (as ggml-cuda's
//     rms_norm of one row does). A GEMV that streams its weights before its wait overlaps such a
//     kernel only if its blocks can be resident beside it; back to back with itself it cannot
//     tell. us_median is then the pair's time less the small kernel's alone (between_us in the
//     JSON), the GEMV's cost in a decode-like sequence.
//   --lab: tokens default to 1,2,4,8 (variants other than v1 and C: 1 token); --variants picks some
// Build (device; bench/device/gemv.sh does this and runs it):
//   nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools bench/tools/gemv-bench.cu vendor/csrc/*.cu -o gemv-bench

#include "cuda-check.cuh"
#include "gemv-lab.cuh"
#include "gemv.cuh"
#include "pdl.cuh"
#include "tests/test-gemv-reference.cuh"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

constexpr double kReadTbps  = 4.38;  // H200 read bandwidth (bench/results/*-h200-bandwidth)
constexpr int    kExperts   = 256;
constexpr int    kUsed      = 8;
constexpr int    kSelections = 32;  // disjoint expert selections the launches rotate through

struct seg_spec {
    frt_gemv_type type;  // GGUF type; dense Q6_K/Q8_0 run repacked unless `gguf`
    int           rows;
    bool          experts = false;
    bool          gguf    = false;
};

struct shape_spec {
    const char *          name;
    const char *          what;
    int                   k;
    std::vector<seg_spec> segs;
    bool                  norm       = false;  // the RMS norm prologue (the windows fold RMS_NORM+MUL)
    bool                  x_per_slot = false;  // down projections: one input a slot
};

const frt_gemv_type Q4 = FRT_GEMV_Q4_K, Q6 = FRT_GEMV_Q6_K, Q8 = FRT_GEMV_Q8_0, F32 = FRT_GEMV_F32;

const std::vector<shape_spec> & shapes() {
    static const std::vector<shape_spec> all = {
        { "attn_qkv", "attn_qkv (GDN), attn_q", 2048, { { Q4, 8192 } } },
        { "attn_gate", "attn_gate (GDN)", 2048, { { Q4, 4096 } } },
        { "ssm_alpha", "ssm_alpha, ssm_beta (repacked)", 2048, { { Q8, 32 } } },
        { "ssm_out", "ssm_out, attn_output", 4096, { { Q4, 2048 } } },
        { "attn_k", "attn_k", 2048, { { Q4, 512 } } },
        { "attn_v", "attn_v (repacked)", 2048, { { Q6, 512 } } },
        { "ffn_gate_inp", "router", 2048, { { F32, 256 } } },
        { "ffn_gate_inp_shexp", "shared-expert gate", 2048, { { F32, 1 } } },
        { "ffn_gate_up_shexp", "shared gate + up, one launch (no SwiGLU yet)", 2048, { { Q4, 512 }, { Q4, 512 } } },
        { "ffn_down_shexp", "shared down (repacked)", 512, { { Q6, 2048 } } },
        { "ffn_down_shexp_gguf", "shared down, GGUF layout (staged)", 512, { { Q6, 2048, false, true } } },
        { "ffn_gate_up_exps", "gate + up of 8 of 256 experts, one launch", 2048,
          { { Q4, 512, true }, { Q4, 512, true } } },
        { "ffn_down_exps", "down of 8 of 256 experts, GGUF layout", 512, { { Q6, 2048, true } }, false, true },
        { "output", "LM head (repacked)", 2048, { { Q6, 248320 } } },
        { "gdn_in_proj_pack", "RMS norm + qkv + z + alpha + beta, one launch", 2048,
          { { Q4, 8192 }, { Q4, 4096 }, { Q8, 32, false, true }, { Q8, 32, false, true } }, true },
        { "attn_qkv_pack", "RMS norm + q + k + v (v GGUF), one launch", 2048,
          { { Q4, 8192 }, { Q4, 512 }, { Q6, 512, false, true } }, true },
    };
    return all;
}

[[noreturn]] void fail(const std::string & message) {
    std::fprintf(stderr, "gemv-bench: %s\n", message.c_str());
    std::exit(1);
}

std::vector<std::string> split_list(const std::string & s) {
    std::vector<std::string> out;
    size_t                   at = 0;
    while (at <= s.size()) {
        const size_t comma = s.find(',', at);
        out.push_back(s.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
        if (comma == std::string::npos) {
            break;
        }
        at = comma + 1;
    }
    return out;
}

// Device copy of a host buffer, complete on return. cudaMemcpy from pageable memory may return
// before its last DMA lands, and the weight copies and graphs run on a non-blocking stream that
// does not wait for the legacy one: without the synchronisation, copy 0 of a segment could take
// stale bytes (what failed the check of ffn_gate_up_shexp, segment 1 from row 248 on, in
// bench/results/2026-11-30-fcb4a49-h200-decode-gemv-v1).
template <typename T> T * to_device(const std::vector<T> & v) {
    T * d = nullptr;
    CHECK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)));
    CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaDeviceSynchronize());
    return d;
}

struct seg_data {
    std::vector<uint8_t> host;    // GGUF bytes of one copy (experts: the stacked tensor)
    std::vector<void *>  copies;  // what frt_gemv reads, one per copy (in shape_weights::pool)
    frt_gemv_type        type = FRT_GEMV_F32;
    int64_t              row_stride = 0;
    int                  matrices   = 1;
    float *              out        = nullptr;
    int                  n_out      = 0;
};

struct result {
    std::string        impl;
    const shape_spec * shape;
    int                tokens, launches, copies;
    int64_t            bytes;
    double             us_median, us_min, us_max;
    double             between_us = 0.0;  // --between: the small kernel's time alone, taken off the above
};

// What is timed: frt_gemv, or a lab variant, launching `args` on a stream.
using launcher = std::function<cudaError_t(const frt_gemv_args &, cudaStream_t)>;

// Checks `launch` of `args` (weights of copy 0, expert selection 0) against the float64 reference
// on up to 512 rows a segment. `who` names the implementation in the message.
void check_launch(const shape_spec & s, const frt_gemv_args & args, const std::vector<seg_data> & data, int tokens,
                  const std::vector<float> & x, int64_t x_stride, const std::vector<float> & norm,
                  const std::vector<int32_t> & ids, const launcher & launch, const std::string & who) {
    for (size_t si = 0; si < s.segs.size(); ++si) {
        CHECK(cudaMemset(data[si].out, 0xff, (size_t) data[si].n_out * s.segs[si].rows * sizeof(float)));
    }
    CHECK(launch(args, 0));
    CHECK(cudaDeviceSynchronize());
    const int    k     = s.k;
    const double delta = s.norm ? gemv_ref::norm_error(k) : 0.0;
    const int    n_vec = tokens * (s.x_per_slot ? kUsed : 1);
    std::vector<std::vector<double>> xs(n_vec);
    std::vector<gemv_ref::rounded>   rs;
    for (int v = 0; v < n_vec; ++v) {
        const float * xv = x.data() + v * x_stride;
        xs[v]            = s.norm ? gemv_ref::rms_normed(xv, norm.data(), k, args.eps) : std::vector<double>(xv, xv + k);
        rs.push_back(s.norm ? gemv_ref::round_like_kernel(xs[v], k, delta) : gemv_ref::round_like_kernel(xv, k));
    }
    std::vector<double> w(k), a(k);
    for (size_t si = 0; si < s.segs.size(); ++si) {
        const seg_spec &         sp   = s.segs[si];
        const seg_data &         d    = data[si];
        const std::vector<float> got  = [&] {
            std::vector<float> v((size_t) d.n_out * sp.rows);
            CHECK(cudaMemcpy(v.data(), d.out, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
            return v;
        }();
        const int64_t            row_bytes = gemv_ref::gguf_row_bytes(sp.type, k);
        const int                step      = std::max(1, sp.rows / 512);
        for (int o = 0; o < d.n_out; ++o) {
            const int matrix = sp.experts ? ids[(o / kUsed) * kUsed + o % kUsed] : 0;
            const int vec    = sp.experts ? (s.x_per_slot ? o : o / kUsed) : o;
            for (int r = 0; r < sp.rows; r += step) {
                gemv_ref::dequantize_row(sp.type, k, d.host.data() + ((int64_t) matrix * sp.rows + r) * row_bytes,
                                         w.data(), a.data());
                const gemv_ref::output ref = gemv_ref::reference(
                    sp.type, k, w.data(), a.data(), xs[vec], gemv_ref::quantized(sp.type) ? &rs[vec] : nullptr, delta);
                const float y = got[(size_t) o * sp.rows + r];
                if (!(std::fabs(y - ref.sharp) <= ref.tol_sharp)) {
                    fail(who + ", " + s.name + ": segment " + std::to_string(si) + " output " + std::to_string(o) +
                         " row " + std::to_string(r) + " is " + std::to_string(y) + ", the reference " +
                         std::to_string(ref.sharp) + " +- " + std::to_string(ref.tol_sharp) +
                         ": run test-gemv (vendor/csrc/tests) on this GPU");
                }
            }
        }
    }
}

// Weights of a shape: dense segments C copies (carved from one allocation), experts one stacked
// tensor of 256; generated once for every token count.
struct shape_weights {
    std::vector<seg_data> segs;
    int                   copies = 1;
    void *                pool   = nullptr;
};

shape_weights make_weights(const shape_spec & s, double stream_mib, std::mt19937_64 & rng, cudaStream_t stream) {
    const int     k          = s.k;
    int64_t       dense_copy = 0;
    for (const seg_spec & sp : s.segs) {
        dense_copy += sp.experts ? 0 : (int64_t) sp.rows * gemv_ref::gguf_row_bytes(sp.type, k);
    }
    shape_weights sw;
    sw.copies = dense_copy == 0 ? 1 : (int) std::max<int64_t>(1, (int64_t) (stream_mib * 1048576.0) / dense_copy + 1);
    sw.segs.resize(s.segs.size());
    std::vector<int64_t> offsets;
    int64_t              total = 0;
    for (size_t si = 0; si < s.segs.size(); ++si) {
        const seg_spec & sp = s.segs[si];
        seg_data &       d  = sw.segs[si];
        const int64_t    row = gemv_ref::gguf_row_bytes(sp.type, k);
        d.matrices           = sp.experts ? kExperts : 1;
        d.host.resize((size_t) d.matrices * sp.rows * row);
        for (int64_t r = 0; r < (int64_t) d.matrices * sp.rows; ++r) {
            gemv_ref::random_row(sp.type, k, d.host.data() + r * row, rng);
        }
        const bool repack = !sp.gguf && !sp.experts && frt_gemv_repacked_type(sp.type) != sp.type;
        d.type            = repack ? frt_gemv_repacked_type(sp.type) : sp.type;
        d.row_stride      = frt_gemv_row_bytes(d.type, k);
        const int64_t one = ((int64_t) d.matrices * sp.rows * d.row_stride + 255) / 256 * 256;
        for (int c = 0; c < (sp.experts ? 1 : sw.copies); ++c) {
            offsets.push_back(total);
            total += one;
        }
    }
    CHECK(cudaMalloc(&sw.pool, total));
    size_t next = 0;
    for (size_t si = 0; si < s.segs.size(); ++si) {
        const seg_spec & sp      = s.segs[si];
        seg_data &       d       = sw.segs[si];
        uint8_t *        staging = to_device(d.host);
        for (int c = 0; c < (sp.experts ? 1 : sw.copies); ++c) {
            uint8_t * w = (uint8_t *) sw.pool + offsets[next++];
            if (d.type != sp.type) {
                CHECK(frt_gemv_repack(sp.type, staging, gemv_ref::gguf_row_bytes(sp.type, k), d.matrices * sp.rows, k,
                                      w, stream));
            } else {
                CHECK(cudaMemcpyAsync(w, staging, d.host.size(), cudaMemcpyDeviceToDevice, stream));
            }
            d.copies.push_back(w);
        }
        CHECK(cudaStreamSynchronize(stream));
        CHECK(cudaFree(staging));
    }
    return sw;
}

// Per-launch time of a graph of `launches` launches (launch_i(i, stream) adds launch i), median,
// least and most over `replays` replays after 3 warm-up replays.
struct timing {
    double median, least, most;
};

timing time_graph(int launches, int replays, cudaStream_t stream, const std::function<void(int, cudaStream_t)> & launch_i) {
    cudaGraph_t     graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < launches; ++i) {
        launch_i(i, stream);
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (int i = 0; i < 3; ++i) {
        CHECK(cudaGraphLaunch(exec, stream));
    }
    std::vector<double> us;
    for (int i = 0; i < replays; ++i) {
        CHECK(cudaEventRecord(start, stream));
        CHECK(cudaGraphLaunch(exec, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(1000.0 * ms / launches);
    }
    std::sort(us.begin(), us.end());
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    return { us[us.size() / 2], us.front(), us.back() };
}

// --between's small kernel: waits for its predecessor, then rewrites x (n floats) from a pristine
// copy, so every GEMV launch multiplies the same vectors and each depends on the kernel before it.
__global__ void between_kernel(const float * src, float * x, int n) {
    frt_pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        x[i] = src[i];
    }
}

// Checks (when `checked`) and times `launch` at (shape, tokens). `who` names it in messages.
// between: --between (a small kernel after each launch; the result is the GEMV's share).
result run_shape(const shape_spec & s, shape_weights & sw, int tokens, int replays, double graph_ms,
                 std::mt19937_64 & rng, cudaStream_t stream, const launcher & launch, bool checked,
                 const std::string & who, bool between = false) {
    const int k = s.k;
    // Inputs: one vector a token (a slot for down projections), the norm weight.
    const int     n_vec    = tokens * (s.x_per_slot ? kUsed : 1);
    const int64_t x_stride = k;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float>              x((size_t) n_vec * k), norm(k);
    for (float & v : x) {
        v = normal(rng);
    }
    for (float & v : norm) {
        v = 0.5f + (float) (rng() % 1000) / 1000.0f;
    }
    float * d_x    = to_device(x);
    float * d_norm = to_device(norm);
    int64_t bytes  = 0;
    for (size_t si = 0; si < s.segs.size(); ++si) {
        const seg_spec & sp = s.segs[si];
        bytes += (int64_t) sp.rows * gemv_ref::gguf_row_bytes(sp.type, k) * (sp.experts ? kUsed * tokens : 1);
        sw.segs[si].n_out = sp.experts ? tokens * kUsed : tokens;
        CHECK(cudaMalloc(&sw.segs[si].out, (size_t) sw.segs[si].n_out * sp.rows * sizeof(float)));
    }
    const int copies = sw.copies;

    // Expert selections: launch i takes selection i % 32, 8 distinct experts a token, no expert
    // shared by two tokens or by neighbouring launches.
    std::vector<int32_t> ids((size_t) kSelections * tokens * kUsed);
    for (int sel = 0; sel < kSelections; ++sel) {
        for (int t = 0; t < tokens; ++t) {
            for (int j = 0; j < kUsed; ++j) {
                ids[((size_t) sel * tokens + t) * kUsed + j] = (kUsed * (sel * tokens + t) + j) % kExperts;
            }
        }
    }
    int32_t * d_ids = to_device(ids);

    auto args_for = [&](int launch_index) {
        frt_gemv_args a{};
        a.x           = d_x;
        a.x_stride    = x_stride;
        a.k           = k;
        a.tokens      = tokens;
        a.x_per_token = s.x_per_slot ? kUsed : 1;
        a.norm        = s.norm ? d_norm : nullptr;
        a.eps         = 1e-6f;
        a.n_segments  = (int) s.segs.size();
        for (size_t si = 0; si < s.segs.size(); ++si) {
            const seg_spec &   sp = s.segs[si];
            const seg_data &   d  = sw.segs[si];
            frt_gemv_segment & g  = a.seg[si];
            g.type                = d.type;
            g.w                   = d.copies[sp.experts ? 0 : launch_index % copies];
            g.rows                = sp.rows;
            g.row_stride          = d.row_stride;
            g.out                 = d.out;
            g.out_stride          = sp.rows;
            if (sp.experts) {
                g.ids           = d_ids + (size_t) (launch_index % kSelections) * tokens * kUsed;
                g.ids_stride    = kUsed;
                g.n_used        = kUsed;
                g.n_experts     = kExperts;
                g.expert_stride = (int64_t) sp.rows * d.row_stride;
            }
        }
        return a;
    };
    if (const char * why = frt_gemv_unsupported(args_for(0))) {
        fail(std::string(s.name) + ": " + why);
    }
    if (checked) {
        check_launch(s, args_for(0), sw.segs, tokens, x, x_stride, norm,
                     std::vector<int32_t>(ids.begin(), ids.begin() + tokens * kUsed), launch, who);
    } else {
        // One launch outside the capture all the same: module loading, attributes, launch errors.
        CHECK(launch(args_for(0), 0));
        CHECK(cudaDeviceSynchronize());
    }

    // The graph: enough launches to cycle through every copy and selection, and graph_ms of work.
    const double est_us   = std::max(2.0, bytes / (kReadTbps * 1e6));
    const int    launches = std::max({ copies, s.segs[0].experts ? kSelections : 1, (int) (1000.0 * graph_ms / est_us) });
    float *      d_x_src  = between ? to_device(x) : nullptr;
    const auto   add_between = [&](cudaStream_t st) {
        CHECK(frt_launch(between_kernel, dim3(1), dim3(1024), 0, st, (const float *) d_x_src, d_x, n_vec * k));
    };
    timing       tm       = time_graph(launches, replays, stream, [&](int i, cudaStream_t st) {
        CHECK(launch(args_for(i), st));
        if (between) {
            add_between(st);
        }
    });
    double between_us = 0.0;
    if (between) {
        between_us = time_graph(launches, replays, stream, [&](int, cudaStream_t st) { add_between(st); }).median;
        tm         = { tm.median - between_us, tm.least - between_us, tm.most - between_us };
        CHECK(cudaFree(d_x_src));
    }
    for (seg_data & d : sw.segs) {
        CHECK(cudaFree(d.out));
        d.out = nullptr;
    }
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_norm));
    CHECK(cudaFree(d_ids));
    return { "", &s, tokens, launches, copies, bytes, tm.median, tm.least, tm.most, between_us };
}

std::string type_label(const shape_spec & s) {
    std::string label;
    for (const seg_spec & sp : s.segs) {
        const std::string t = gemv_ref::type_name(sp.type);
        if (label.find(t) == std::string::npos) {
            label += (label.empty() ? "" : "+") + t;
        }
    }
    return label;
}

int out_rows(const shape_spec & s) {
    int rows = 0;
    for (const seg_spec & sp : s.segs) {
        rows += sp.rows;
    }
    return rows;
}

// ---- --lab: the v2 experiments (gemv-lab.cuh) ----

// A markdown cell: the time of `impl` in `row`, or empty when it was not timed.
void print_cell(const std::map<std::string, double> & row, const std::string & impl) {
    const auto it = row.find(impl);
    if (it == row.end()) {
        std::printf(" |");
    } else {
        std::printf(" %.2f |", it->second);
    }
}

// Types a lab variant is built for (bit per frt_gemv_type): all four the lab shapes use, or the
// two whose shapes answer the structural questions (Q4_K: the big matrices; F32: the router and
// the 1-row gate, where the fixed cost is everything).
constexpr unsigned kLabAll = 1u << FRT_GEMV_F32 | 1u << FRT_GEMV_Q4_K | 1u << FRT_GEMV_Q6_K_R | 1u << FRT_GEMV_Q8_0_R;
constexpr unsigned kLabQ4F = 1u << FRT_GEMV_F32 | 1u << FRT_GEMV_Q4_K;

// The candidate C and its one-knob neighbours (gemv-lab.cuh explains the knobs).
//                   warps bps  U  pre            x              math db grid               lpr            trig
using LabC      = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabPreL2  = lab::cfg<8, 1, 8, lab::PRE_L2, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabPreNo  = lab::cfg<8, 1, 8, lab::PRE_NONE, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabXSer   = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_SERIAL, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabXGlob  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_GLOBAL, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabXNone  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_NONE, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabNoMath = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 0, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabLoads  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_NONE, 0, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabBps2   = lab::cfg<8, 2, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabW4     = lab::cfg<4, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabU4     = lab::cfg<8, 1, 4, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabNoDb   = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 0, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabGrid1  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_ONE, lab::LPR_AUTO, lab::TRIG_LATE>;
using LabLpr32  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_32, lab::TRIG_LATE>;
using LabEarly  = lab::cfg<8, 1, 8, lab::PRE_REGS, lab::X_BLOCK, 1, 1, lab::GRID_RESIDENT, lab::LPR_AUTO, lab::TRIG_EARLY>;

struct lab_variant {
    const char * name;
    const char * what;
    cudaError_t (*run)(const lab::args &, cudaStream_t);
    bool (*facts)(int type, size_t smem, lab::kernel_facts & f);
    bool checked;  // computes the product (else a timing probe)
    bool tokens;   // also timed at more than 1 token
};

const std::vector<lab_variant> & lab_variants() {
    static const std::vector<lab_variant> all = {
        { "C", "candidate: 8 warps, 1 block/SM, 8 items a lane a round, next round in flight, first round loaded before the wait, x per block in one round",
          lab::run<LabC, kLabAll, 8>, lab::facts<LabC, kLabAll>, true, true },
        { "pre-l2", "C, L2 prefetch of the first row group before the wait (v1) instead of registers",
          lab::run<LabPreL2, kLabAll, 1>, lab::facts<LabPreL2, kLabAll>, true, false },
        { "pre-none", "C, nothing before the wait", lab::run<LabPreNo, kLabQ4F, 1>, lab::facts<LabPreNo, kLabQ4F>, true, false },
        { "x-serial", "C, x loaded one float4 a thread at a time (v1's prologue as first measured)",
          lab::run<LabXSer, kLabQ4F, 1>, lab::facts<LabXSer, kLabQ4F>, true, false },
        { "x-global", "C, x quantized by a separate 1-wave kernel (2 launches), read from global/L1; F32: x read in place",
          lab::run<LabXGlob, kLabQ4F, 1>, lab::facts<LabXGlob, kLabQ4F>, true, false },
        { "x-none", "C without reading x (timing only)", lab::run<LabXNone, kLabQ4F, 1>, lab::facts<LabXNone, kLabQ4F>, false,
          false },
        { "no-math", "C with an XOR of the weights for the products (timing only)", lab::run<LabNoMath, kLabQ4F, 1>,
          lab::facts<LabNoMath, kLabQ4F>, false, false },
        { "loads-only", "C without x and without the products (timing only)", lab::run<LabLoads, kLabQ4F, 1>,
          lab::facts<LabLoads, kLabQ4F>, false, false },
        { "bps2", "C with 2 blocks an SM (all registers: the next launch cannot start early)",
          lab::run<LabBps2, kLabAll, 1>, lab::facts<LabBps2, kLabAll>, true, false },
        { "w4", "C with 4 warps a block (a quarter of the registers)", lab::run<LabW4, kLabQ4F, 1>,
          lab::facts<LabW4, kLabQ4F>, true, false },
        { "u4", "C with 4 items a lane a round", lab::run<LabU4, kLabQ4F, 1>, lab::facts<LabU4, kLabQ4F>, true, false },
        { "no-db", "C without the next round in flight", lab::run<LabNoDb, kLabAll, 1>, lab::facts<LabNoDb, kLabAll>, true,
          false },
        { "grid-one", "C with one row group a team (more blocks than fit at once)", lab::run<LabGrid1, kLabQ4F, 1>,
          lab::facts<LabGrid1, kLabQ4F>, true, false },
        { "lpr32", "C with 32 lanes a row (a row a warp at a time)", lab::run<LabLpr32, kLabQ4F, 1>,
          lab::facts<LabLpr32, kLabQ4F>, true, false },
        { "trig-early", "C, next launch triggered at the start instead of after x", lab::run<LabEarly, kLabQ4F, 1>,
          lab::facts<LabEarly, kLabQ4F>, true, false },
    };
    return all;
}

// The dense single-matrix shapes the lab kernel takes.
const std::vector<std::string> kLabShapes = { "attn_qkv", "attn_gate", "ssm_out", "attn_k", "attn_v", "ssm_alpha",
                                              "ffn_gate_inp", "ffn_gate_inp_shexp", "ffn_down_shexp", "output" };

// Probes: what a launch and a pure read of the same bytes cost, in graphs like the shapes'.
struct probe {
    const char * name;
    const char * what;
    cudaError_t (*launch)(const uint4 * w, int64_t n16, uint32_t * sink, cudaStream_t stream);
    bool reads;  // false: the time does not depend on the bytes (measured once)
};

template <int U, int PRE, int DB, int PAIR, int BPS>
cudaError_t stream_probe(const uint4 * w, int64_t n16, uint32_t * sink, cudaStream_t stream) {
    return lab::launch(lab::stream_kernel<U, PRE, DB, PAIR, BPS>, dim3(lab::sm_count() * BPS), dim3(256), 0, stream,
                       true, w, n16, sink);
}

template <int BLOCKS_PER_SM, int THREADS, bool PDL>
cudaError_t empty_probe(const uint4 *, int64_t, uint32_t * sink, cudaStream_t stream) {
    const int blocks = BLOCKS_PER_SM > 0 ? lab::sm_count() * BLOCKS_PER_SM : 1;
    return lab::launch(lab::empty_kernel, dim3(blocks), dim3(THREADS), 0, stream, PDL, sink);
}

const std::vector<probe> & probes() {
    static const std::vector<probe> all = {
        { "empty", "wait + trigger, SMs x 256 threads, PDL", empty_probe<1, 256, true>, false },
        { "empty-1", "wait + trigger, 1 x 32 threads, PDL", empty_probe<0, 32, true>, false },
        { "empty-nopdl", "SMs x 256 threads, plain launch", empty_probe<1, 256, false>, false },
        { "s8", "stream read, 8 x 16 B a thread a chunk, loads after the wait", stream_probe<8, 0, 0, 0, 1>, true },
        { "s8-pre-db", "s8, first chunk before the wait, next chunk in flight", stream_probe<8, 1, 1, 0, 1>, true },
        { "s8-db", "s8, next chunk in flight", stream_probe<8, 0, 1, 0, 1>, true },
        { "s16-pre", "16 x 16 B a thread a chunk (one chunk up to 8.6 MB), first chunk before the wait",
          stream_probe<16, 1, 0, 0, 1>, true },
        { "s32-pre", "32 x 16 B a thread a chunk (one chunk up to 17 MB; 146 registers: no co-residence), first "
                     "chunk before the wait",
          stream_probe<32, 1, 0, 0, 1>, true },
        { "s8-pair", "s8-pre-db with 32 B a thread (two adjacent 16 B loads)", stream_probe<8, 1, 1, 1, 1>, true },
        { "s8-bps2", "s8-pre-db with 2 blocks an SM", stream_probe<8, 1, 1, 0, 2>, true },
    };
    return all;
}

const std::vector<int64_t> kProbeBytes = { 8192, 589824, 1000000, 2097152, 5000000, 10000000, 50000000 };

void json_line(std::FILE * out, const std::string & impl, const std::string & shape, int tokens, int64_t bytes,
               const timing & tm, int launches) {
    const double floor_us = bytes / (kReadTbps * 1e6), budget_us = bytes / (0.7 * kReadTbps * 1e6) + 1.5;
    std::fprintf(out,
                 "{\"impl\":\"%s\",\"shape\":\"%s\",\"tokens\":%d,\"bytes\":%" PRId64 ",\"us_median\":%.3f,"
                 "\"us_min\":%.3f,\"us_max\":%.3f,\"floor_us\":%.3f,\"budget_us\":%.3f,\"tbps\":%.3f,\"launches\":%d}\n",
                 impl.c_str(), shape.c_str(), tokens, bytes, tm.median, tm.least, tm.most, floor_us, budget_us,
                 bytes / tm.median / 1e6, launches);
    std::fflush(out);
}

void run_probes(std::FILE * out, int replays, double graph_ms, double stream_mib, cudaStream_t stream) {
    uint32_t * sink = nullptr;
    CHECK(cudaMalloc(&sink, 4096));
    std::map<std::string, std::map<int64_t, double>> us;
    for (const int64_t bytes : kProbeBytes) {
        const int64_t one    = (bytes + 255) / 256 * 256;
        const int     copies = (int) std::max<int64_t>(2, (int64_t) (stream_mib * 1048576.0) / one + 1);
        uint8_t *     pool   = nullptr;
        CHECK(cudaMalloc(&pool, one * copies));
        CHECK(cudaMemset(pool, 0x5a, one * copies));
        const double est_us   = std::max(2.0, bytes / (kReadTbps * 1e6));
        const int    launches = std::max(copies, (int) (1000.0 * graph_ms / est_us));
        for (const probe & pr : probes()) {
            if (!pr.reads && bytes != kProbeBytes.front()) {
                continue;
            }
            CHECK(pr.launch((const uint4 *) pool, bytes / 16, sink, 0));  // outside the capture first
            CHECK(cudaDeviceSynchronize());
            const timing tm = time_graph(launches, replays, stream, [&](int i, cudaStream_t st) {
                CHECK(pr.launch((const uint4 *) (pool + (int64_t) (i % copies) * one), bytes / 16, sink, st));
            });
            us[pr.name][bytes] = tm.median;
            json_line(out, std::string("probe:") + pr.name, pr.reads ? std::to_string(bytes) : "0", 1,
                      pr.reads ? bytes : 0, tm, launches);
            std::fprintf(stderr, "gemv-bench: probe %s, %" PRId64 " bytes: %.2f us\n", pr.name, bytes, tm.median);
        }
        CHECK(cudaFree(pool));
    }
    CHECK(cudaFree(sink));
    std::printf("### Probes: us a launch in a graph of launches (PDL unless said), by bytes read\n\n| probe | what |");
    for (const int64_t b : kProbeBytes) {
        std::printf(" %.3g MB |", b / 1e6);
    }
    std::printf("\n|---|---|");
    for (size_t i = 0; i < kProbeBytes.size(); ++i) {
        std::printf("---:|");
    }
    std::printf("\n");
    for (const probe & pr : probes()) {
        std::printf("| %s | %s |", pr.name, pr.what);
        for (const int64_t b : kProbeBytes) {
            const auto it = us[pr.name].find(b);
            if (it == us[pr.name].end()) {
                std::printf(" |");
            } else {
                std::printf(" %.2f |", it->second);
            }
        }
        std::printf("\n");
    }
    std::printf("| floor | bytes / %.2f TB/s |", kReadTbps);
    for (const int64_t b : kProbeBytes) {
        std::printf(" %.2f |", b / (kReadTbps * 1e6));
    }
    std::printf("\n\n");
}

// Times v1 and every selected variant at the lab shapes; prints the tables.
void run_lab(std::FILE * out, const std::vector<std::string> & only, const std::vector<std::string> & picked,
             const std::vector<int> & tokens, int replays, double graph_ms, double stream_mib, std::mt19937_64 & rng,
             cudaStream_t stream) {
    std::vector<const lab_variant *> variants;
    for (const lab_variant & v : lab_variants()) {
        if (picked.empty() || std::find(picked.begin(), picked.end(), v.name) != picked.end()) {
            variants.push_back(&v);
        }
    }
    uint8_t * scratch = nullptr;
    CHECK(cudaMalloc(&scratch, lab::scratch_bytes(4096, FRT_GEMV_MAX_TOKENS)));
    // us[shape][tokens][impl]
    std::map<std::string, std::map<int, std::map<std::string, double>>> us;
    std::map<std::string, int64_t> shape_bytes;
    std::vector<std::string>       shape_order;
    for (const shape_spec & s : shapes()) {
        if (std::find(kLabShapes.begin(), kLabShapes.end(), s.name) == kLabShapes.end() ||
            (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end())) {
            continue;
        }
        shape_order.push_back(s.name);
        shape_weights weights = make_weights(s, stream_mib, rng, stream);
        const frt_gemv_type type = weights.segs[0].type;
        for (const int t : tokens) {
            struct impl {
                std::string name;
                launcher    launch;
                bool        checked;
            };
            std::vector<impl> impls = { { "v1",
                                          [](const frt_gemv_args & a, cudaStream_t st) {
                                              return frt_gemv(a, st, FRT_GEMV_KERNEL_REGISTERS);
                                          },
                                          true } };
            for (const lab_variant * v : variants) {
                lab::kernel_facts f;
                if ((t > 1 && !v->tokens) || !v->facts(type, 0, f)) {
                    continue;  // not built for this type (or token count)
                }
                impls.push_back({ v->name,
                                  [v, scratch](const frt_gemv_args & a, cudaStream_t st) {
                                      const frt_gemv_segment & g = a.seg[0];
                                      const lab::args la{ a.x,    a.x_stride, a.k,   a.tokens,     g.type,  g.w,
                                                          g.row_stride, g.rows, g.out, g.out_stride, scratch };
                                      return v->run(la, st);
                                  },
                                  v->checked });
            }
            for (const impl & im : impls) {
                const std::string json_impl = im.name == "v1" ? "frt" : "lab:" + im.name;
                const result      r = run_shape(s, weights, t, replays, graph_ms, rng, stream, im.launch, im.checked,
                                                json_impl);
                json_line(out, json_impl, s.name, t, r.bytes, { r.us_median, r.us_min, r.us_max }, r.launches);
                us[s.name][t][im.name] = r.us_median;
                shape_bytes[s.name]    = r.bytes;
                std::fprintf(stderr, "gemv-bench: lab %s, %s, %d tokens: %.2f us\n", im.name.c_str(), s.name, t,
                             r.us_median);
            }
        }
        CHECK(cudaFree(weights.pool));
    }
    CHECK(cudaFree(scratch));

    std::printf("### Variants at 1 token: us a launch (budget = bytes / (0.7 x %.2f TB/s) + 1.5 us)\n\n", kReadTbps);
    std::printf("| shape | MB | floor | budget | v1 |");
    for (const lab_variant * v : variants) {
        std::printf(" %s |", v->name);
    }
    std::printf("\n|---|---:|---:|---:|---:|");
    for (size_t i = 0; i < variants.size(); ++i) {
        std::printf("---:|");
    }
    std::printf("\n");
    for (const std::string & name : shape_order) {
        const int64_t b = shape_bytes[name];
        std::printf("| %s | %.2f | %.2f | %.2f |", name.c_str(), b / 1e6, b / (kReadTbps * 1e6),
                    b / (0.7 * kReadTbps * 1e6) + 1.5);
        const auto & row = us[name][1];
        for (const std::string & impl : [&] {
                 std::vector<std::string> names = { "v1" };
                 for (const lab_variant * v : variants) {
                     names.push_back(v->name);
                 }
                 return names;
             }()) {
            print_cell(row, impl);
        }
        std::printf("\n");
    }
    std::printf("\n");
    for (const lab_variant * v : variants) {
        std::printf("- %s: %s\n", v->name, v->what);
    }
    std::printf("\n### By tokens: v1 and the variants timed at every token count, us\n\n| shape | tokens | v1 |");
    std::vector<const lab_variant *> multi;
    for (const lab_variant * v : variants) {
        if (v->tokens) {
            multi.push_back(v);
            std::printf(" %s |", v->name);
        }
    }
    std::printf("\n|---|---:|---:|");
    for (size_t i = 0; i < multi.size(); ++i) {
        std::printf("---:|");
    }
    std::printf("\n");
    for (const std::string & name : shape_order) {
        for (const int t : tokens) {
            const auto & row = us[name][t];
            std::printf("| %s | %d | %.2f |", name.c_str(), t, row.count("v1") ? row.at("v1") : 0.0);
            for (const lab_variant * v : multi) {
                print_cell(row, v->name);
            }
            std::printf("\n");
        }
    }

    // Registers, spills and resident blocks an SM of the lab kernels (1 token; v1's: ptxas.txt).
    std::printf("\n### Lab kernels (1 token; blocks an SM with the shared memory of k = 2048)\n\n");
    std::printf("| variant | type | registers | local bytes | blocks/SM |\n|---|---|---:|---:|---:|\n");
    const frt_gemv_type lab_types[] = { FRT_GEMV_Q4_K, FRT_GEMV_F32, FRT_GEMV_Q6_K_R, FRT_GEMV_Q8_0_R };
    for (const frt_gemv_type type : lab_types) {
        const size_t smem = type == FRT_GEMV_F32 ? 8192 + 1024 : 2048 + 512 + 1024;
        for (const lab_variant * v : variants) {
            lab::kernel_facts f;
            if (v->facts(type, smem, f)) {
                std::printf("| %s | %s | %d | %d | %d |\n", v->name, gemv_ref::type_name(type), f.regs, f.local_bytes,
                            f.blocks_per_sm);
            }
        }
    }
    std::printf("\n");
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2 || argv[1][0] == '-') {
        std::fprintf(stderr, "usage: gemv-bench OUT.jsonl [--shapes a,b] [--tokens 1,2,4] [--replays 30] "
                             "[--stream-mib 120] [--graph-ms 2] [--impls a,b] [--between] [--list] [--lab [--variants a,b]]\n");
        return 2;
    }
    const std::string        out_path = argv[1];
    std::vector<std::string> only, picked, impls{ "frt", "frt-bulk", "frt-exact" };
    std::vector<int>         tokens;
    bool                     lab_mode = false, between = false;
    int                      replays    = 30;
    double                   stream_mib = 120.0, graph_ms = 2.0;
    for (int i = 2; i < argc; ++i) {
        const std::string arg   = argv[i];
        auto              value = [&]() -> std::string {
            if (i + 1 >= argc) {
                fail(arg + " needs a value");
            }
            return argv[++i];
        };
        if (arg == "--shapes") {
            only = split_list(value());
        } else if (arg == "--tokens") {
            tokens.clear();
            for (const std::string & t : split_list(value())) {
                tokens.push_back(std::atoi(t.c_str()));
            }
        } else if (arg == "--replays") {
            replays = std::max(1, std::atoi(value().c_str()));
        } else if (arg == "--stream-mib") {
            stream_mib = std::atof(value().c_str());
        } else if (arg == "--graph-ms") {
            graph_ms = std::atof(value().c_str());
        } else if (arg == "--impls") {
            impls = split_list(value());
            for (const std::string & name : impls) {
                if (name != "frt" && name != "frt-bulk" && name != "frt-exact") {
                    fail("--impls: no kernel " + name + " (frt, frt-bulk, frt-exact)");
                }
            }
        } else if (arg == "--between") {
            between = true;
        } else if (arg == "--lab") {
            lab_mode = true;
        } else if (arg == "--variants") {
            picked = split_list(value());
        } else if (arg == "--list") {
            for (const shape_spec & s : shapes()) {
                std::printf("%-22s %-10s %5d -> %6d  %s\n", s.name, type_label(s).c_str(), s.k, out_rows(s), s.what);
            }
            std::printf("\n--lab variants:\n");
            for (const lab_variant & v : lab_variants()) {
                std::printf("%-12s %s\n", v.name, v.what);
            }
            return 0;
        } else {
            fail("unknown option " + arg + " (see the usage at the top of bench/tools/gemv-bench.cu)");
        }
    }
    for (const std::string & name : only) {
        if (std::none_of(shapes().begin(), shapes().end(), [&](const shape_spec & s) { return name == s.name; })) {
            fail("--shapes: no shape " + name + " (--list shows them)");
        }
    }
    for (const std::string & name : picked) {
        if (std::none_of(lab_variants().begin(), lab_variants().end(),
                         [&](const lab_variant & v) { return name == v.name; })) {
            fail("--variants: no variant " + name + " (--list shows them)");
        }
    }
    if (tokens.empty()) {
        tokens = lab_mode ? std::vector<int>{ 1, 2, 4, 8 } : std::vector<int>{ 1, 2, 3, 4, 5, 6, 7, 8 };
    }
    for (int t : tokens) {
        if (t < 1 || t > FRT_GEMV_MAX_TOKENS) {
            fail("--tokens: 1 to 8");
        }
    }
    std::FILE * out = std::fopen(out_path.c_str(), "w");
    if (!out) {
        fail("cannot write " + out_path);
    }
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    std::mt19937_64 rng(1);

    if (lab_mode && between) {
        fail("--between times the frt_gemv kernels, not --lab's variants");
    }
    if (lab_mode) {
        std::printf("%s, %d SMs: decode GEMV v2 experiments from CUDA graphs, median of %d replays\n\n", prop.name,
                    prop.multiProcessorCount, replays);
        run_probes(out, replays, graph_ms, stream_mib, stream);
        run_lab(out, only, picked, tokens, replays, graph_ms, stream_mib, rng, stream);
        std::fclose(out);
        return 0;
    }

    std::vector<result> results;
    for (const shape_spec & s : shapes()) {
        if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) {
            continue;
        }
        shape_weights weights = make_weights(s, stream_mib, rng, stream);
        for (int t : tokens) {
            // "frt": what frt_gemv picks; "frt-bulk", "frt-exact": the bulk kernel and the exact one
            // (mmvq's order for GGUF Q4_K/Q6_K/Q8_0, mmvf's for F32) beside it at 1 token.
            const bool exact_takes = std::all_of(s.segs.begin(), s.segs.end(), [](const seg_spec & sp) {
                return sp.type == Q4 || sp.type == F32 || ((sp.type == Q6 || sp.type == Q8) && (sp.gguf || sp.experts));
            });
            for (const frt_gemv_kernel kernel : { FRT_GEMV_KERNEL_AUTO, FRT_GEMV_KERNEL_BULK, FRT_GEMV_KERNEL_EXACT }) {
                if (kernel != FRT_GEMV_KERNEL_AUTO && t != 1) {
                    continue;
                }
                if (kernel == FRT_GEMV_KERNEL_EXACT && !exact_takes) {
                    continue;
                }
                const std::string impl = kernel == FRT_GEMV_KERNEL_AUTO   ? "frt"
                                         : kernel == FRT_GEMV_KERNEL_BULK ? "frt-bulk"
                                                                          : "frt-exact";
                if (std::find(impls.begin(), impls.end(), impl) == impls.end()) {
                    continue;
                }
                result            r    = run_shape(
                    s, weights, t, replays, graph_ms, rng, stream,
                    [kernel](const frt_gemv_args & a, cudaStream_t st) { return frt_gemv(a, st, kernel); },
                    std::getenv("FRT_GEMV_BULK_LAB") == nullptr,  // lab settings skip work: nothing to check
                    "frt_gemv (" + impl + ")", between);
                r.impl                 = impl;
                const double floor_us  = r.bytes / (kReadTbps * 1e6);
                const double budget_us = r.bytes / (0.7 * kReadTbps * 1e6) + 1.5;
                std::fprintf(out,
                             "{\"impl\":\"%s\",\"shape\":\"%s\",\"out\":%d,\"in\":%d,\"type\":\"%s\",\"tokens\":%d,"
                             "\"experts\":%d,\"bytes\":%" PRId64 ",\"us_median\":%.3f,\"us_min\":%.3f,\"us_max\":%.3f,"
                             "\"floor_us\":%.3f,\"budget_us\":%.3f,\"tbps\":%.3f,\"pass\":%s,\"launches\":%d,"
                             "\"copies\":%d,\"between_us\":%.3f}\n",
                             impl.c_str(), s.name, out_rows(s), s.k, type_label(s).c_str(), t,
                             s.segs[0].experts ? kUsed : 1, r.bytes, r.us_median, r.us_min, r.us_max, floor_us,
                             budget_us, r.bytes / r.us_median / 1e6, r.us_median <= budget_us ? "true" : "false",
                             r.launches, r.copies, r.between_us);
                std::fflush(out);
                std::fprintf(stderr, "gemv-bench: %s %s, %d tokens: %.2f us\n", impl.c_str(), s.name, t, r.us_median);
                results.push_back(r);
            }
        }
        CHECK(cudaFree(weights.pool));
    }
    std::fclose(out);

    std::printf("%s, frt_gemv from CUDA graphs, median of %d replays; floor = bytes / %.2f TB/s, "
                "budget = bytes / (0.7 x %.2f TB/s) + 1.5 us%s\n\n",
                prop.name, replays, kReadTbps, kReadTbps,
                between ? "; --between: each launch followed by a small PDL kernel, whose time alone is taken off" : "");
    std::printf("| shape | impl | tokens | out x in | type | MB | us | min-max | floor us | budget us | TB/s | pass |\n");
    std::printf("|---|---|---:|---|---|---:|---:|---|---:|---:|---:|---|\n");
    int failed = 0;
    for (const result & r : results) {
        const shape_spec & s         = *r.shape;
        const double       floor_us  = r.bytes / (kReadTbps * 1e6);
        const double       budget_us = r.bytes / (0.7 * kReadTbps * 1e6) + 1.5;
        const bool         pass      = r.us_median <= budget_us;
        failed += pass ? 0 : 1;
        std::printf("| %s | %s | %d | %d%s x %d | %s | %.2f | %.2f | %.2f-%.2f | %.2f | %.2f | %.2f | %s |\n", s.name,
                    r.impl.c_str(), r.tokens, out_rows(s), s.segs[0].experts ? " (x8)" : "", s.k, type_label(s).c_str(), r.bytes / 1e6,
                    r.us_median, r.us_min, r.us_max, floor_us, budget_us, r.bytes / r.us_median / 1e6,
                    pass ? "pass" : "FAIL");
    }
    std::printf("\n%zu rows, %d within budget, %d over\n", results.size(), (int) results.size() - failed, failed);
    return 0;
}
