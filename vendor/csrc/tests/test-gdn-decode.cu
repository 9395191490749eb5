// Unit test of frt_gdn_decode against a float64 CPU reference of the Gated DeltaNet decode step,
// on fresh random inputs, the output poisoned first. Checks the output, both caches' new rows
// (the conv columns exactly: they are copies), and that no other cache row changes; one sequence
// both in two launches and in one (whose flags must be zero again afterwards). One sequence also
// with the output's handoff image (frt_gdn_decode_args::x_q8, poisoned first): every 32-value block
// within quantization of the output and its sums its values', and exact GEMV launches from the
// image (x pointing at NaNs; plain and SwiGLU) bit for bit the same launches reading the output
// itself (tests/test-handoff.cuh). Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-gdn-decode.cu -o test-gdn-decode && ./test-gdn-decode

#include "gdn-decode.cuh"
#include "q8-x.cuh"
#include "tests/test-gemv-reference.cuh"

#include <cstring>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/test-device.cuh"
#include "tests/test-handoff.cuh"

constexpr int D = FRT_GDN_HEAD_DIM;

struct gdn_case {
    const char * name;
    int  k_heads, v_heads, n_seqs;
    bool shared_source;  // every sequence reads row dst_row (after a sequence copy)
    bool other_row;      // every sequence reads the last row, a bystander (a copy from outside)
};

static double silu(double x) { return x / (1.0 + std::exp(-x)); }

// max |got - ref| / max |ref|: the normwise error, independent of single small values.
static double rel_err(const std::vector<float> & got, const std::vector<double> & ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        num = std::fmax(num, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY);
        den = std::fmax(den, std::fabs(ref[i]));
    }
    return num / den;
}

