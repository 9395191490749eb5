// Stock side of the decode GEMV microbenchmark (issue 10): how long stock ggml takes for each weight
// matvec of one qwen36-35b-a3b decode step, at 1..8 tokens, counting every launch stock makes for
// it (the quantize_q8_1 of the input and, where upstream fuses gate+up+SwiGLU, the fused kernel).
// bench/tools/gemv-bench.cu measures ours; bench/tools/gemv-table.py joins the two.
//
// The shapes are those of `cargo xtask synth --preset qwen36-35b-a3b` (xtask/src/synth.rs); shapes
// that stock runs the same way (kind, type, in, out) are measured once and list their tensors.
//
// Each shape is built as ggml graphs of many independent copies of the unit (a MUL_MAT, or the node
// pattern the model's graph has: MUL_MAT_ID gate, MUL_MAT_ID up, GLU), each over its own weight
// tensor, all reading one F32 input, and computed on the backend with ggml_backend_graph_compute,
// which on CUDA captures the graph once and then replays it, as in decode. The weights are random
// valid blocks (random quants, finite positive half scales) in a WEIGHTS buffer, the expert tensors
// full size (256 experts) with the selected experts filled. Two graphs per (shape, tokens): A holds
// K units, B the same K plus K more (starting elsewhere: ggml-cuda keys its CUDA graphs by the
// first node). K is chosen so that A alone streams --stream-mib of weights (default 120 MiB, at
// least twice the L2 of an H100/H200), so every unit reads its weights from DRAM in both. The time
// per unit is the slope
//     (T(B) - T(A)) / K
// where T is the time per graph computation, measured from the host over a batch of computations
// queued back to back (GPU-bound: the host only compares node properties and launches the CUDA
// graph, overlapped with the GPU's work). The slope removes what a graph costs once (launch,
// ramp-up, tail), which a decode step pays once for all of its ~1600 kernels, not per matvec.
// Rounds alternate A and B; the median over rounds is reported, with the smallest and largest.
//
// Checks, each fatal: on CUDA the graphs must have been captured (the pin's "CUDA graph warmup
// complete" log line) and never re-captured while timing; each graph's nodes must be in the order
// upstream's fusion looks for; and the first unit's output must match a float64 CPU reference
// (ggml's own dequantization of the weights read back from the device) within a bound derived from
// the computation. The inputs make stock's int8 quantization of the activations exact: each row is
// one power of two s times integers in [-60, 60] with one element of +-127 per 32 (so amax/127 = s,
// also for 256-element blocks), block sums stay below 2048 (exact in half). What remains is float
// rounding: at most 2 (in + 8) 2^-24 of sum(|w| |x|) (|w| of a Q4_K weight: its scale and min parts
// added), plus 2^-9 of it for F32 weights, which stock may multiply as TF32 (mmf, cuBLAS).
//
// Writes one JSON line per (shape, tokens) to OUT with the keys of gemv-bench's lines
// (shape, out, in, type, tokens, bytes, us_median) plus impl "stock", tensors, per_step (matvecs
// of this shape per decode step), experts (matrices per token: 1, or 8 selected of 256), us_min,
// us_max, units_a, units_b; prints a markdown table. out is the rows one unit reads per matrix (gate
// and up counted together), bytes the weight bytes it reads (experts: 8 distinct per token, no
// expert shared between tokens).
//
// Usage: gemv-stock OUT.jsonl [--device CUDA0] [--shapes a,b] [--tokens 1-8] [--rounds 11]
//                  [--stream-mib 120] [--batch-ms 10] [--seed 1] [--list]
// Build against a llama.cpp build's ggml (bench/device/gemv-stock.sh does this), one line:
//   c++ -std=c++17 -O2 -I<llama.cpp>/ggml/include bench/tools/gemv-stock.cpp -o gemv-stock
//       -pthread -L<build>/bin -lggml -lggml-base -Wl,-rpath,<build>/bin
// With the overlay's build, run with GGML_CUDA_FLASHRT_DISABLE=1 for stock kernels. --device CPU
// runs the same graphs and checks on ggml's CPU backend (a functional check; its times mean nothing).

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int64_t k_n_expert      = 256;
constexpr int64_t k_n_expert_used = 8;
constexpr int     k_max_tokens    = 8;

[[noreturn]] void fail(const char * format, ...) {
    std::va_list args;
    va_start(args, format);
    std::fputs("gemv-stock: ", stderr);
    std::vfprintf(stderr, format, args);
    std::fputc('\n', stderr);
    va_end(args);
    std::exit(1);
}

enum class unit_kind {
    matvec,       // MUL_MAT
    matvec_glu,   // MUL_MAT gate, MUL_MAT up, GLU: upstream fuses them at one token
    experts,      // MUL_MAT_ID, each selected expert with its own input row (down projection)
    experts_glu,  // MUL_MAT_ID gate, MUL_MAT_ID up on one input row, GLU: fused up to 8 tokens
};

bool is_glu(unit_kind kind) {
    return kind == unit_kind::matvec_glu || kind == unit_kind::experts_glu;
}

bool is_experts(unit_kind kind) {
    return kind == unit_kind::experts || kind == unit_kind::experts_glu;
}

struct shape_spec {
    const char * name;
    const char * tensors;
    int          per_step;  // units of this shape in one decode step
    unit_kind    kind;
    ggml_type    type;
    int64_t      n_in;
    int64_t      n_out;     // rows of one matrix (one expert; of the gate, and as many in the up)
};

