// Decode GEMV microbenchmark, our side (issue 10): frt_gemv (vendor/csrc/gemv.cu) at every weight
// matvec shape of a qwen36-35b-a3b decode step (the names of bench/tools/gemv-stock.cpp, which
// times stock ggml; bench/tools/gemv-table.py joins the two) plus the packs our windows launch as
// one kernel, at 1..8 tokens. (The decode GEMV v2 lab and its streaming probes, --lab, were
// removed once the exact kernel replaced those candidates; their results are in docs/perf-notes.md
// and bench/results.)
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
// benchmark would time something else than the product).
//
// Writes one JSON line per (shape, tokens) to OUT (keys shape, out, in, type, tokens, bytes,
// us_median as gemv-stock's, plus impl "frt", experts, us_min, us_max, floor_us, budget_us, tbps,
// pass, launches, copies) and prints a markdown table last.
//
// Usage: gemv-bench OUT.jsonl [--shapes a,b] [--tokens 1,2,4] [--replays 30] [--stream-mib 120]
//                  [--graph-ms 2] [--impls frt,frt-regs,frt-bulk,frt-exact,frt-head] [--between | --after NAME]
//                  [--list]
//   --impls: which kernels to time (default frt, frt-bulk, frt-exact; frt: what frt_gemv picks,
//     frt-regs: the register kernel, frt-head: the head kernel where it applies)
//   --graph-ms: the least work a graph holds (launches = max(copies, 32 for experts, this / floor))
//   --between: a small kernel between the launches, as in decode, where a GEMV follows a norm, an
//     add or the routing rather than another GEMV: one block of 1024 threads, launched with PDL,
//     waiting for its predecessor and then writing the next launch's input (as ggml-cuda's
//     rms_norm of one row does). A GEMV that streams its weights before its wait overlaps such a
//     kernel only if its blocks can be resident beside it; back to back with itself it cannot
//     tell. us_median is then the pair's time less the small kernel's alone (between_us in the
//     JSON), the GEMV's cost in a decode-like sequence.
//   --after NAME: each launch preceded by a launch of shape NAME (same kernel, same tokens), as in
//     decode, where most GEMVs follow another one that fills every SM (two blocks of 512 threads
//     an SM take all the registers): the timed launch's blocks become resident only as the other's
//     leave, so what it stages before its wait has less time to land than back to back with
//     itself, where its predecessor is its own launch. us_median is then the pair's time less
//     NAME's alone (after_us in the JSON). E.g. --shapes ffn_gate_inp --after ssm_out: the router
//     after the GDN output projection; --shapes moe_gate_up_routed --after router_pack: the MoE
//     gate/up launch (its experts selected in the launch from the router's logits) after ROUTER,
//     as decode chains them. Unlike decode, the timed launch's input is not what NAME wrote: it
//     waits for NAME's end all the same, but reads an x (and logits) that stayed in L2.
// The exact kernel's switches reach it from the environment (GGML_FLASHRT_EXACT_*): every exact
// launch gets chunk counters, so GGML_FLASHRT_EXACT_CHUNKS=N times the chunked launches.
// Build (device; bench/device/gemv.sh does this and runs it):
//   nvcc -std=c++17 -O3 -arch=sm_90a -I vendor/csrc -I bench/tools bench/tools/gemv-bench.cu vendor/csrc/*.cu -o gemv-bench

#include "cuda-check.cuh"
#include "graph-timing.cuh"
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
#include <memory>
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
    // The expert segments' experts selected in the launch from kExperts router logits (the exact
    // kernel's routing, one token: MOE_TOPK inside the gate/up launch); the logits give each
    // selection's experts clear margins over the rest, so the selection is the fixed one.
    bool                  route      = false;
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
        { "router_pack", "RMS norm + router + shared-expert gate, one launch (ROUTER)", 2048,
          { { F32, 256 }, { F32, 1 } }, true },
        { "moe_gate_up_routed", "gate + up of 8 routed experts selected in the launch, shared gate + up (no SwiGLU)",
          2048, { { Q4, 512, true }, { Q4, 512, true }, { Q4, 512 }, { Q4, 512 } }, false, false, true },
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
    double             after_us   = 0.0;  // --after: the preceding shape's launch alone, taken off the above
};

// What is timed: frt_gemv launching `args` on a stream.
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
// --between's small kernel: waits for its predecessor, then rewrites x (n floats) from a pristine
// copy, so every GEMV launch multiplies the same vectors and each depends on the kernel before it.
__global__ void between_kernel(const float * src, float * x, int n) {
    frt_pdl_wait();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        x[i] = src[i];
    }
}

