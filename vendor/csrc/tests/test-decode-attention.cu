// Unit test of frt_attn_decode against a float64 CPU attention, on fresh random inputs laid out as
// llama.cpp lays them out at decode (Q permuted from [d, heads, tokens], K and V rows of a cache of
// d x heads_kv halves a cell, the output [d, heads, tokens]). The output is poisoned first; cells
// the mask hides hold NaN in K and V (unused cache rows may hold anything) and must not leak into
// the result. Every case runs twice: the second launch must give the same bits. Gated cases read
// the output gate where qwen35 keeps it (the second half of each head's slice of the q projection;
// the first halves NaN) and must give sigmoid(gate) * attention within the same bound, and the
// same bits as the ungated launch's output through stock's SIGMOID and MUL expressions (a small
// kernel here: host and device expf may round differently), also written in place over Q or over
// the gate (not poisoned then: the input is restored before each launch). Caches of more than
// FRT_ATTN_DECODE_MAX_KV cells run on several clusters a head and the combine kernel, with a
// scratch poisoned before the first launch. Bad shapes must be refused, and a long cache without
// scratch. Needs a GPU (sm_90: thread-block clusters):
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-decode-attention.cu -o test-decode-attention && ./test-decode-attention

#include "decode-attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "tests/test-device.cuh"

// Where a gated case writes its output: apart, or in place over Q or over the gate, element for
// element (as the allocator may place the gate's MUL; the header says why that is safe).
enum class out_place { apart, over_q, over_gate };

enum class mask_kind {
    none,
    prefix,   // row t sees cells [0, visible - n_q + 1 + t): a causal step over a cache prefix
    random,   // each cell hidden with probability 0.3 (cell 0 always seen)
    holes,    // cells [32, 64) hidden from every row: a whole block masked
};

struct decode_case {
    const char * name;
    int          d, heads, heads_kv, n_q, n_kv;
    mask_kind    mask;
    int          visible;  // mask_kind::prefix
    bool         gated;    // with the output gate (frt_attn_decode_args::gate)
    out_place    place;
    bool         split;        // the split kernels whatever the cache's size (frt_attn_decode_args::split_from)
    int          split_cells;  // frt_attn_decode_args::split_cells
};

// A value hidden from every row, as an unused cache row may hold.
static bool hidden_from_all(const std::vector<float> & mask, int n_q, int n_kv, int c) {
    for (int t = 0; t < n_q; ++t) {
        if (mask[(size_t) t * n_kv + c] != -INFINITY) {
            return false;
        }
    }
    return true;
}

// ggml-cuda's SIGMOID (op_sigmoid) and MUL (the fused unary-mul's order; the product commutes) on
// the ungated output: what stock computes from the same attention values. Gate element i of head h
// of token t at gate + t*gate_token + h*gate_head + i; attention and out [d, heads, tokens].
static __global__ void stock_gate_kernel(const float * attention, const float * gate, int64_t gate_token,
                                         int64_t gate_head, float * out, int d, int heads, int n) {
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) {
        return;
    }
    const int   i = e % d, h = e / d % heads, t = e / (d * heads);
    const float x = gate[(int64_t) t * gate_token + (int64_t) h * gate_head + i];
    out[e]        = (1.0f / (1.0f + expf(-x))) * attention[e];
}