// qwen35moe at the qwen36-35b-a3b preset: hidden 2048, 40 layers (every 4th full attention, the
// others Gated DeltaNet), 256 experts / 8 used of FFN 512, shared expert FFN 512, vocab 248320.
// 431 units per decode step, 351 of them with a quantized weight (one quantize_q8_1 each). Only the
// matvecs are timed: not the ops after them, not even where upstream fuses one into the matvec
// kernel (attn_output's residual ADD at one token), nor what the GLU units' outputs feed.
const shape_spec k_shapes[] = {
    { "attn_qkv",           "attn_qkv (GDN), attn_q",              40, unit_kind::matvec,      GGML_TYPE_Q4_K, 2048,   8192 },
    { "attn_gate",          "attn_gate (GDN)",                     30, unit_kind::matvec,      GGML_TYPE_Q4_K, 2048,   4096 },
    { "ssm_alpha",          "ssm_alpha, ssm_beta (GDN)",           60, unit_kind::matvec,      GGML_TYPE_Q8_0, 2048,     32 },
    { "ssm_out",            "ssm_out (GDN), attn_output",          40, unit_kind::matvec,      GGML_TYPE_Q4_K, 4096,   2048 },
    { "attn_k",             "attn_k",                              10, unit_kind::matvec,      GGML_TYPE_Q4_K, 2048,    512 },
    { "attn_v",             "attn_v",                              10, unit_kind::matvec,      GGML_TYPE_Q6_K, 2048,    512 },
    { "ffn_gate_inp",       "ffn_gate_inp (router)",               40, unit_kind::matvec,      GGML_TYPE_F32,  2048,    256 },
    { "ffn_gate_inp_shexp", "ffn_gate_inp_shexp",                  40, unit_kind::matvec,      GGML_TYPE_F32,  2048,      1 },
    { "ffn_gate_up_shexp",  "ffn_gate_shexp + ffn_up_shexp",       40, unit_kind::matvec_glu,  GGML_TYPE_Q4_K, 2048,    512 },
    { "ffn_down_shexp",     "ffn_down_shexp",                      40, unit_kind::matvec,      GGML_TYPE_Q6_K,  512,   2048 },
    { "ffn_gate_up_exps",   "ffn_gate_exps + ffn_up_exps (8/256)", 40, unit_kind::experts_glu, GGML_TYPE_Q4_K, 2048,    512 },
    { "ffn_down_exps",      "ffn_down_exps (8/256)",               40, unit_kind::experts,     GGML_TYPE_Q6_K,  512,   2048 },
    { "output",             "output (LM head)",                     1, unit_kind::matvec,      GGML_TYPE_Q6_K, 2048, 248320 },
};

struct options {
    std::string              out_path;
    std::string              device = "CUDA0";
    std::vector<std::string> shapes;  // empty: all
    std::vector<int>         tokens = { 1, 2, 3, 4, 5, 6, 7, 8 };
    int                      rounds     = 11;
    double                   stream_mib = 120.0;
    double                   batch_ms   = 10.0;
    uint64_t                 seed       = 1;
    bool                     list       = false;
};

// ---- sizes ----

int64_t matrices_per_unit(const shape_spec & s) {
    return is_glu(s.kind) ? 2 : 1;
}

// Matrices one unit reads per token: 1, or the selected experts.
int64_t experts_per_token(const shape_spec & s) {
    return is_experts(s.kind) ? k_n_expert_used : 1;
}

// Weight bytes one unit reads at n_tokens (experts: distinct for every token).
int64_t unit_bytes(const shape_spec & s, int n_tokens) {
    const int64_t matrix = (int64_t) ggml_row_size(s.type, s.n_in) * s.n_out;
    const int64_t n_matrices = is_experts(s.kind) ? k_n_expert_used * n_tokens : 1;
    return matrix * n_matrices * matrices_per_unit(s);
}

// Rows of the input: one per token, or one per (token, selected expert) for the down projection.
int64_t input_rows(const shape_spec & s, int n_tokens) {
    return (s.kind == unit_kind::experts ? k_n_expert_used : 1) * n_tokens;
}

// ---- random data ----

void put_half(uint8_t * dst, float value) {
    const ggml_fp16_t h = ggml_fp32_to_fp16(value);
    std::memcpy(dst, &h, sizeof(h));
}

// n_blocks random valid blocks of `type`: random quant bytes, positive finite half scales. Block
// layouts as ggml-common.h at the pin (checked against ggml_type_size).
std::vector<uint8_t> random_blocks(ggml_type type, size_t n_blocks, std::mt19937_64 & rng) {
    const size_t block = ggml_type_size(type);
    std::vector<uint8_t> bytes(n_blocks * block);
    if (type == GGML_TYPE_F32) {
        std::uniform_real_distribution<float> value(-0.05f, 0.05f);
        for (size_t i = 0; i < n_blocks; ++i) {
            const float v = value(rng);
            std::memcpy(bytes.data() + i * block, &v, sizeof(v));
        }
        return bytes;
    }
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
        const uint64_t r = rng();
        std::memcpy(bytes.data() + i, &r, 8);
    }
    for (size_t i = bytes.size() / 8 * 8; i < bytes.size(); ++i) {
        bytes[i] = (uint8_t) rng();
    }
    std::uniform_real_distribution<float> scale_exp(-12.0f, -8.0f);
    for (size_t i = 0; i < n_blocks; ++i) {
        uint8_t * b = bytes.data() + i * block;
        switch (type) {
            case GGML_TYPE_Q4_K:  // d, dmin, scales[12], qs[128]
                put_half(b + 0, std::exp2(scale_exp(rng)));
                put_half(b + 2, std::exp2(scale_exp(rng)));
                break;
            case GGML_TYPE_Q6_K:  // ql[128], qh[64], scales[16], d
                put_half(b + 208, std::exp2(scale_exp(rng)));
                break;
            case GGML_TYPE_Q8_0:  // d, qs[32]
                put_half(b + 0, std::exp2(scale_exp(rng)));
                break;
            default:
                fail("no random blocks for type %s", ggml_type_name(type));
        }
    }
    return bytes;
}