// The exact launches' chunk counters (frt_gemv_args::chunk_counters), zeroed once (each launch
// leaves them at zero): with GGML_FLASHRT_EXACT_CHUNKS=N in the environment the exact rows are
// those of launches that take their rows in chunks from a counter, as the overlay's are.
static unsigned * chunk_counters() {
    static unsigned * counters = [] {
        unsigned * c = nullptr;
        CHECK(cudaMalloc(&c, FRT_GEMV_CHUNK_COUNTER_WORDS * sizeof(unsigned)));
        CHECK(cudaMemset(c, 0, FRT_GEMV_CHUNK_COUNTER_WORDS * sizeof(unsigned)));
        return c;
    }();
    return counters;
}

// The inputs of one (shape, tokens), on the device: one vector a token (a slot for down
// projections), the norm weight, the outputs (in the shape's weights), and 32 expert selections
// (launch i takes selection i % 32, 8 distinct experts a token, no expert shared by two tokens or by
// neighbouring launches). args_for(i): launch i's arguments (weight copy i % copies).
struct shape_inputs {
    const shape_spec &   s;
    shape_weights &      sw;
    int                  tokens, n_vec;
    int64_t              x_stride, bytes = 0;
    std::vector<float>   x, norm;
    std::vector<int32_t> ids;
    float *              d_x = nullptr, *d_norm = nullptr;
    int32_t *            d_ids = nullptr;
    // route: each selection's router logits (kExperts), and where its launch writes ids and weights.
    float *              d_logits = nullptr, *d_route_weights = nullptr;
    int32_t *            d_route_ids = nullptr;

    shape_inputs(const shape_spec & shape, shape_weights & weights, int n_tokens, std::mt19937_64 & rng) :
        s(shape),
        sw(weights),
        tokens(n_tokens),
        n_vec(n_tokens * (shape.x_per_slot ? kUsed : 1)),
        x_stride(shape.k) {
        std::normal_distribution<float> normal(0.0f, 1.0f);
        x.resize((size_t) n_vec * s.k);
        norm.resize(s.k);
        for (float & v : x) {
            v = normal(rng);
        }
        for (float & v : norm) {
            v = 0.5f + (float) (rng() % 1000) / 1000.0f;
        }
        d_x    = to_device(x);
        d_norm = to_device(norm);
        for (size_t si = 0; si < s.segs.size(); ++si) {
            const seg_spec & sp = s.segs[si];
            bytes += (int64_t) sp.rows * gemv_ref::gguf_row_bytes(sp.type, s.k) * (sp.experts ? kUsed * tokens : 1);
            sw.segs[si].n_out = sp.experts ? tokens * kUsed : tokens;
            CHECK(cudaMalloc(&sw.segs[si].out, (size_t) sw.segs[si].n_out * sp.rows * sizeof(float)));
        }
        ids.resize((size_t) kSelections * tokens * kUsed);
        for (int sel = 0; sel < kSelections; ++sel) {
            for (int t = 0; t < tokens; ++t) {
                for (int j = 0; j < kUsed; ++j) {
                    ids[((size_t) sel * tokens + t) * kUsed + j] = (kUsed * (sel * tokens + t) + j) % kExperts;
                }
            }
        }
        d_ids = to_device(ids);
        if (s.route) {
            // Selection sel's experts at 4, 3.75, ... 2.25 in their order, the others below 1:
            // the softmax top-k picks them in that order whatever the draw.
            std::uniform_real_distribution<float> rest(-3.0f, 1.0f);
            std::vector<float>                    logits((size_t) kSelections * kExperts);
            for (int sel = 0; sel < kSelections; ++sel) {
                for (int e = 0; e < kExperts; ++e) {
                    logits[(size_t) sel * kExperts + e] = rest(rng);
                }
                for (int j = 0; j < kUsed; ++j) {
                    logits[(size_t) sel * kExperts + ids[(size_t) sel * kUsed + j]] = 4.0f - 0.25f * j;
                }
            }
            d_logits = to_device(logits);
            CHECK(cudaMalloc(&d_route_ids, (size_t) kSelections * kUsed * sizeof(int32_t)));
            CHECK(cudaMalloc(&d_route_weights, (size_t) kSelections * kUsed * sizeof(float)));
        }
    }

    shape_inputs(const shape_inputs &)             = delete;
    shape_inputs & operator=(const shape_inputs &) = delete;