// `flags`: the one-launch path (one sequence), else the two launches. `image`: with the handoff
// image (one sequence).
static int run_case(const gdn_case & tc, bool flags, bool image, std::mt19937 & rng) {
    const int     H_k = tc.k_heads, H_v = tc.v_heads, n = tc.n_seqs;
    const int     C        = (2 * H_k + H_v) * D;
    const int64_t conv_row = 3 * C, ssm_row = (int64_t) H_v * D * D;
    const int     dst_row  = 1, rows = dst_row + n + 1;  // row 0 and the last: bystanders
    const auto    uniform  = [&](std::vector<float> & v, float lo, float hi) {
        std::uniform_real_distribution<float> d(lo, hi);
        for (float & x : v) x = d(rng);
    };
    std::vector<float> qkv(n * C), z(n * H_v * D), alpha(n * H_v), beta(n * H_v), conv_w(C * 4), dt(H_v), a(H_v),
        norm_w(D), conv(rows * conv_row), ssm(rows * ssm_row);
    uniform(qkv, -2, 2), uniform(z, -2, 2), uniform(alpha, -4, 2), uniform(beta, -4, 4), uniform(conv_w, -0.5f, 0.5f);
    uniform(dt, -1, 1), uniform(a, -2, -0.1f), uniform(norm_w, 0.5f, 1.5f), uniform(conv, -2, 2), uniform(ssm, -1, 1);
    std::vector<int32_t> ids(n);
    for (int s = 0; s < n; ++s) ids[s] = tc.other_row ? rows - 1 : tc.shared_source ? dst_row : dst_row + s;
    const float l2_eps = 1e-6f / D, l2_scale = 1.0f / std::sqrt((float) D), norm_eps = 1e-6f;

    // Reference, float64, from the inputs as drawn.
    std::vector<double> ref_out(n * H_v * D), ref_ssm(n * ssm_row);
    std::vector<float>  ref_conv(n * conv_row);
    for (int s = 0; s < n; ++s) {
        const float * old = &conv[ids[s] * conv_row];
        std::vector<double> y(C);
        for (int c = 0; c < C; ++c) {
            const double taps[4] = { old[c * 3], old[c * 3 + 1], old[c * 3 + 2], qkv[s * C + c] };
            double sum = 0.0;
            for (int j = 0; j < 4; ++j) sum += taps[j] * conv_w[c * 4 + j];
            y[c] = silu(sum);
            for (int j = 0; j < 3; ++j) ref_conv[s * conv_row + c * 3 + j] = (float) taps[j + 1];
        }
        for (int head = 0; head < 2 * H_k; ++head) {  // q and k heads: L2 norm as rms_norm(eps / D) * 1/sqrt(D)
            double ss = 0.0;
            for (int i = 0; i < D; ++i) ss += y[head * D + i] * y[head * D + i];
            const double scale = 1.0 / std::sqrt(ss / D + l2_eps);
            for (int i = 0; i < D; ++i) y[head * D + i] *= scale * l2_scale;
        }
        for (int h = 0; h < H_v; ++h) {
            const double  x_alpha = (double) alpha[s * H_v + h] + dt[h];
            const double  g       = std::exp((x_alpha > 20.0 ? x_alpha : std::log1p(std::exp(x_alpha))) * a[h]);
            const double  b       = 1.0 / (1.0 + std::exp(-(double) beta[s * H_v + h]));
            const double *q = &y[(h % H_k) * D], *k = &y[(H_k + h % H_k) * D], *v = &y[(2 * H_k + h) * D];
            const float * st = &ssm[ids[s] * ssm_row + (int64_t) h * D * D];
            double *      nst = &ref_ssm[s * ssm_row + (int64_t) h * D * D];
            std::vector<double> o(D);
            for (int col = 0; col < D; ++col) {
                double kv = 0.0;
                for (int i = 0; i < D; ++i) kv += st[col * D + i] * k[i];
                const double delta = (v[col] - g * kv) * b;
                double       acc   = 0.0;
                for (int i = 0; i < D; ++i) {
                    nst[col * D + i] = g * st[col * D + i] + k[i] * delta;
                    acc += nst[col * D + i] * q[i];
                }
                o[col] = acc / std::sqrt((double) D);
            }
            double ss = 0.0;
            for (double x : o) ss += x * x;
            const double scale = 1.0 / std::sqrt(ss / D + norm_eps);
            for (int col = 0; col < D; ++col) {
                ref_out[(s * H_v + h) * D + col] = o[col] * scale * norm_w[col] * silu(z[(s * H_v + h) * D + col]);
            }
        }
    }

    float *dqkv = upload(qkv), *dz = upload(z), *dalpha = upload(alpha), *dbeta = upload(beta), *dconv_w = upload(conv_w);
    float *ddt = upload(dt), *da = upload(a), *dnorm_w = upload(norm_w), *dconv = upload(conv), *dssm = upload(ssm);
    int32_t * dids = upload(ids);
    float *   dout = upload(std::vector<float>(n * H_v * D, NAN));
    void *    scratch = nullptr;
    const size_t scratch_bytes = frt_gdn_decode_scratch_bytes(n, H_k, H_v);
    CHECK(cudaMalloc(&scratch, scratch_bytes));
    CHECK(cudaMemset(scratch, 0xff, scratch_bytes));  // NaN: a value read before it is written shows

    frt_gdn_decode_args args = {};
    args.n_seqs = n, args.k_heads = H_k, args.v_heads = H_v;
    args.qkv = dqkv, args.qkv_seq = C, args.z = dz, args.z_seq = H_v * D, args.z_head = D;
    args.alpha = dalpha, args.alpha_seq = H_v, args.beta = dbeta, args.beta_seq = H_v;
    args.conv_w = dconv_w, args.dt_bias = ddt, args.a = da, args.norm_w = dnorm_w, args.weights_constant = true;
    args.ids = dids, args.conv_state = dconv, args.conv_row = conv_row, args.ssm_state = dssm, args.ssm_row = ssm_row;
    args.dst_row = dst_row, args.out = dout, args.out_seq = H_v * D, args.out_head = D;
    args.l2_eps = l2_eps, args.l2_scale = l2_scale, args.norm_eps = norm_eps, args.attn_scale = 1.0f / std::sqrt((float) D);
    args.scratch = scratch;
    int * dflags = nullptr;
    if (flags) {
        CHECK(cudaMalloc(&dflags, H_k * sizeof(int)));
        CHECK(cudaMemset(dflags, 0, H_k * sizeof(int)));
        args.flags = dflags;
    }
    uint8_t * dimage = nullptr;
    if (image) {
        dimage = upload(std::vector<uint8_t>(frt_x_q8_bytes(H_v * D), 0xff));  // poisoned: NaN scales, -1 values
        args.x_q8 = dimage;
    }
    CHECK(frt_gdn_decode(args, 0));
    CHECK(cudaDeviceSynchronize());
    // The flags are zero again for the next launch.
    bool flags_zero = true;
    if (flags) {
        for (int f : download(dflags, H_k)) flags_zero &= f == 0;
        CHECK(cudaFree(dflags));
    }

    const std::vector<float> out = download(dout, n * H_v * D), conv_after = download(dconv, rows * conv_row),
                             ssm_after = download(dssm, rows * ssm_row);
    std::vector<float> new_ssm(ssm_after.begin() + dst_row * ssm_row, ssm_after.begin() + (dst_row + n) * ssm_row);
    const double err_out = rel_err(out, ref_out), err_ssm = rel_err(new_ssm, ref_ssm);
    bool conv_exact = true, bystanders = true;
    for (int64_t i = 0; i < n * conv_row; ++i) conv_exact &= conv_after[dst_row * conv_row + i] == ref_conv[i];
    for (int row : { 0, rows - 1 }) {
        for (int64_t i = 0; i < conv_row; ++i) bystanders &= conv_after[row * conv_row + i] == conv[row * conv_row + i];
        for (int64_t i = 0; i < ssm_row; ++i) bystanders &= ssm_after[row * ssm_row + i] == ssm[row * ssm_row + i];
    }
    std::mt19937_64 rng64(rng());
    const bool      image_right = !image || handoff_image_ok(out, dout, dimage, H_v * D, rng64);
    // float32 sums of 128 products against float64: ~1e-6 normwise; 1e-4 leaves room for any draw.
    const bool ok = err_out < 1e-4 && err_ssm < 1e-4 && conv_exact && bystanders && flags_zero && image_right;
    std::printf("%s %-46s %-12s out %.2e  state %.2e  conv %s  other rows %s%s%s\n", ok ? "ok  " : "FAIL", tc.name,
                flags ? "one launch" : "two launches", err_out, err_ssm, conv_exact ? "exact" : "DIFFER",
                bystanders ? "kept" : "CHANGED", flags_zero ? "" : "  flags NOT ZERO",
                !image ? "" : image_right ? "  image right" : "  image WRONG");
    if (dimage != nullptr) {
        CHECK(cudaFree(dimage));
    }
    for (void * p : { (void *) dqkv, (void *) dz, (void *) dalpha, (void *) dbeta, (void *) dconv_w, (void *) ddt,
                      (void *) da, (void *) dnorm_w, (void *) dconv, (void *) dssm, (void *) dids, (void *) dout, scratch }) {
        CHECK(cudaFree(p));
    }
    return ok ? 0 : 1;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    const gdn_case cases[] = {
        { "qwen36 shape, 1 sequence", 16, 32, 1, false, false },
        { "qwen36 shape, 1 sequence from another row", 16, 32, 1, false, true },
        { "1 key head, 3 value heads, 1 sequence", 1, 3, 1, false, false },
        { "4 key heads, 4 value heads, 1 sequence", 4, 4, 1, false, false },
        { "qwen36 shape, 4 sequences", 16, 32, 4, false, false },
        { "qwen36 shape, 8 sequences", 16, 32, 8, false, false },
        { "2 key heads, 4 value heads, 3 sequences", 2, 4, 3, false, false },
        { "qwen36 shape, 3 sequences, one source row", 16, 32, 3, true, false },
        { "1 key head, 3 value heads, 2 seqs, one source", 1, 3, 2, true, false },
        { "qwen36 shape, 2 sequences from another row", 16, 32, 2, false, true },
    };
    int failed = 0, n_cases = 0;
    for (const gdn_case & tc : cases) {
        failed += run_case(tc, false, false, rng);
        ++n_cases;
        if (tc.n_seqs == 1) {  // and in one launch
            failed += run_case(tc, true, false, rng);
            ++n_cases;
        }
        if (tc.n_seqs == 1 && tc.v_heads * D % 256 == 0) {  // with the handoff image, in one and two launches
            for (const bool flags : { true, false }) {
                failed += run_case(tc, flags, true, rng);
                ++n_cases;
            }
        }
    }
    // The image only for one sequence of a width the GEMV takes.
    frt_gdn_decode_args bad = {};
    bad.n_seqs = 2, bad.k_heads = 16, bad.v_heads = 32, bad.out_head = D, bad.x_q8 = (void *) 256;
    const bool refused = frt_gdn_decode(bad, 0) == cudaErrorInvalidValue;
    (void) cudaGetLastError();
    std::printf("%s %-46s\n", refused ? "ok  " : "FAIL", "image refused for 2 sequences");
    failed += refused ? 0 : 1;
    ++n_cases;
    std::printf("%d passed, %d failed\n", n_cases - failed, failed);
    return failed == 0 ? 0 : 1;
}