void check_block_layouts() {
    const std::pair<ggml_type, size_t> expected[] = {
        { GGML_TYPE_Q4_K, 144 }, { GGML_TYPE_Q6_K, 210 }, { GGML_TYPE_Q8_0, 34 }, { GGML_TYPE_F32, 4 },
    };
    for (const auto & [type, size] : expected) {
        if (ggml_type_size(type) != size) {
            fail("%s blocks are %zu bytes here, %zu at the pin: update random_blocks for this ggml",
                 ggml_type_name(type), ggml_type_size(type), size);
        }
    }
}

// Input rows whose int8 quantization by stock is exact (see the header): a power of two times
// integers in [-60, 60], one element of +-127 in every 32.
std::vector<float> exact_input(int64_t n_rows, int64_t n_in, std::mt19937_64 & rng) {
    std::vector<float> x(n_rows * n_in);
    std::uniform_int_distribution<int> quant(-60, 60);
    std::uniform_int_distribution<int> exponent(-6, -3);
    std::uniform_int_distribution<int> position(0, 31);
    for (int64_t r = 0; r < n_rows; ++r) {
        const float s = std::ldexp(1.0f, exponent(rng));
        float * row = x.data() + r * n_in;
        for (int64_t i = 0; i < n_in; ++i) {
            row[i] = s * quant(rng);
        }
        for (int64_t b = 0; b < n_in; b += 32) {
            row[b + position(rng)] = s * (rng() % 2 ? 127.0f : -127.0f);
        }
    }
    return x;
}

// ---- logging: count the CUDA backend's graph captures ----

struct log_state {
    int  captures   = 0;  // "CUDA graph warmup complete": this computation is captured
    int  recaptures = 0;  // "CUDA graph warmup reset": properties changed after a capture
    bool forwarding = false;
};

// Counts the debug lines above and passes every other message on to stderr.
void log_callback(ggml_log_level level, const char * text, void * user_data) {
    log_state & log = *static_cast<log_state *>(user_data);
    if (level == GGML_LOG_LEVEL_DEBUG) {
        log.captures += std::strstr(text, "CUDA graph warmup complete") != nullptr;
        log.recaptures += std::strstr(text, "CUDA graph warmup reset") != nullptr;
        log.forwarding = false;
        return;
    }
    if (level != GGML_LOG_LEVEL_CONT) {
        log.forwarding = true;
    }
    if (log.forwarding) {
        std::fputs(text, stderr);
    }
}

// ---- ggml helpers ----

struct context_deleter {
    void operator()(ggml_context * ctx) const { ggml_free(ctx); }
};
using context_ptr = std::unique_ptr<ggml_context, context_deleter>;

struct buffer_deleter {
    void operator()(ggml_backend_buffer_t buffer) const { ggml_backend_buffer_free(buffer); }
};
using buffer_ptr = std::unique_ptr<ggml_backend_buffer, buffer_deleter>;

struct backend_deleter {
    void operator()(ggml_backend_t backend) const { ggml_backend_free(backend); }
};
using backend_ptr = std::unique_ptr<ggml_backend, backend_deleter>;

context_ptr new_context(size_t n_tensors, size_t extra_bytes) {
    ggml_init_params params = {};
    params.mem_size   = n_tensors * ggml_tensor_overhead() + extra_bytes + 1024 * 1024;
    params.mem_buffer = nullptr;
    params.no_alloc   = true;
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        fail("ggml_init failed for %zu tensors", n_tensors);
    }
    return context_ptr(ctx);
}

buffer_ptr allocate(ggml_context * ctx, ggml_backend_dev_t device, const char * what) {
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(device);
    const size_t need = ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, buft);
    size_t free = 0;
    size_t total = 0;
    ggml_backend_dev_memory(device, &free, &total);
    if (free != 0 && need > free) {
        fail("%s needs %.2f GiB on %s, %.2f GiB free: lower --stream-mib or run fewer --shapes", what,
             need / 1073741824.0, ggml_backend_dev_name(device), free / 1073741824.0);
    }
    ggml_backend_buffer_t buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
    if (buffer == nullptr) {
        fail("allocating %s (%.2f GiB) on %s failed", what, need / 1073741824.0, ggml_backend_dev_name(device));
    }
    return buffer_ptr(buffer);
}

// ---- one shape ----

struct unit_nodes {
    ggml_tensor * weights[2] = {};  // gate (or the only matrix), up
    ggml_tensor * result     = nullptr;
    int           n_nodes    = 0;   // graph nodes one unit adds
};

struct weight_set {
    context_ptr                ctx;
    buffer_ptr                 buffer;
    std::vector<ggml_tensor *> matrices;  // unit u: matrices_per_unit entries from u * that
};

