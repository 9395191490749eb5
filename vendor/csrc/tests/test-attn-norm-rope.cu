// Unit test of frt_attn_rope against a float64 CPU reference of an attention layer's q/k norms,
// multi-section RoPE and KV cache writes, on fresh random inputs (positions drawn per section, so a
// wrong section shows), the outputs and the written cache rows poisoned first. Checks that V is
// stored as exactly the half values set_rows stores, that cache rows the batch does not write stay
// as they were, and that bad shapes are refused. Every case runs with the norm weights read after
// the wait and before it (frt_attn_rope_args::weights_constant). Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-attn-norm-rope.cu -o test-attn-norm-rope && ./test-attn-norm-rope

#include "attn-norm-rope.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/test-device.cuh"

struct rope_case {
    const char * name;
    int          D, Hq, Hkv, T;
    int          n_dims, n_offs;
    int          sections[4];
    bool         imrope;
    float        freq_base, freq_scale, ext_factor;
    bool         q_gated;   // q heads interleaved with gate heads, as qwen35's Qcur_full holds them
    bool         in_place;  // q_out written over q (contiguous q)
    bool         rows_i32;
};

constexpr int kv_size = 64;   // cache rows; the batch writes T of them
constexpr int max_pos = 512;  // positions drawn in [0, max_pos)

static uint16_t half_bits(__half h) {
    uint16_t b;
    std::memcpy(&b, &h, sizeof(b));
    return b;
}

static double half_value(uint16_t b) {
    __half h;
    std::memcpy(&h, &b, sizeof(h));
    return (double) __half2float(h);
}

// float64 reference of one head row: rms_norm * w, then the rotation of rope_multi (NEOX pairs
// inside [n_offs, n_offs + n_dims), section by pair as MROPE/IMROPE choose it, YaRN when
// ext_factor != 0). Returns the row's largest |theta| in *max_theta.
static void reference_row(const rope_case & rc, const float * x, const float * w, float eps, const int32_t * pos,
                          int t, float theta_scale, const float corr[2], double * out, double * max_theta) {
    const int D = rc.D;
    double sumsq = 0.0;
    for (int c = 0; c < D; ++c) {
        sumsq += (double) x[c] * x[c];
    }
    const double scale = 1.0 / std::sqrt(sumsq / D + eps);
    std::vector<double> n(D);
    for (int c = 0; c < D; ++c) {
        n[c] = x[c] * scale * w[c];
        out[c] = n[c];
    }
    *max_theta = 0.0;
    const int sect_dims = rc.sections[0] + rc.sections[1] + rc.sections[2] + rc.sections[3];
    for (int j = 0; j < rc.n_dims / 2; ++j) {
        const int sector = j % sect_dims;
        int section = 3;
        if (rc.imrope) {
            // t, h, w interleaved pair by pair while each section lasts; the fourth after them.
            const int s = sector % 3;
            section = sector < 3 * rc.sections[s] ? s : 3;
        } else {
            int start = 0;
            for (int s = 0; s < 4; ++s) {
                if (sector >= start && sector < start + rc.sections[s]) {
                    section = s;
                }
                start += rc.sections[s];
            }
        }
        const double extrap = pos[section * rc.T + t] * std::pow((double) theta_scale, (double) j);
        double theta = rc.freq_scale * extrap;
        double mscale = 1.0;  // attn_factor
        if (rc.ext_factor != 0.0f) {
            const double y = (j - corr[0]) / std::max(0.001, (double) corr[1] - corr[0]);
            const double ramp = (1.0 - std::min(1.0, std::max(0.0, y))) * rc.ext_factor;
            theta = theta * (1.0 - ramp) + extrap * ramp;
            mscale *= 1.0 + 0.1 * std::log(1.0 / rc.freq_scale);
        }
        *max_theta = std::max(*max_theta, std::fabs(theta));
        const int a = rc.n_offs + j, b = a + rc.n_dims / 2;
        const double c = std::cos(theta) * mscale, s = std::sin(theta) * mscale;
        out[a] = n[a] * c - n[b] * s;
        out[b] = n[a] * s + n[b] * c;
    }
}