    ~shape_inputs() {
        for (seg_data & d : sw.segs) {
            CHECK(cudaFree(d.out));
            d.out = nullptr;
        }
        CHECK(cudaFree(d_x));
        CHECK(cudaFree(d_norm));
        CHECK(cudaFree(d_ids));
        CHECK(cudaFree(d_logits));
        CHECK(cudaFree(d_route_ids));
        CHECK(cudaFree(d_route_weights));
    }

    frt_gemv_args args_for(int launch_index) const {
        frt_gemv_args a{};
        a.x           = d_x;
        a.x_stride    = x_stride;
        a.k           = s.k;
        a.tokens      = tokens;
        a.x_per_token = s.x_per_slot ? kUsed : 1;
        a.norm        = s.norm ? d_norm : nullptr;
        a.eps         = 1e-6f;
        a.n_segments  = (int) s.segs.size();
        a.chunk_counters = chunk_counters();  // read by the exact kernel only
        const int sel = launch_index % kSelections;
        if (s.route) {
            a.route_logits    = d_logits + (size_t) sel * kExperts;
            a.route_n_experts = kExperts;
            a.route_norm      = true;
            a.route_clamp     = 6.103515625e-5f;
            a.route_scale     = 1.0f;
            a.route_ids       = d_route_ids + (size_t) sel * kUsed;
            a.route_weights   = d_route_weights + (size_t) sel * kUsed;
        }
        for (size_t si = 0; si < s.segs.size(); ++si) {
            const seg_spec &   sp = s.segs[si];
            const seg_data &   d  = sw.segs[si];
            frt_gemv_segment & g  = a.seg[si];
            g.type                = d.type;
            g.w                   = d.copies[sp.experts ? 0 : launch_index % sw.copies];
            g.rows                = sp.rows;
            g.row_stride          = d.row_stride;
            g.out                 = d.out;
            g.out_stride          = sp.rows;
            if (sp.experts) {
                g.ids           = s.route ? a.route_ids : d_ids + (size_t) sel * tokens * kUsed;
                g.ids_stride    = kUsed;
                g.n_used        = kUsed;
                g.n_experts     = kExperts;
                g.expert_stride = (int64_t) sp.rows * d.row_stride;
            }
        }
        return a;
    }
};

// --after: the preceding shape's inputs and how it is launched.
struct preceding {
    const shape_inputs & in;
    frt_gemv_kernel      kernel;

    cudaError_t launch(const frt_gemv_args & a, cudaStream_t st) const { return frt_gemv(a, st, kernel); }
};