// Rows of one matrix as stored: [n_in, n_out] or [n_in, n_out, n_expert].
ggml_tensor * new_matrix(ggml_context * ctx, const shape_spec & s) {
    if (is_experts(s.kind)) {
        return ggml_new_tensor_3d(ctx, s.type, s.n_in, s.n_out, k_n_expert);
    }
    return ggml_new_tensor_2d(ctx, s.type, s.n_in, s.n_out);
}

// Fills the matrices from a pool of random blocks (the contents do not matter to DRAM, only the
// addresses; a pool keeps the fill cheap), expert tensors only at the selected experts.
weight_set make_weights(const shape_spec & s, int64_t n_units, const std::vector<int32_t> & used_experts,
                        ggml_backend_dev_t device, std::mt19937_64 & rng) {
    weight_set w;
    const int64_t n_matrices = n_units * matrices_per_unit(s);
    w.ctx = new_context(n_matrices, 0);
    for (int64_t i = 0; i < n_matrices; ++i) {
        w.matrices.push_back(new_matrix(w.ctx.get(), s));
    }
    w.buffer = allocate(w.ctx.get(), device, "the weights");
    ggml_backend_buffer_set_usage(w.buffer.get(), GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

    const size_t block = ggml_type_size(s.type);
    const size_t pool_blocks = (size_t) (16 << 20) / block;
    const std::vector<uint8_t> pool = random_blocks(s.type, pool_blocks, rng);
    size_t pool_offset = 0;
    const auto fill = [&](ggml_tensor * t, size_t offset, size_t size) {
        while (size > 0) {
            const size_t n = std::min(size, pool.size() - pool_offset);
            ggml_backend_tensor_set(t, pool.data() + pool_offset, offset, n);
            offset += n;
            size -= n;
            pool_offset = (pool_offset + n) % pool.size();
        }
        // the next tensor starts elsewhere in the pool, still on a block boundary
        pool_offset = (pool_offset + 977 * block) % pool.size();
    };
    for (ggml_tensor * t : w.matrices) {
        if (is_experts(s.kind)) {
            for (const int32_t e : used_experts) {
                fill(t, e * t->nb[2], t->nb[2]);
            }
        } else {
            fill(t, 0, ggml_nbytes(t));
        }
    }
    return w;
}

// Adds one unit's nodes, in the order the model's graph has them (gate, up, GLU).
unit_nodes add_unit(ggml_context * ctx, const shape_spec & s, ggml_tensor * const * matrices, ggml_tensor * x,
                    ggml_tensor * ids) {
    unit_nodes u;
    u.weights[0] = matrices[0];
    u.weights[1] = is_glu(s.kind) ? matrices[1] : nullptr;
    const auto product = [&](ggml_tensor * w) {
        return is_experts(s.kind) ? ggml_mul_mat_id(ctx, w, x, ids) : ggml_mul_mat(ctx, w, x);
    };
    if (is_glu(s.kind)) {
        ggml_tensor * gate = product(u.weights[0]);
        ggml_tensor * up   = product(u.weights[1]);
        u.result  = ggml_swiglu_split(ctx, gate, up);
        u.n_nodes = 3;
    } else {
        u.result  = product(u.weights[0]);
        u.n_nodes = 1;
    }
    return u;
}

// Upstream fuses gate+up+GLU only when the three are consecutive nodes, gate first.
void check_node_order(ggml_cgraph * graph, const std::vector<const unit_nodes *> & order, const shape_spec & s) {
    const ggml_op product = is_experts(s.kind) ? GGML_OP_MUL_MAT_ID : GGML_OP_MUL_MAT;
    int i = 0;
    for (const unit_nodes * u : order) {
        bool ok = ggml_graph_node(graph, i + u->n_nodes - 1) == u->result;
        if (is_glu(s.kind)) {
            ggml_tensor * gate = ggml_graph_node(graph, i);
            ggml_tensor * up   = ggml_graph_node(graph, i + 1);
            ok = ok && gate->op == product && gate->src[0] == u->weights[0] && up->op == product &&
                 up->src[0] == u->weights[1] && u->result->src[0] == gate && u->result->src[1] == up;
        }
        if (!ok) {
            fail("%s: graph node %d is not where upstream's fusion expects it; this ggml orders nodes "
                 "differently, update add_unit", s.name, i);
        }
        i += u->n_nodes;
    }
    if (i != ggml_graph_n_nodes(graph)) {
        fail("%s: the graph has %d nodes, expected %d", s.name, ggml_graph_n_nodes(graph), i);
    }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Microseconds per computation of `graph`, GPU-bound: one computation is queued before the clock
// starts, so the host's work for the first timed one (it compares every node's properties before
// launching the CUDA graph) overlaps the GPU's, as it does for the others.
double time_graph(ggml_backend_t backend, ggml_cgraph * graph, int calls) {
    ggml_backend_synchronize(backend);
    std::chrono::steady_clock::time_point start;
    for (int i = 0; i <= calls; ++i) {
        if (ggml_backend_graph_compute_async(backend, graph) != GGML_STATUS_SUCCESS) {
            fail("graph computation failed");
        }
        if (i == 0) {
            start = std::chrono::steady_clock::now();
        }
    }
    ggml_backend_synchronize(backend);
    return seconds_since(start) * 1e6 / (calls + 1);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- the float64 reference ----

// Bound on the float rounding of one dot product of length n_in, relative to sum(|w| |x|).
double rounding_bound(ggml_type type, int64_t n_in) {
    const double accumulate = 2.0 * (n_in + 8) * std::ldexp(1.0, -24);
    return type == GGML_TYPE_F32 ? accumulate + std::ldexp(1.0, -9) : accumulate;
}

// Dot products of matrix rows (type, n_in per row, stored bytes) with input rows, in float64, and
// sum(|w| |x|) for the rounding bound. value/magnitude: [n_x][n_rows].
void reference_dots(ggml_type type, const uint8_t * rows, int64_t n_rows, int64_t n_in,
                    const std::vector<const float *> & xs, double * value, double * magnitude) {
    const ggml_type_traits * traits = ggml_get_type_traits(type);
    const size_t row_size = ggml_row_size(type, n_in);
    const auto rows_from = [&](int64_t first, int64_t last) {
        std::vector<float> w(n_in);
        std::vector<float> w_abs(n_in);
        std::vector<uint8_t> flipped(row_size);
        for (int64_t r = first; r < last; ++r) {
            const uint8_t * row = rows + r * row_size;
            if (type == GGML_TYPE_F32) {  // ggml has no to_float for it
                std::memcpy(w.data(), row, row_size);
            } else {
                traits->to_float(row, w.data(), n_in);
            }
            if (type == GGML_TYPE_Q4_K) {
                // w = d*sc*q - dmin*m with d, dmin > 0: negating dmin gives |scale part| + |min part|,
                // the magnitude the device's separately rounded partial sums carry
                std::memcpy(flipped.data(), row, row_size);
                for (size_t b = 0; b < row_size; b += 144) {
                    flipped[b + 3] ^= 0x80;
                }
                traits->to_float(flipped.data(), w_abs.data(), n_in);
            } else {
                for (int64_t i = 0; i < n_in; ++i) {
                    w_abs[i] = std::fabs(w[i]);
                }
            }
            for (size_t c = 0; c < xs.size(); ++c) {
                double v = 0.0;
                double m = 0.0;
                for (int64_t i = 0; i < n_in; ++i) {
                    v += (double) w[i] * xs[c][i];
                    m += (double) w_abs[i] * std::fabs(xs[c][i]);
                }
                value[c * n_rows + r]     = v;
                magnitude[c * n_rows + r] = m;
            }
        }
    };
    // The LM head is 248320 rows: spread them over the cores.
    const int64_t max_threads = std::max<int64_t>(1, n_rows / 1024);
    const int64_t n_threads   = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, max_threads);
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < n_threads; ++t) {
        threads.emplace_back(rows_from, n_rows * t / n_threads, n_rows * (t + 1) / n_threads);
    }
    for (std::thread & thread : threads) {
        thread.join();
    }
}

std::vector<uint8_t> read_bytes(const ggml_tensor * t, size_t offset, size_t size) {
    std::vector<uint8_t> bytes(size);
    ggml_backend_tensor_get(t, bytes.data(), offset, size);
    return bytes;
}

// Reference for one matrix (or the selected expert) and the inputs it meets; the product as
// (value, bound) per output element of `which` (0: gate or only matrix, 1: up).
struct products {
    std::vector<double> value, bound;
};

products reference_products(const shape_spec & s, const unit_nodes & u, int which, const std::vector<float> & x,
                            const std::vector<int32_t> & ids, int n_tokens) {
    const ggml_tensor * w = u.weights[which];
    const double rel = rounding_bound(s.type, s.n_in);
    const int64_t n_slots = experts_per_token(s);
    products p;
    p.value.resize(n_tokens * n_slots * s.n_out);
    p.bound.resize(p.value.size());
    if (!is_experts(s.kind)) {
        const std::vector<uint8_t> bytes = read_bytes(w, 0, ggml_nbytes(w));
        std::vector<const float *> xs;
        for (int t = 0; t < n_tokens; ++t) {
            xs.push_back(x.data() + t * s.n_in);
        }
        reference_dots(s.type, bytes.data(), s.n_out, s.n_in, xs, p.value.data(), p.bound.data());
    } else {
        for (int t = 0; t < n_tokens; ++t) {
            for (int64_t j = 0; j < n_slots; ++j) {
                const int64_t slot = t * n_slots + j;
                const int32_t e = ids[slot];
                const std::vector<uint8_t> bytes = read_bytes(w, e * w->nb[2], w->nb[2]);
                const int64_t x_row = s.kind == unit_kind::experts ? slot : t;
                reference_dots(s.type, bytes.data(), s.n_out, s.n_in, { x.data() + x_row * s.n_in },
                               p.value.data() + slot * s.n_out, p.bound.data() + slot * s.n_out);
            }
        }
    }
    for (double & b : p.bound) {
        b *= rel;
    }
    return p;
}

// Compares the first unit's result with the reference; fatal on any element out of bound.
void check_result(const shape_spec & s, const unit_nodes & u, const std::vector<float> & x,
                  const std::vector<int32_t> & ids, int n_tokens) {
    std::vector<float> y(ggml_nelements(u.result));
    ggml_backend_tensor_get(u.result, y.data(), 0, ggml_nbytes(u.result));
    const products a = reference_products(s, u, 0, x, ids, n_tokens);
    if (y.size() != a.value.size()) {
        fail("%s: result has %zu elements, expected %zu", s.name, y.size(), a.value.size());
    }
    products b;
    if (is_glu(s.kind)) {
        b = reference_products(s, u, 1, x, ids, n_tokens);
    }
    int64_t n_bad = 0;
    for (size_t i = 0; i < y.size(); ++i) {
        double expect = a.value[i];
        double bound  = a.bound[i];
        if (is_glu(s.kind)) {
            // silu(g) * u with |silu'| < 1.1; 1e-5 relative for the device's fast expf and division
            const double g = a.value[i];
            const double up = b.value[i];
            const double silu = g / (1.0 + std::exp(-g));
            expect = silu * up;
            bound  = 1.1 * a.bound[i] * (std::fabs(up) + b.bound[i]) + std::fabs(silu) * b.bound[i] +
                    1e-5 * std::fabs(expect);
        }
        const double err = std::fabs((double) y[i] - expect);
        if (!(err <= bound)) {  // also NaN
            if (n_bad < 3) {
                std::fprintf(stderr, "gemv-stock: %s, %d tokens, element %zu: %.9g, float64 reference %.9g, "
                             "bound %.3g\n", s.name, n_tokens, i, (double) y[i], expect, bound);
            }
            ++n_bad;
        }
    }
    if (n_bad > 0) {
        fail("%s, %d tokens: %" PRId64 " of %zu elements differ from the float64 reference beyond the "
             "rounding bound: the benchmark does not compute the product it times", s.name, n_tokens, n_bad, y.size());
    }
}

// ---- measurement ----

struct measurement {
    const shape_spec * shape;
    int                n_tokens;
    int64_t            bytes;
    double             us_median, us_min, us_max;
    int64_t            units_a, units_b;
};

measurement measure(const shape_spec & s, int n_tokens, const weight_set & w, int64_t units_a,
                    const std::vector<int32_t> & expert_order, ggml_backend_dev_t device, const options & opt,
                    const log_state & log, std::mt19937_64 & rng) {
    const int64_t units_b = 2 * units_a;
    const bool cuda = std::strncmp(ggml_backend_dev_name(device), "CUDA", 4) == 0;
    // A fresh backend per measurement: no CUDA graphs cached from an earlier one.
    backend_ptr backend(ggml_backend_dev_init(device, nullptr));
    if (!backend) {
        fail("cannot initialise %s", ggml_backend_dev_name(device));
    }

    const int64_t n_x_rows = input_rows(s, n_tokens);
    const int64_t per_unit = is_glu(s.kind) ? 3 : 1;
    context_ptr ctx = new_context(units_b * per_unit + 2, 0);
    ggml_tensor * x = is_experts(s.kind)
        ? ggml_new_tensor_3d(ctx.get(), GGML_TYPE_F32, s.n_in, n_x_rows / n_tokens, n_tokens)
        : ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, s.n_in, n_tokens);
    ggml_tensor * ids = nullptr;
    std::vector<int32_t> ids_host;
    if (is_experts(s.kind)) {
        ids = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_I32, k_n_expert_used, n_tokens);
        ids_host.assign(expert_order.begin(), expert_order.begin() + k_n_expert_used * n_tokens);
    }
    std::vector<unit_nodes> units;
    for (int64_t i = 0; i < units_b; ++i) {
        units.push_back(add_unit(ctx.get(), s, &w.matrices[i * matrices_per_unit(s)], x, ids));
    }
    buffer_ptr buffer = allocate(ctx.get(), device, "inputs and results");
    const std::vector<float> x_host = exact_input(n_x_rows, s.n_in, rng);
    ggml_backend_tensor_set(x, x_host.data(), 0, ggml_nbytes(x));
    if (ids) {
        ggml_backend_tensor_set(ids, ids_host.data(), 0, ggml_nbytes(ids));
    }

    const size_t graph_size = (size_t) (units_b * (per_unit + 2) + 16);
    context_ptr graph_ctx = new_context(0, 2 * ggml_graph_overhead_custom(graph_size, false));
    ggml_cgraph * graph_a = ggml_new_graph_custom(graph_ctx.get(), graph_size, false);
    ggml_cgraph * graph_b = ggml_new_graph_custom(graph_ctx.get(), graph_size, false);
    std::vector<const unit_nodes *> order_a;
    std::vector<const unit_nodes *> order_b;
    for (int64_t i = 0; i < units_a; ++i) {
        order_a.push_back(&units[i]);
    }
    for (int64_t i = 0; i < units_b; ++i) {
        order_b.push_back(&units[(i + units_a) % units_b]);
    }
    for (const unit_nodes * u : order_a) {
        ggml_build_forward_expand(graph_a, u->result);
    }
    for (const unit_nodes * u : order_b) {
        ggml_build_forward_expand(graph_b, u->result);
    }
    check_node_order(graph_a, order_a, s);
    check_node_order(graph_b, order_b, s);

    // Warm-up: ggml-cuda runs a graph directly until its properties repeat, then captures, then
    // replays; each time_graph computes twice.
    const int captures_before = log.captures;
    double us_a = 0.0;
    double us_b = 0.0;
    for (int i = 0; i < 3; ++i) {
        us_a = time_graph(backend.get(), graph_a, 1);
        us_b = time_graph(backend.get(), graph_b, 1);
    }
    if (cuda && log.captures - captures_before < 2) {
        fail("%s: ggml-cuda captured %d of the 2 graphs: are CUDA graphs off (GGML_CUDA_DISABLE_GRAPHS), "
             "or did the pin's log line \"CUDA graph warmup complete\" change?", s.name,
             log.captures - captures_before);
    }
    const auto calls_for = [&](double us) {
        return (int) std::clamp(std::ceil(opt.batch_ms * 1e3 / std::max(us, 1.0)), 2.0, 1000.0);
    };
    const int calls_a = calls_for(us_a);
    const int calls_b = calls_for(us_b);

    const int recaptures_before = log.recaptures;
    std::vector<double> slopes;
    for (int r = 0; r < opt.rounds; ++r) {
        if (r % 2 == 0) {
            us_a = time_graph(backend.get(), graph_a, calls_a);
            us_b = time_graph(backend.get(), graph_b, calls_b);
        } else {
            us_b = time_graph(backend.get(), graph_b, calls_b);
            us_a = time_graph(backend.get(), graph_a, calls_a);
        }
        slopes.push_back((us_b - us_a) / (double) (units_b - units_a));
    }
    if (log.recaptures != recaptures_before) {
        fail("%s: ggml-cuda re-captured a graph while it was being timed", s.name);
    }
    check_result(s, units[0], x_host, ids_host, n_tokens);

    measurement m = {};
    m.shape     = &s;
    m.n_tokens  = n_tokens;
    m.bytes     = unit_bytes(s, n_tokens);
    m.us_median = median(slopes);
    m.us_min    = *std::min_element(slopes.begin(), slopes.end());
    m.us_max    = *std::max_element(slopes.begin(), slopes.end());
    m.units_a   = units_a;
    m.units_b   = units_b;
    return m;
}