// Tolerance of a row, relative to its largest |value|: float32 norms stay near 1e-6; the rotation's
// angle error grows with |theta| (fast-math powf/sinf/cosf, float theta: ~1e-7 * |theta| measured
// against the bound, 4e-6 leaves an order of magnitude); a wrong section, pairing or sign is O(1).
static double row_tolerance(double max_theta) {
    return 2e-5 + 4e-6 * max_theta;
}

// weights_constant: the norm weights read before the wait (frt_attn_rope_args::weights_constant).
static int run_case(const rope_case & rc, bool weights_constant, std::mt19937 & rng) {
    const int D = rc.D, Hq = rc.Hq, Hkv = rc.Hkv, T = rc.T;
    const int v_cols = D * Hkv;
    const int q_head = rc.q_gated ? 2 * D : D;  // element strides of the input q
    const int q_token = q_head * Hq;
    std::uniform_real_distribution<float> u(-2.0f, 2.0f), wd(0.5f, 1.5f);
    std::vector<float> q((size_t) q_token * T), k((size_t) D * Hkv * T), v((size_t) v_cols * T), qw(D), kw(D);
    for (float & x : q) x = u(rng);
    for (float & x : k) x = u(rng);
    for (float & x : v) x = u(rng);
    for (float & x : qw) x = wd(rng);
    for (float & x : kw) x = wd(rng);
    std::vector<int32_t> pos(4 * T);
    for (int32_t & p : pos) p = (int32_t) (rng() % max_pos);
    // Distinct rows of the caches, in a random order.
    std::vector<int64_t> rows(kv_size);
    for (int r = 0; r < kv_size; ++r) rows[r] = r;
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<int64_t> k_rows(rows.begin(), rows.begin() + T), v_rows(rows.begin() + T, rows.begin() + 2 * T);
    std::vector<int32_t> k_rows32(k_rows.begin(), k_rows.end()), v_rows32(v_rows.begin(), v_rows.end());
    // The caches' old contents: random halves (kept where the batch does not write), NaN where it writes.
    std::vector<uint16_t> k_cache((size_t) kv_size * v_cols), v_cache((size_t) kv_size * v_cols);
    for (uint16_t & h : k_cache) h = half_bits(__float2half(u(rng)));
    for (uint16_t & h : v_cache) h = half_bits(__float2half(u(rng)));
    std::vector<uint16_t> k_before = k_cache, v_before = v_cache;
    for (int t = 0; t < T; ++t) {
        std::fill_n(k_cache.begin() + k_rows[t] * v_cols, v_cols, (uint16_t) 0xffff);
        std::fill_n(v_cache.begin() + v_rows[t] * v_cols, v_cols, (uint16_t) 0xffff);
    }
    const float eps = 1e-6f;
    const float theta_scale = powf(rc.freq_base, -2.0f / rc.n_dims);
    const float corr[2] = { 3.0f, 20.0f };

    float *dq, *dk, *dv, *dqw, *dkw, *dq_out;
    int32_t * dpos;
    void *drows_k, *drows_v;
    __half *dk_cache, *dv_cache;
    CHECK(cudaMalloc(&dq, q.size() * sizeof(float)));
    CHECK(cudaMalloc(&dk, k.size() * sizeof(float)));
    CHECK(cudaMalloc(&dv, v.size() * sizeof(float)));
    CHECK(cudaMalloc(&dqw, D * sizeof(float)));
    CHECK(cudaMalloc(&dkw, D * sizeof(float)));
    CHECK(cudaMalloc(&dq_out, (size_t) D * Hq * T * sizeof(float)));
    CHECK(cudaMalloc(&dpos, pos.size() * sizeof(int32_t)));
    CHECK(cudaMalloc(&drows_k, T * sizeof(int64_t)));
    CHECK(cudaMalloc(&drows_v, T * sizeof(int64_t)));
    CHECK(cudaMalloc(&dk_cache, k_cache.size() * sizeof(uint16_t)));
    CHECK(cudaMalloc(&dv_cache, v_cache.size() * sizeof(uint16_t)));
    CHECK(cudaMemcpy(dq, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k.data(), k.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dqw, qw.data(), D * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dkw, kw.data(), D * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dpos, pos.data(), pos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(drows_k, rc.rows_i32 ? (const void *) k_rows32.data() : (const void *) k_rows.data(),
                     T * (rc.rows_i32 ? sizeof(int32_t) : sizeof(int64_t)), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(drows_v, rc.rows_i32 ? (const void *) v_rows32.data() : (const void *) v_rows.data(),
                     T * (rc.rows_i32 ? sizeof(int32_t) : sizeof(int64_t)), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk_cache, k_cache.data(), k_cache.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv_cache, v_cache.data(), v_cache.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dq_out, 0xff, (size_t) D * Hq * T * sizeof(float)));  // NaN: an element never written shows

    frt_attn_rope_args a = {};
    a.head_dim = D, a.n_head_q = Hq, a.n_head_kv = Hkv, a.tokens = T;
    a.q = dq, a.q_head = q_head, a.q_token = q_token, a.q_weight = dqw, a.q_eps = eps;
    a.q_out = dq_out, a.q_out_head = D, a.q_out_token = (int64_t) D * Hq;
    if (rc.in_place) {
        a.q_out = dq, a.q_out_head = q_head, a.q_out_token = q_token;
    }
    a.k = dk, a.k_head = D, a.k_token = (int64_t) D * Hkv, a.k_weight = dkw, a.k_eps = eps;
    a.k_cache = dk_cache, a.k_cache_row = v_cols, a.k_rows = { drows_k, 1, rc.rows_i32 };
    a.v = dv, a.v_token = v_cols, a.v_cols = v_cols;
    a.v_cache = dv_cache, a.v_cache_row = v_cols, a.v_rows = { drows_v, 1, rc.rows_i32 };
    a.pos = dpos, a.n_dims = rc.n_dims, a.n_offs = rc.n_offs, a.imrope = rc.imrope;
    std::memcpy(a.sections, rc.sections, sizeof(a.sections));
    a.theta_scale = theta_scale, a.freq_scale = rc.freq_scale, a.ext_factor = rc.ext_factor, a.attn_factor = 1.0f;
    a.corr_dims[0] = corr[0], a.corr_dims[1] = corr[1];
    a.weights_constant = weights_constant;
    CHECK(frt_attn_rope(a, 0));
    CHECK(cudaDeviceSynchronize());

    std::vector<float> q_out((size_t) D * Hq * T);
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < Hq; ++h) {
            CHECK(cudaMemcpy(q_out.data() + ((size_t) t * Hq + h) * D, a.q_out + t * a.q_out_token + h * a.q_out_head,
                             D * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
    CHECK(cudaMemcpy(k_cache.data(), dk_cache, k_cache.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(v_cache.data(), dv_cache, v_cache.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));

    // q and k rows against the reference, each within its tolerance (worst ratio reported);
    // k as half: the rounding to half on top.
    double worst = 0.0;
    bool   ok = true;
    std::vector<double> ref(D);
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < Hq + Hkv; ++h) {
            const bool is_q = h < Hq;
            const float * x = is_q ? q.data() + (size_t) t * q_token + (size_t) h * q_head
                                   : k.data() + ((size_t) t * Hkv + (h - Hq)) * D;
            double max_theta = 0.0;
            reference_row(rc, x, is_q ? qw.data() : kw.data(), eps, pos.data(), t, theta_scale, corr, ref.data(),
                          &max_theta);
            double row_max = 0.0;
            for (double r : ref) row_max = std::max(row_max, std::fabs(r));
            const double tol = row_tolerance(max_theta) * row_max;
            for (int c = 0; c < D; ++c) {
                double got, bound = tol;
                if (is_q) {
                    got = q_out[((size_t) t * Hq + h) * D + c];
                } else {
                    got = half_value(k_cache[(size_t) k_rows[t] * v_cols + (size_t) (h - Hq) * D + c]);
                    bound += std::ldexp(std::fabs(ref[c]) + tol, -11) + 3e-8;  // half's rounding
                }
                const double err = std::isfinite(got) ? std::fabs(got - ref[c]) : INFINITY;
                worst = std::max(worst, err / bound);
                ok = ok && err <= bound;
            }
        }
    }
    // V: the half of each float, as set_rows rounds it; every other row of both caches untouched.
    int v_wrong = 0, untouched_wrong = 0;
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < v_cols; ++c) {
            v_wrong += v_cache[(size_t) v_rows[t] * v_cols + c] != half_bits(__float2half(v[(size_t) t * v_cols + c]));
        }
    }
    for (int r = 0; r < kv_size; ++r) {
        const bool k_written = std::find(k_rows.begin(), k_rows.end(), r) != k_rows.end();
        const bool v_written = std::find(v_rows.begin(), v_rows.end(), r) != v_rows.end();
        for (int c = 0; c < v_cols; ++c) {
            const size_t e = (size_t) r * v_cols + c;
            untouched_wrong += (!k_written && k_cache[e] != k_before[e]) + (!v_written && v_cache[e] != v_before[e]);
        }
    }
    ok = ok && v_wrong == 0 && untouched_wrong == 0;
    const std::string name = std::string(rc.name) + (weights_constant ? ", weights before the wait" : "");
    std::printf("%s %-76s err/tol %.3f, V wrong %d, untouched rows changed %d\n", ok ? "ok  " : "FAIL", name.c_str(),
                worst, v_wrong, untouched_wrong);
    for (void * p : { (void *) dq, (void *) dk, (void *) dv, (void *) dqw, (void *) dkw, (void *) dq_out, (void *) dpos,
                      drows_k, drows_v, (void *) dk_cache, (void *) dv_cache }) {
        CHECK(cudaFree(p));
    }
    return ok ? 0 : 1;
}

// Shapes the kernel must refuse (before any launch).
static int run_refusals() {
    frt_attn_rope_args good = {};
    good.head_dim = 256, good.n_head_q = 16, good.n_head_kv = 2, good.tokens = 1;
    good.n_dims = 64, good.sections[0] = 11, good.sections[1] = 11, good.sections[2] = 10;
    good.v_cols = 512;
    int wrong = 0;
    const auto refused = [&](frt_attn_rope_args a) { wrong += frt_attn_rope(a, 0) != cudaErrorInvalidValue; };
    frt_attn_rope_args a = good;
    a.head_dim = 1024;  // rms_norm_f32's 1024-thread path, another reduction order
    refused(a);
    a = good, a.head_dim = 255;
    refused(a);
    a = good, a.tokens = FRT_ATTN_ROPE_MAX_TOKENS + 1;
    refused(a);
    a = good, a.n_offs = 200;  // rotated channels past the row
    refused(a);
    a = good, a.sections[0] = a.sections[1] = a.sections[2] = 0;
    refused(a);
    std::printf("%s %-52s %d accepted\n", wrong == 0 ? "ok  " : "FAIL", "bad shapes refused", wrong);
    return wrong == 0 ? 0 : 1;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    const rope_case cases[] = {
        // qwen36: 256-wide heads, 16 q (gated) and 2 KV heads, 64 rotated channels, IMROPE 11/11/10.
        { "qwen36 shape, 1 token", 256, 16, 2, 1, 64, 0, { 11, 11, 10, 0 }, true, 1e7f, 1.0f, 0.0f, true, false, false },
        { "qwen36 shape, 8 tokens", 256, 16, 2, 8, 64, 0, { 11, 11, 10, 0 }, true, 1e7f, 1.0f, 0.0f, true, false, false },
        { "3 tokens, q in place, int32 rows", 256, 16, 2, 3, 64, 0, { 11, 11, 10, 0 }, true, 1e7f, 1.0f, 0.0f, false,
          true, true },
        { "MROPE, every channel rotated, YaRN", 128, 4, 1, 2, 128, 0, { 24, 20, 20, 0 }, false, 1e4f, 0.25f, 1.0f,
          false, false, false },
        { "40-wide heads, 3 KV heads, rotation from channel 6", 40, 3, 3, 5, 16, 6, { 3, 3, 2, 0 }, true, 1e6f, 1.0f,
          0.0f, false, false, true },
        { "512-wide heads (two columns a thread)", 512, 2, 1, 1, 128, 0, { 22, 22, 20, 0 }, true, 1e7f, 1.0f, 0.0f,
          true, false, false },
    };
    int failed = 0;
    for (const rope_case & rc : cases) {
        for (const bool weights_constant : { false, true }) {
            failed += run_case(rc, weights_constant, rng);
        }
    }
    failed += run_refusals();
    const int n_cases = 2 * (int) (sizeof(cases) / sizeof(cases[0])) + 1;
    std::printf("%d passed, %d failed\n", n_cases - failed, failed);
    return failed == 0 ? 0 : 1;
}