static int run_case(const decode_case & dc, std::mt19937 & rng) {
    const int d = dc.d, H = dc.heads, G = dc.heads_kv, T = dc.n_q, N = dc.n_kv, gqa = H / G;
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f), unit(0.0f, 1.0f);

    std::vector<float> q((size_t) d * H * T);
    for (float & x : q) {
        x = uni(rng);
    }
    std::vector<float> mask((size_t) T * N, 0.0f);
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < N; ++c) {
            float & m = mask[(size_t) t * N + c];
            switch (dc.mask) {
                case mask_kind::none: break;
                case mask_kind::prefix: m = c < dc.visible - T + 1 + t ? 0.0f : -INFINITY; break;
                case mask_kind::random: m = c == 0 || unit(rng) >= 0.3f ? 0.0f : -INFINITY; break;
                case mask_kind::holes: m = c >= 32 && c < 64 ? -INFINITY : 0.0f; break;
            }
        }
    }
    // K and V as the cache holds them (halves); NaN where no row looks.
    std::vector<__half> k((size_t) N * G * d), v((size_t) N * G * d);
    for (int c = 0; c < N; ++c) {
        const bool hidden = dc.mask != mask_kind::none && hidden_from_all(mask, T, N, c);
        for (int i = 0; i < G * d; ++i) {
            k[(size_t) c * G * d + i] = __float2half(hidden ? NAN : uni(rng));
            v[(size_t) c * G * d + i] = __float2half(hidden ? NAN : uni(rng));
        }
    }
    const float scale = 1.0f / std::sqrt((float) d);
    // The gate as qwen35's q projection holds it: head h of token t is [q (d values), gate (d)];
    // the q halves NaN (the kernel must not read them).
    std::vector<float> gate(dc.gated ? (size_t) 2 * d * H * T : 0, NAN);
    const int64_t gate_head = 2 * (int64_t) d, gate_token = 2 * (int64_t) d * H;
    for (int t = 0; t < T && dc.gated; ++t) {
        for (int h = 0; h < H; ++h) {
            for (int i = 0; i < d; ++i) {
                gate[t * gate_token + h * gate_head + d + i] = 4.0f * uni(rng);
            }
        }
    }

    // float64 reference: out[t][h] (layout [d, heads, tokens]).
    std::vector<double> ref((size_t) d * H * T);
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
            const int           g = h / gqa;
            std::vector<double> s(N);
            double              m = -INFINITY;
            for (int c = 0; c < N; ++c) {
                const double mk = dc.mask == mask_kind::none ? 0.0 : (double) mask[(size_t) t * N + c];
                if (mk == -INFINITY) {
                    s[c] = -INFINITY;
                    continue;
                }
                double dot = 0.0;
                for (int i = 0; i < d; ++i) {
                    dot += (double) q[(size_t) t * d * H + (size_t) h * d + i] *
                           (double) __half2float(k[(size_t) c * G * d + (size_t) g * d + i]);
                }
                s[c] = dot * scale + mk;
                m    = std::max(m, s[c]);
            }
            double sum = 0.0;
            std::vector<double> o(d, 0.0);
            for (int c = 0; c < N; ++c) {
                if (s[c] == -INFINITY) {
                    continue;
                }
                const double w = std::exp(s[c] - m);
                sum += w;
                for (int i = 0; i < d; ++i) {
                    o[i] += w * (double) __half2float(v[(size_t) c * G * d + (size_t) g * d + i]);
                }
            }
            for (int i = 0; i < d; ++i) {
                const double g = dc.gated ? (double) gate[t * gate_token + h * gate_head + d + i] : 0.0;
                const double sg = dc.gated ? 1.0 / (1.0 + std::exp(-g)) : 1.0;
                ref[(size_t) t * d * H + (size_t) h * d + i] = sg * o[i] / sum;
            }
        }
    }

    float *  d_q = nullptr, *d_out = nullptr, *d_gate = nullptr, *d_expect = nullptr, *d_scratch = nullptr;
    __half * d_k = nullptr, *d_v = nullptr, *d_mask = nullptr;
    std::vector<__half> mask16(mask.size());
    for (size_t i = 0; i < mask.size(); ++i) {
        mask16[i] = __float2half(mask[i]);
    }
    frt_attn_decode_args a = {};
    a.d = d, a.heads = H, a.heads_kv = G, a.n_q = T, a.n_kv = N;
    a.split_from = dc.split ? 1 : 0, a.split_cells = dc.split_cells;
    CHECK(cudaMalloc(&d_q, q.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_out, ref.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_k, k.size() * sizeof(__half)));
    CHECK(cudaMalloc(&d_v, v.size() * sizeof(__half)));
    CHECK(cudaMalloc(&d_mask, mask16.size() * sizeof(__half)));
    CHECK(cudaMemcpy(d_q, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_k, k.data(), k.size() * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_v, v.data(), v.size() * sizeof(__half), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_mask, mask16.data(), mask16.size() * sizeof(__half), cudaMemcpyHostToDevice));
    if (dc.gated) {
        CHECK(cudaMalloc(&d_gate, gate.size() * sizeof(float)));
        CHECK(cudaMalloc(&d_expect, ref.size() * sizeof(float)));
        CHECK(cudaMemcpy(d_gate, gate.data(), gate.size() * sizeof(float), cudaMemcpyHostToDevice));
    }

    a.q = d_q, a.q_token = (int64_t) d * H, a.q_head = d;
    a.k = d_k, a.k_cell = (int64_t) G * d, a.k_head = d;
    a.v = d_v, a.v_cell = (int64_t) G * d, a.v_head = d;
    a.mask = dc.mask == mask_kind::none ? nullptr : d_mask, a.mask_row = N;
    a.out = d_out, a.out_token = (int64_t) d * H, a.out_head = d;
    a.scale = scale;
    const size_t scratch = frt_attn_decode_scratch_bytes(a);
    if (scratch > 0) {
        d_scratch = upload_poisoned(scratch / sizeof(float));
        a.scratch = d_scratch;
    }

    // Gated: the ungated launch's output through stock's expressions, for the bits.
    std::vector<float> expect;
    if (dc.gated) {
        CHECK(cudaMemset(d_out, 0xff, ref.size() * sizeof(float)));
        CHECK(frt_attn_decode(a, 0));
        const int n = (int) ref.size();
        stock_gate_kernel<<<(n + 255) / 256, 256>>>(d_out, d_gate + d, gate_token, gate_head, d_expect, d, H, n);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        expect.resize(ref.size());
        CHECK(cudaMemcpy(expect.data(), d_expect, ref.size() * sizeof(float), cudaMemcpyDeviceToHost));
        a.gate = d_gate + d, a.gate_token = gate_token, a.gate_head = gate_head;
    }

    // In place: the output at the input's addresses, with its strides.
    if (dc.place == out_place::over_q) {
        a.out = d_q, a.out_token = a.q_token, a.out_head = a.q_head;
    } else if (dc.place == out_place::over_gate) {
        a.out = d_gate + d, a.out_token = gate_token, a.out_head = gate_head;
    }
    std::vector<float> got[2];
    for (int run = 0; run < 2; ++run) {
        if (dc.place == out_place::over_q) {
            CHECK(cudaMemcpy(d_q, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
        } else if (dc.place == out_place::over_gate) {
            CHECK(cudaMemcpy(d_gate, gate.data(), gate.size() * sizeof(float), cudaMemcpyHostToDevice));
        } else {
            CHECK(cudaMemset(d_out, 0xff, ref.size() * sizeof(float)));  // NaN poison
        }
        CHECK(frt_attn_decode(a, 0));
        CHECK(cudaDeviceSynchronize());
        std::vector<float> buf(dc.place == out_place::over_gate ? gate.size() : ref.size());
        CHECK(cudaMemcpy(buf.data(), dc.place == out_place::over_gate ? d_gate : a.out, buf.size() * sizeof(float),
                         cudaMemcpyDeviceToHost));
        got[run].resize(ref.size());
        for (int t = 0; t < T; ++t) {
            for (int h = 0; h < H; ++h) {
                for (int i = 0; i < d; ++i) {
                    const size_t at = dc.place == out_place::over_gate ? t * gate_token + h * gate_head + d + i :
                                                                         (size_t) t * d * H + (size_t) h * d + i;
                    got[run][(size_t) t * d * H + (size_t) h * d + i] = buf[at];
                }
            }
        }
    }

    double max_err = 0.0;
    int    not_finite = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[0][i])) {
            ++not_finite;
            continue;
        }
        max_err = std::max(max_err, std::fabs((double) got[0][i] - ref[i]));
    }
    const bool same   = std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)) == 0;
    const bool stock_bits = !dc.gated || std::memcmp(got[0].data(), expect.data(), expect.size() * sizeof(float)) == 0;
    // Outputs are averages of values in [-1, 1] (gated: times a sigmoid in (0, 1)); float sums over
    // <= 1024 cells stay within 1e-5, over 16384 cells (in chunks) within a few times that.
    // The split kernels' cases must also have run on them (chunks > 1).
    const bool split_ran = frt_attn_decode_chunks(a) > 1;
    const bool ok        = not_finite == 0 && max_err <= 1e-4 && same && stock_bits && (split_ran || !dc.split);
    std::printf("%s %-52s d %3d heads %2d/%d tokens %d cells %5d (%3d chunks a head): max err %.2e, %d not "
                "finite%s%s\n",
                ok ? "ok  " : "FAIL", dc.name, d, H, G, T, N, frt_attn_decode_chunks(a), max_err, not_finite,
                same ? "" : ", second launch differs", stock_bits ? "" : ", not stock's bits for the gate");
    if (split_ran) {  // how the launch sits on this device (not checked: speed)
        std::printf("     %d of its %d blocks resident at once\n", frt_attn_decode_resident_blocks(a),
                    frt_attn_decode_chunks(a) * G);
    }
    cudaFree(d_q), cudaFree(d_out), cudaFree(d_k), cudaFree(d_v), cudaFree(d_mask);
    cudaFree(d_gate), cudaFree(d_expect), cudaFree(d_scratch);
    return ok ? 0 : 1;
}