void write_json(std::FILE * f, const measurement & m) {
    const shape_spec & s = *m.shape;
    std::fprintf(f,
                 "{\"impl\":\"stock\",\"shape\":\"%s\",\"tensors\":\"%s\",\"per_step\":%d,\"out\":%" PRId64
                 ",\"in\":%" PRId64 ",\"type\":\"%s\",\"tokens\":%d,\"experts\":%" PRId64 ",\"bytes\":%" PRId64
                 ",\"us_median\":%.3f,\"us_min\":%.3f,\"us_max\":%.3f,\"units_a\":%" PRId64 ",\"units_b\":%" PRId64
                 "}\n",
                 s.name, s.tensors, s.per_step, s.n_out * matrices_per_unit(s), s.n_in, ggml_type_name(s.type),
                 m.n_tokens, experts_per_token(s), m.bytes, m.us_median, m.us_min, m.us_max, m.units_a, m.units_b);
    std::fflush(f);
}

// ---- command line ----

[[noreturn]] void usage(const char * argv0) {
    std::fprintf(stderr,
                 "usage: %s OUT.jsonl [--device CUDA0] [--shapes a,b] [--tokens 1-8|1,2,4] [--rounds 11]\n"
                 "       [--stream-mib 120] [--batch-ms 10] [--seed 1] [--list]\n"
                 "Times stock ggml on every weight matvec shape of a qwen36-35b-a3b decode step; --list "
                 "prints the shapes.\n",
                 argv0);
    std::exit(2);
}