// Checks (when `checked`) and times frt_gemv on `kernel` at (shape, tokens). `who` names it in messages.
// between: --between (a small kernel after each launch; the result is the GEMV's share). after:
// --after (each launch preceded by one of that shape's; the result is the timed one's share).
result run_shape(const shape_spec & s, shape_weights & sw, int tokens, int replays, double graph_ms,
                 std::mt19937_64 & rng, cudaStream_t stream, frt_gemv_kernel kernel, bool checked,
                 const std::string & who, bool between = false, const preceding * after = nullptr) {
    const shape_inputs in(s, sw, tokens, rng);
    const launcher     launch = [kernel](const frt_gemv_args & a, cudaStream_t st) { return frt_gemv(a, st, kernel); };
    if (const char * why = frt_gemv_unsupported(in.args_for(0), kernel)) {
        fail(std::string(s.name) + ": " + why);
    }
    if (after != nullptr) {
        if (const char * why = frt_gemv_unsupported(after->in.args_for(0), after->kernel)) {
            fail(std::string("--after ") + after->in.s.name + ": " + why);
        }
    }
    if (checked) {
        check_launch(s, in.args_for(0), sw.segs, tokens, in.x, in.x_stride, in.norm,
                     std::vector<int32_t>(in.ids.begin(), in.ids.begin() + tokens * kUsed), launch, who);
        if (s.route) {  // the outputs above were checked against the fixed selection: was it the one made?
            std::vector<int32_t> routed(kUsed);
            CHECK(cudaMemcpy(routed.data(), in.d_route_ids, kUsed * sizeof(int32_t), cudaMemcpyDeviceToHost));
            for (int j = 0; j < kUsed; ++j) {
                if (routed[j] != in.ids[j]) {
                    fail(who + ", " + s.name + ": routed expert " + std::to_string(j) + " is " +
                         std::to_string(routed[j]) + ", the logits select " + std::to_string(in.ids[j]));
                }
            }
        }
    } else {
        // One launch outside the capture all the same: module loading, attributes, launch errors.
        CHECK(launch(in.args_for(0), 0));
        CHECK(cudaDeviceSynchronize());
    }
    if (after != nullptr) {  // the same for the preceding shape's launch
        CHECK(after->launch(after->in.args_for(0), 0));
        CHECK(cudaDeviceSynchronize());
    }

    // The graph: enough launches to cycle through every copy and selection, and graph_ms of work.
    const int    copies   = sw.copies;
    const double est_us   = std::max(2.0, in.bytes / (kReadTbps * 1e6));
    const int    launches = std::max({ copies, s.segs[0].experts ? kSelections : 1, (int) (1000.0 * graph_ms / est_us) });
    float *      d_x_src  = between ? to_device(in.x) : nullptr;
    const auto   add_between = [&](cudaStream_t st) {
        CHECK(frt_launch(between_kernel, dim3(1), dim3(1024), 0, st, (const float *) d_x_src, in.d_x, in.n_vec * s.k));
    };
    timing       tm       = time_graph(launches, replays, stream, [&](int i, cudaStream_t st) {
        if (after != nullptr) {
            CHECK(after->launch(after->in.args_for(i), st));
        }
        CHECK(launch(in.args_for(i), st));
        if (between) {
            add_between(st);
        }
    });
    double between_us = 0.0, after_us = 0.0;
    if (between) {
        between_us = time_graph(launches, replays, stream, [&](int, cudaStream_t st) { add_between(st); }).median;
        tm         = { tm.median - between_us, tm.least - between_us, tm.most - between_us };
        CHECK(cudaFree(d_x_src));
    }
    if (after != nullptr) {
        after_us = time_graph(launches, replays, stream, [&](int i, cudaStream_t st) {
                       CHECK(after->launch(after->in.args_for(i), st));
                   }).median;
        tm       = { tm.median - after_us, tm.least - after_us, tm.most - after_us };
    }
    return { "", &s, tokens, launches, copies, in.bytes, tm.median, tm.least, tm.most, between_us, after_us };
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

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 2 || argv[1][0] == '-') {
        std::fprintf(stderr, "usage: gemv-bench OUT.jsonl [--shapes a,b] [--tokens 1,2,4] [--replays 30] "
                             "[--stream-mib 120] [--graph-ms 2] [--impls a,b] [--between | --after NAME] [--list]\n");
        return 2;
    }
    const std::string        out_path = argv[1];
    std::vector<std::string> only, impls{ "frt", "frt-bulk", "frt-exact" };
    std::vector<int>         tokens;
    bool                     between = false;
    std::string              after_name;  // --after
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
                if (name != "frt" && name != "frt-regs" && name != "frt-bulk" && name != "frt-exact" &&
                    name != "frt-head") {
                    fail("--impls: no kernel " + name + " (frt, frt-regs, frt-bulk, frt-exact, frt-head)");
                }
            }
        } else if (arg == "--between") {
            between = true;
        } else if (arg == "--after") {
            after_name = value();
        } else if (arg == "--list") {
            for (const shape_spec & s : shapes()) {
                std::printf("%-22s %-10s %5d -> %6d  %s\n", s.name, type_label(s).c_str(), s.k, out_rows(s), s.what);
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
    const auto shape_named = [](const std::string & name) -> const shape_spec * {
        for (const shape_spec & s : shapes()) {
            if (name == s.name) {
                return &s;
            }
        }
        return nullptr;
    };
    const shape_spec * after_shape = nullptr;
    if (!after_name.empty()) {
        after_shape = shape_named(after_name);
        if (after_shape == nullptr) {
            fail("--after: no shape " + after_name + " (--list shows them)");
        }
        if (between) {
            fail("--after and --between: one kernel before or after each launch, not both");
        }
    }
    if (tokens.empty()) {
        tokens = { 1, 2, 3, 4, 5, 6, 7, 8 };
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
    // --after's weights, made once (its own copies, apart from a timed shape's of the same name).
    shape_weights after_weights;
    if (after_shape != nullptr) {
        after_weights = make_weights(*after_shape, stream_mib, rng, stream);
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
            const bool head_takes = s.segs.size() == 1 && s.segs[0].type == Q6 && !s.segs[0].gguf &&
                                    !s.segs[0].experts && (s.k == 2048 || s.k == 4096);
            for (const frt_gemv_kernel kernel : { FRT_GEMV_KERNEL_AUTO, FRT_GEMV_KERNEL_REGISTERS, FRT_GEMV_KERNEL_BULK,
                                                  FRT_GEMV_KERNEL_EXACT, FRT_GEMV_KERNEL_HEAD }) {
                if (kernel != FRT_GEMV_KERNEL_AUTO && kernel != FRT_GEMV_KERNEL_REGISTERS && t != 1) {
                    continue;
                }
                if ((kernel == FRT_GEMV_KERNEL_EXACT && !exact_takes) || (kernel == FRT_GEMV_KERNEL_HEAD && !head_takes)) {
                    continue;
                }
                if (s.route && (kernel != FRT_GEMV_KERNEL_EXACT || t != 1)) {  // only the exact kernel routes, one token
                    continue;
                }
                const std::string impl = kernel == FRT_GEMV_KERNEL_AUTO        ? "frt"
                                         : kernel == FRT_GEMV_KERNEL_REGISTERS ? "frt-regs"
                                         : kernel == FRT_GEMV_KERNEL_BULK      ? "frt-bulk"
                                         : kernel == FRT_GEMV_KERNEL_EXACT     ? "frt-exact"
                                                                               : "frt-head";
                if (std::find(impls.begin(), impls.end(), impl) == impls.end()) {
                    continue;
                }
                // --after: the preceding shape on the same kernel where it takes it, else on what
                // frt_gemv picks.
                std::unique_ptr<shape_inputs> after_inputs;
                std::unique_ptr<preceding>    after;
                if (after_shape != nullptr) {
                    after_inputs = std::make_unique<shape_inputs>(*after_shape, after_weights, t, rng);
                    const frt_gemv_kernel after_kernel =
                        frt_gemv_unsupported(after_inputs->args_for(0), kernel) == nullptr ? kernel : FRT_GEMV_KERNEL_AUTO;
                    after = std::make_unique<preceding>(preceding{ *after_inputs, after_kernel });
                }
                result r = run_shape(
                    s, weights, t, replays, graph_ms, rng, stream, kernel,
                    std::getenv("FRT_GEMV_BULK_LAB") == nullptr,  // lab settings skip work: nothing to check
                    "frt_gemv (" + impl + ")", between, after.get());
                r.impl                 = impl;
                const double floor_us  = r.bytes / (kReadTbps * 1e6);
                const double budget_us = r.bytes / (0.7 * kReadTbps * 1e6) + 1.5;
                std::fprintf(out,
                             "{\"impl\":\"%s\",\"shape\":\"%s\",\"out\":%d,\"in\":%d,\"type\":\"%s\",\"tokens\":%d,"
                             "\"experts\":%d,\"bytes\":%" PRId64 ",\"us_median\":%.3f,\"us_min\":%.3f,\"us_max\":%.3f,"
                             "\"floor_us\":%.3f,\"budget_us\":%.3f,\"tbps\":%.3f,\"pass\":%s,\"launches\":%d,"
                             "\"copies\":%d,\"between_us\":%.3f,\"after\":\"%s\",\"after_us\":%.3f}\n",
                             impl.c_str(), s.name, out_rows(s), s.k, type_label(s).c_str(), t,
                             s.segs[0].experts ? kUsed : 1, r.bytes, r.us_median, r.us_min, r.us_max, floor_us,
                             budget_us, r.bytes / r.us_median / 1e6, r.us_median <= budget_us ? "true" : "false",
                             r.launches, r.copies, r.between_us, after_name.c_str(), r.after_us);
                std::fflush(out);
                std::fprintf(stderr, "gemv-bench: %s %s, %d tokens: %.2f us\n", impl.c_str(), s.name, t, r.us_median);
                results.push_back(r);
            }
        }
        CHECK(cudaFree(weights.pool));
    }
    if (after_shape != nullptr) {
        CHECK(cudaFree(after_weights.pool));
    }
    std::fclose(out);

    const std::string after_note =
        after_shape == nullptr ? ""
                               : "; --after " + after_name + ": each launch preceded by one of " + after_name +
                                     ", whose time alone is taken off";
    std::printf("%s, frt_gemv from CUDA graphs, median of %d replays; floor = bytes / %.2f TB/s, "
                "budget = bytes / (0.7 x %.2f TB/s) + 1.5 us%s%s\n\n",
                prop.name, replays, kReadTbps, kReadTbps,
                between ? "; --between: each launch followed by a small PDL kernel, whose time alone is taken off" : "",
                after_note.c_str());
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