static int run_refusals() {
    struct refusal {
        int d, heads, heads_kv, n_q, n_kv;
    };
    const refusal shapes[] = {
        { 96, 16, 2, 1, 256 },   // head size
        { 256, 16, 3, 1, 256 },  // heads not a multiple of heads_kv
        { 256, 16, 2, 9, 256 },  // tokens
        { 256, 16, 1, 8, 256 },  // 128 query rows of one key/value head
        { 256, 16, 2, 1, 40000 },  // cells
    };
    int failed = 0;
    for (const refusal & r : shapes) {
        frt_attn_decode_args a = {};
        a.d = r.d, a.heads = r.heads, a.heads_kv = r.heads_kv, a.n_q = r.n_q, a.n_kv = r.n_kv;
        const bool refused = frt_attn_decode(a, 0) == cudaErrorInvalidValue &&
                             frt_attn_decode_unsupported(r.d, r.heads, r.heads_kv, r.n_q, r.n_kv) != nullptr;
        failed += !refused;
    }
    // A long cache the kernel takes, launched without its scratch.
    frt_attn_decode_args a = {};
    a.d = 256, a.heads = 16, a.heads_kv = 2, a.n_q = 1, a.n_kv = 8448;
    const bool long_refused = frt_attn_decode_unsupported(a.d, a.heads, a.heads_kv, a.n_q, a.n_kv) == nullptr &&
                              frt_attn_decode_scratch_bytes(a) > 0 && frt_attn_decode(a, 0) == cudaErrorInvalidValue;
    failed += !long_refused;
    // A device of sm_120's 99 KB: qwen36's head over 256 cells fits (32 cells a block), over 1024
    // (128 a block) it does not, and 8448 cells go to more, smaller blocks; sm_90's 227 KB take all.
    const int  sm120 = 99 * 1024, sm90 = 227 * 1024;
    const bool fits  = frt_attn_decode_unsupported_on(256, 16, 2, 1, 256, 188, sm120) == nullptr &&
                      frt_attn_decode_unsupported_on(256, 16, 2, 1, 1024, 188, sm120) != nullptr &&
                      frt_attn_decode_unsupported_on(256, 16, 2, 1, 8448, 188, sm120) == nullptr &&
                      frt_attn_decode_unsupported_on(256, 16, 2, 8, 1024, 132, sm90) == nullptr &&
                      frt_attn_decode_unsupported_on(256, 16, 2, 8, 8448, 132, sm90) == nullptr;
    failed += !fits;
    std::printf("%s refusals of bad shapes, of a long cache without scratch, of blocks over the device's shared "
                "memory\n", failed ? "FAIL" : "ok  ");
    return failed ? 1 : 0;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    const decode_case cases[] = {
        { "qwen36 decode, causal over 129 of 256 cells", 256, 16, 2, 1, 256, mask_kind::prefix, 129 },
        { "qwen36, 8 sequences' tokens, random masks", 256, 16, 2, 8, 512, mask_kind::random, 0 },
        { "qwen3 shape, 2 tokens, 1000 cells, no mask", 128, 32, 4, 2, 1000, mask_kind::none, 0 },
        { "one block (20 cells), one query head a KV head", 64, 8, 8, 1, 20, mask_kind::prefix, 20 },
        { "a whole block of cells masked", 256, 16, 2, 3, 96, mask_kind::holes, 0 },
        { "1024 cells (128 a block)", 256, 16, 2, 1, 1024, mask_kind::prefix, 1000 },
        { "fewer cells than blocks (5)", 128, 16, 2, 1, 5, mask_kind::none, 0 },
        { "64 query rows a KV head, 8 tokens over 1024 cells", 256, 16, 2, 8, 1024, mask_kind::random, 0 },
        { "gated: qwen36 decode over 8 cells", 256, 16, 2, 1, 8, mask_kind::prefix, 8, true },
        { "gated: qwen36 decode over 1000 cells", 256, 16, 2, 1, 1000, mask_kind::prefix, 1000, true },
        { "gated: qwen3 shape, 4 tokens, random masks", 128, 32, 4, 4, 300, mask_kind::random, 0, true },
        { "gated: one query head a KV head, 3 tokens", 64, 8, 8, 3, 20, mask_kind::prefix, 20, true },
        { "gated, in place over Q", 256, 16, 2, 2, 256, mask_kind::prefix, 200, true, out_place::over_q },
        { "gated, in place over the gate", 128, 32, 4, 4, 300, mask_kind::random, 0, true, out_place::over_gate },
        { "long: qwen36 decode, causal over 8000 of 8448 cells", 256, 16, 2, 1, 8448, mask_kind::prefix, 8000 },
        { "long: gated, qwen36 decode over 16384 cells", 256, 16, 2, 1, 16384, mask_kind::prefix, 16384, true },
        { "long: 100 of 4096 cells seen (chunks wholly hidden)", 256, 16, 2, 2, 4096, mask_kind::prefix, 100 },
        { "long: 64 query rows a KV head, 8 tokens, 3000 cells", 256, 16, 2, 8, 3000, mask_kind::random, 0 },
        { "long: qwen3 shape, 2 tokens, 1025 cells, no mask", 128, 32, 4, 2, 1025, mask_kind::none, 0 },
        { "long: one query head a KV head, 1500 cells", 64, 8, 8, 1, 1500, mask_kind::prefix, 1500 },
        { "long: gated, in place over Q, 2048 cells", 256, 16, 2, 2, 2048, mask_kind::prefix, 2000, true,
          out_place::over_q },
        { "long: gated, in place over the gate, 5000 cells", 128, 32, 4, 4, 5000, mask_kind::random, 0, true,
          out_place::over_gate },
        { "long: 32768 cells, 4 tokens", 256, 16, 2, 4, 32768, mask_kind::prefix, 30000 },
        { "split: qwen36 decode over 129 of 256 cells", 256, 16, 2, 1, 256, mask_kind::prefix, 129, false,
          out_place::apart, true },
        { "split: a whole batch of cells masked, 3 tokens", 256, 16, 2, 3, 96, mask_kind::holes, 0, false,
          out_place::apart, true },
        { "split: one cell", 128, 16, 2, 1, 1, mask_kind::none, 0, false, out_place::apart, true },
        { "split: 7 cells, 5 query rows a KV head", 64, 5, 1, 1, 7, mask_kind::prefix, 7, false,
          out_place::apart, true },
        { "split: gated, 1000 cells, 8 sequences' tokens", 256, 16, 2, 8, 1000, mask_kind::random, 0, true,
          out_place::apart, true },
        { "split: 16 cells a block, 2048 cells, 2 tokens", 256, 16, 2, 2, 2048, mask_kind::prefix, 1900, false,
          out_place::apart, true, 16 },
    };
    int failed = 0;
    for (const decode_case & dc : cases) {
        failed += run_case(dc, rng);
    }
    failed += run_refusals();
    const int n_cases = (int) (sizeof(cases) / sizeof(cases[0])) + 1;
    std::printf("%d passed, %d failed\n", n_cases - failed, failed);
    return failed == 0 ? 0 : 1;
}