double parse_number(const char * flag, const char * text, double min, double max) {
    char * end = nullptr;
    const double v = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(v >= min && v <= max)) {
        fail("%s %s: expected a number in [%g, %g]", flag, text, min, max);
    }
    return v;
}

std::vector<std::string> split(const std::string & text, char sep) {
    std::vector<std::string> parts;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t end = std::min(text.find(sep, start), text.size());
        parts.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return parts;
}

std::vector<int> parse_tokens(const std::string & text) {
    std::vector<int> tokens;
    for (const std::string & part : split(text, ',')) {
        const size_t dash = part.find('-');
        const std::string lo = part.substr(0, dash);
        const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
        const int a = (int) parse_number("--tokens", lo.c_str(), 1, k_max_tokens);
        const int b = (int) parse_number("--tokens", hi.c_str(), a, k_max_tokens);
        for (int t = a; t <= b; ++t) {
            tokens.push_back(t);
        }
    }
    std::sort(tokens.begin(), tokens.end());
    tokens.erase(std::unique(tokens.begin(), tokens.end()), tokens.end());
    return tokens;
}

options parse_options(int argc, char ** argv) {
    options opt;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        const auto value = [&]() -> const char * {
            if (i + 1 >= argc) {
                fail("%s needs a value", arg.c_str());
            }
            return argv[++i];
        };
        if (arg == "--device") {
            opt.device = value();
        } else if (arg == "--shapes") {
            opt.shapes = split(value(), ',');
        } else if (arg == "--tokens") {
            opt.tokens = parse_tokens(value());
        } else if (arg == "--rounds") {
            opt.rounds = (int) parse_number("--rounds", value(), 1, 1000);
        } else if (arg == "--stream-mib") {
            opt.stream_mib = parse_number("--stream-mib", value(), 1e-3, 1e6);
        } else if (arg == "--batch-ms") {
            opt.batch_ms = parse_number("--batch-ms", value(), 0.0, 1e5);
        } else if (arg == "--seed") {
            opt.seed = (uint64_t) parse_number("--seed", value(), 0, 1e15);
        } else if (arg == "--list") {
            opt.list = true;
        } else if (arg == "-h" || arg == "--help") {
            usage(argv[0]);
        } else if (!arg.empty() && arg[0] != '-' && opt.out_path.empty()) {
            opt.out_path = arg;
        } else {
            fail("unknown argument %s (--help lists them)", arg.c_str());
        }
    }
    for (const std::string & name : opt.shapes) {
        const bool known = std::any_of(std::begin(k_shapes), std::end(k_shapes),
                                       [&](const shape_spec & s) { return name == s.name; });
        if (!known) {
            fail("--shapes: no shape %s (--list shows them)", name.c_str());
        }
    }
    if (opt.out_path.empty() && !opt.list) {
        usage(argv[0]);
    }
    return opt;
}

