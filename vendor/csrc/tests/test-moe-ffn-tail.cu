// Unit test of frt_moe_tail against a float64 CPU reference of an MoE FFN's tail (the routed
// experts' weighted sum, the shared expert gated by sigmoid(gate), the residual), on fresh random
// inputs, the output poisoned first; also with the output written in place over the residual and
// over the first expert slot (the aliasing ggml-alloc may choose). Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-moe-ffn-tail.cu -o test-moe-ffn-tail && ./test-moe-ffn-tail

#include "moe-ffn-tail.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/test-device.cuh"

enum class out_at { own, residual, first_slot };

struct tail_case {
    const char * name;
    int          n_embd, n_used, tokens;
    out_at       out;
};

static int run_case(const tail_case & tc, std::mt19937 & rng) {
    const int n = tc.n_embd, k_used = tc.n_used, T = tc.tokens;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f), g(-4.0f, 4.0f), w(0.0f, 1.0f);
    std::vector<float> experts((size_t) T * k_used * n), weights((size_t) T * k_used), shexp((size_t) T * n),
        gate(T), residual((size_t) T * n);
    for (float & v : experts) v = u(rng);
    for (float & v : weights) v = w(rng);
    for (float & v : shexp) v = u(rng);
    for (float & v : gate) v = g(rng);
    for (float & v : residual) v = u(rng);

    std::vector<double> ref((size_t) T * n);
    for (int t = 0; t < T; ++t) {
        const double sig = 1.0 / (1.0 + std::exp(-(double) gate[t]));
        for (int c = 0; c < n; ++c) {
            double moe = 0.0;
            for (int k = 0; k < k_used; ++k) {
                moe += (double) experts[((size_t) t * k_used + k) * n + c] * weights[(size_t) t * k_used + k];
            }
            ref[(size_t) t * n + c] = moe + shexp[(size_t) t * n + c] * sig + residual[(size_t) t * n + c];
        }
    }

    float *dexperts, *dweights, *dshexp, *dgate, *dresidual, *dout;
    CHECK(cudaMalloc(&dexperts, experts.size() * sizeof(float)));
    CHECK(cudaMalloc(&dweights, weights.size() * sizeof(float)));
    CHECK(cudaMalloc(&dshexp, shexp.size() * sizeof(float)));
    CHECK(cudaMalloc(&dgate, gate.size() * sizeof(float)));
    CHECK(cudaMalloc(&dresidual, residual.size() * sizeof(float)));
    CHECK(cudaMalloc(&dout, residual.size() * sizeof(float)));
    CHECK(cudaMemcpy(dexperts, experts.data(), experts.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dweights, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dshexp, shexp.data(), shexp.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dgate, gate.data(), gate.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dresidual, residual.data(), residual.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dout, 0xff, residual.size() * sizeof(float)));  // NaN: an element never written shows

    frt_moe_tail_args a = {};
    a.n_embd = n, a.n_used = k_used, a.tokens = T;
    a.experts = dexperts, a.experts_token = (int64_t) k_used * n, a.experts_slot = n;
    a.weights = dweights, a.weights_token = k_used;
    a.shexp = dshexp, a.shexp_token = n;
    a.gate = dgate, a.gate_token = 1;
    a.residual = dresidual, a.residual_token = n;
    a.out = dout, a.out_token = n;
    if (tc.out == out_at::residual) {
        a.out = dresidual;
    } else if (tc.out == out_at::first_slot) {
        a.out = dexperts, a.out_token = a.experts_token;
    }
    CHECK(frt_moe_tail(a, 0));
    CHECK(cudaDeviceSynchronize());

    std::vector<float> got((size_t) T * n);
    for (int t = 0; t < T; ++t) {
        CHECK(cudaMemcpy(got.data() + (size_t) t * n, a.out + t * a.out_token, n * sizeof(float),
                         cudaMemcpyDeviceToHost));
    }
    // max |got - ref| / max |ref|: float32 sums of a few products and fast-math's sigmoid against
    // float64 stay near 1e-7; 1e-5 leaves room for any draw, a wrong term or order would not fit.
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        num = std::fmax(num, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) : INFINITY);
        den = std::fmax(den, std::fabs(ref[i]));
    }
    const double err = num / den;
    const bool   ok  = err < 1e-5;
    std::printf("%s %-46s err %.2e\n", ok ? "ok  " : "FAIL", tc.name, err);
    for (float * p : { dexperts, dweights, dshexp, dgate, dresidual, dout }) {
        CHECK(cudaFree(p));
    }
    return ok ? 0 : 1;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    const tail_case cases[] = {
        { "qwen36 shape, 1 token", 2048, 8, 1, out_at::own },
        { "qwen36 shape, 3 tokens", 2048, 8, 3, out_at::own },
        { "300 columns (a partial block), 4 used", 300, 4, 2, out_at::own },
        { "1 used expert", 512, 1, 1, out_at::own },
        { "16 used experts", 1024, 16, 1, out_at::own },
        { "in place over the residual, 2 tokens", 2048, 8, 2, out_at::residual },
        { "in place over the first slot, 2 tokens", 2048, 8, 2, out_at::first_slot },
    };
    int failed = 0;
    for (const tail_case & tc : cases) {
        failed += run_case(tc, rng);
    }
    const int n_cases = (int) (sizeof(cases) / sizeof(cases[0]));
    std::printf("%d passed, %d failed\n", n_cases - failed, failed);
    return failed == 0 ? 0 : 1;
}
