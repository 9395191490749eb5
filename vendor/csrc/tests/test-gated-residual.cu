// Unit test of frt_gated_residual_f32 against a float64 CPU reference, on fresh random inputs,
// with the output poisoned first; in-place (out = a) too. Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-gated-residual.cu -o test-gated-residual && ./test-gated-residual

#include "gated-residual.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/test-device.cuh"

static int run_case(int n, int tokens, int pad, bool residual, bool in_place, std::mt19937 & rng) {
    const int64_t stride = n + pad;
    std::normal_distribution<float> dist(0.0f, 1.0f);
    auto draw = [&](size_t count) {
        std::vector<float> v(count);
        for (float & x : v) x = dist(rng);
        return v;
    };
    // A gate weight of std 1/sqrt(n) keeps the sigmoid away from saturation.
    std::vector<float> w = draw(n);
    for (float & x : w) x /= std::sqrt((float) n);
    const std::vector<float> x = draw(stride * tokens), s = draw(stride * tokens), a = draw(stride * tokens),
                             r = draw(stride * tokens);
    float *dw = upload(w), *dx = upload(x), *ds = upload(s), *da = upload(a), *dr = upload(r), *dout = da;
    if (!in_place) {
        CHECK(cudaMalloc(&dout, stride * tokens * sizeof(float)));
        CHECK(cudaMemset(dout, 0xff, stride * tokens * sizeof(float)));  // NaN poison
    }
    frt_gated_residual_args p;
    p.w = dw, p.x = dx, p.s = ds, p.a = da, p.r = residual ? dr : nullptr, p.out = dout;
    p.n = n, p.n_tokens = tokens;
    p.x_token = p.s_token = p.a_token = p.r_token = p.out_token = stride;
    CHECK(frt_gated_residual_f32(p, 0));
    CHECK(cudaDeviceSynchronize());
    std::vector<float> out(stride * tokens);
    CHECK(cudaMemcpy(out.data(), dout, out.size() * sizeof(float), cudaMemcpyDeviceToHost));

    double err2 = 0.0, ref2 = 0.0;
    bool finite = true;
    for (int t = 0; t < tokens; ++t) {
        double dot = 0.0;
        for (int c = 0; c < n; ++c) dot += (double) w[c] * x[t * stride + c];
        const double g = 1.0 / (1.0 + std::exp(-dot));
        for (int c = 0; c < n; ++c) {
            const size_t k = t * stride + c;
            const double ref = a[k] + g * s[k] + (residual ? r[k] : 0.0);
            finite = finite && std::isfinite(out[k]);
            err2 += (out[k] - ref) * (out[k] - ref);
            ref2 += ref * ref;
        }
    }
    const double rel = std::sqrt(err2 / ref2);
    const bool ok = finite && rel < 1e-5;
    std::printf("%-4s n=%5d tokens=%3d pad=%d residual=%d in_place=%d  rel_err=%.2e\n", ok ? "ok" : "FAIL", n, tokens,
                pad, residual, in_place, rel);
    for (float * d : { dw, dx, ds, da, dr }) CHECK(cudaFree(d));
    if (!in_place) CHECK(cudaFree(dout));
    return ok ? 0 : 1;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    int failed = 0, total = 0;
    struct { int n, tokens, pad; bool residual, in_place; } cases[] = {
        { 2048, 1, 0, true, false },  // qwen3.6 decode
        { 2048, 9, 0, true, false },  // prefill
        { 2048, 1, 0, false, false },
        { 2048, 4, 0, true, true },
        { 96, 3, 5, true, false },
        { 33, 2, 0, false, true },
    };
    for (const auto & c : cases) {
        failed += run_case(c.n, c.tokens, c.pad, c.residual, c.in_place, rng);
        ++total;
    }
    std::printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