bool selected(const options & opt, const shape_spec & s) {
    return opt.shapes.empty() || std::find(opt.shapes.begin(), opt.shapes.end(), s.name) != opt.shapes.end();
}

void print_shapes() {
    std::printf("| shape | tensors | per step | kind | type | in | out | bytes (1 token) |\n");
    std::printf("|---|---|---:|---|---|---:|---:|---:|\n");
    int64_t units = 0;
    int64_t quantized = 0;
    double bytes = 0.0;
    for (const shape_spec & s : k_shapes) {
        static const char * kinds[] = { "MUL_MAT", "MUL_MAT x2 + GLU", "MUL_MAT_ID", "MUL_MAT_ID x2 + GLU" };
        std::printf("| %s | %s | %d | %s | %s | %" PRId64 " | %" PRId64 " | %" PRId64 " |\n", s.name, s.tensors,
                    s.per_step, kinds[(int) s.kind], ggml_type_name(s.type), s.n_in, s.n_out * matrices_per_unit(s),
                    unit_bytes(s, 1));
        units += s.per_step;
        quantized += ggml_is_quantized(s.type) ? s.per_step : 0;
        bytes += (double) s.per_step * unit_bytes(s, 1);
    }
    std::printf("\nper decode step: %" PRId64 " units, %" PRId64 " with quantized weights, %.4f GB of weights\n",
                units, quantized, bytes / 1e9);
}

void print_table(const std::vector<measurement> & results) {
    std::printf("\n| shape | tokens | out x in | type | bytes | stock us | min-max | TB/s | floor us (4.38 TB/s) |\n");
    std::printf("|---|---:|---|---|---:|---:|---|---:|---:|\n");
    for (const measurement & m : results) {
        const shape_spec & s = *m.shape;
        std::printf("| %s | %d | %" PRId64 "%s x %" PRId64 " | %s | %" PRId64 " | %.2f | %.2f-%.2f | %.2f | %.2f |\n",
                    s.name, m.n_tokens, s.n_out * matrices_per_unit(s), is_experts(s.kind) ? " (x8)" : "", s.n_in,
                    ggml_type_name(s.type), m.bytes, m.us_median, m.us_min, m.us_max, m.bytes / m.us_median / 1e6,
                    m.bytes / 4.38e6);
    }
    for (int t = 1; t <= k_max_tokens; ++t) {
        double us = 0.0;
        double bytes = 0.0;
        size_t n = 0;
        for (const measurement & m : results) {
            if (m.n_tokens == t) {
                us += m.shape->per_step * m.us_median;
                bytes += (double) m.shape->per_step * m.bytes;
                ++n;
            }
        }
        if (n == std::size(k_shapes)) {
            std::printf("\nall matvecs of one decode step at %d token(s): %.1f us for %.4f GB (floor %.1f us)\n", t,
                        us, bytes / 1e9, bytes / 4.38e6);
        }
    }
}

}  // namespace

int main(int argc, char ** argv) {
    const options opt = parse_options(argc, argv);
    check_block_layouts();
    if (opt.list) {
        print_shapes();
        return 0;
    }
    log_state log;
    ggml_log_set(log_callback, &log);
    ggml_backend_dev_t device = ggml_backend_dev_by_name(opt.device.c_str());
    if (device == nullptr) {
        std::string names;
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            names += std::string(" ") + ggml_backend_dev_name(ggml_backend_dev_get(i));
        }
        fail("no device %s; this ggml has:%s", opt.device.c_str(), names.c_str());
    }
    std::FILE * out = std::fopen(opt.out_path.c_str(), "w");
    if (out == nullptr) {
        fail("cannot write %s: %s", opt.out_path.c_str(), std::strerror(errno));
    }
    std::fprintf(stderr, "gemv-stock: %s (%s), %d rounds, A streams >= %.0f MiB of weights\n",
                 ggml_backend_dev_name(device), ggml_backend_dev_description(device), opt.rounds, opt.stream_mib);

    std::mt19937_64 rng(opt.seed);
    // Experts in the order tokens take them: token t uses [8t, 8t + 8), no expert shared.
    std::vector<int32_t> expert_order(k_n_expert);
    std::iota(expert_order.begin(), expert_order.end(), 0);
    std::shuffle(expert_order.begin(), expert_order.end(), rng);
    const int max_tokens = opt.tokens.back();
    const std::vector<int32_t> used_experts(expert_order.begin(), expert_order.begin() + k_n_expert_used * max_tokens);

    std::vector<measurement> results;
    for (const shape_spec & s : k_shapes) {
        if (!selected(opt, s)) {
            continue;
        }
        const auto start = std::chrono::steady_clock::now();
        const double stream_bytes = opt.stream_mib * 1048576.0;
        const int64_t units_a = std::max<int64_t>(2, (int64_t) std::ceil(stream_bytes / unit_bytes(s, 1)));
        const weight_set w = make_weights(s, 2 * units_a, used_experts, device, rng);
        for (const int t : opt.tokens) {
            results.push_back(measure(s, t, w, units_a, expert_order, device, opt, log, rng));
            write_json(out, results.back());
        }
        std::fprintf(stderr, "gemv-stock: %s: %" PRId64 " + %" PRId64 " units, %.1f s\n", s.name, units_a, units_a,
                     seconds_since(start));
    }
    std::fclose(out);
    print_table(results);
    ggml_log_set(nullptr, nullptr);  // log lives in this frame; ggml may log at exit
    return 0;
}
