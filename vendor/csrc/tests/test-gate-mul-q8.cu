// Unit test of frt_gate_mul_q8 (vendor/csrc/gate-mul-q8.cu): the attention output gate
// sigmoid(gate) * attn within float32 rounding of a float64 reference, every element written (the
// output poisoned with NaN first), and the product's q8 image holding it (tests/test-handoff.cuh:
// every 32-value block within quantization, exact GEMV launches from the image bit for bit those
// from the product); the gate read through a view with twice the head stride, as qwen36's q
// projection holds it; the product written over attn in place; fewer 32-value blocks than the
// launch's warps (no image there: the check launches take k in multiples of 256); refusals. Fresh
// random inputs every run (the seed is printed; `test-gate-mul-q8 SEED` reruns it). Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu vendor/csrc/tests/test-gate-mul-q8.cu \
//        -o test-gate-mul-q8 && ./test-gate-mul-q8

#include "gate-mul-q8.cuh"
#include "q8-x.cuh"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "tests/test-device.cuh"
#include "tests/test-handoff.cuh"

namespace {

struct gate_case {
    std::string name;
    int         d, heads;
    int64_t     gate_head;  // floats between the gate's heads (>= d)
    bool        in_place;   // the product written over attn (attn contiguous)
    bool        image;
};

bool run_case(const gate_case & gc, std::mt19937_64 & rng) {
    const int                             k = gc.d * gc.heads;
    std::normal_distribution<float>       attn_dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> gate_dist(-12.0f, 12.0f);  // sigmoid from ~0 to ~1
    std::vector<float>                    attn(k), gate((size_t) gc.gate_head * gc.heads);
    for (float & v : attn) {
        v = attn_dist(rng);
    }
    for (float & v : gate) {
        v = gate_dist(rng);
    }
    float * d_attn  = upload(attn);
    float * d_gate  = upload(gate);
    float * d_out   = gc.in_place ? d_attn : upload_poisoned(k);
    void *  d_image = gc.image ? upload(std::vector<uint8_t>(frt_x_q8_bytes(k), 0xff)) : nullptr;  // NaN scales

    frt_gate_mul_q8_args a{};
    a.attn = d_attn, a.attn_head = gc.d;
    a.gate = d_gate, a.gate_head = gc.gate_head;
    a.out = d_out, a.x_q8 = d_image, a.d = gc.d, a.heads = gc.heads;
    CHECK(frt_gate_mul_q8(a, 0));
    CHECK(cudaDeviceSynchronize());

    // expf under fast math: up to 2 + 1.2 |gate| ulps (16 at |gate| = 12), carried into the
    // sigmoid where it is small; the reciprocal and the product about one more each: 32 allowed.
    const std::vector<float> out = download(d_out, k);
    const double             ulp = std::ldexp(1.0, -23);
    bool                     ok  = true;
    for (int i = 0; i < k && ok; ++i) {
        const int    h = i / gc.d, c = i % gc.d;
        const double g = gate[(size_t) h * gc.gate_head + c];
        const double ref = attn[i] / (1.0 + std::exp(-g));
        if (!(std::fabs(out[i] - ref) <= 32 * ulp * std::fabs(ref) + 1e-30)) {
            std::printf("FAIL %s: out[%d] = %.9g, the float64 reference %.9g\n", gc.name.c_str(), i, out[i], ref);
            ok = false;
        }
    }
    if (ok && gc.image && !handoff_image_ok(out, d_out, d_image, k, rng)) {
        std::printf("FAIL %s: the product's image\n", gc.name.c_str());
        ok = false;
    }
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", gc.name.c_str());
    CHECK(cudaFree(d_attn));
    CHECK(cudaFree(d_gate));
    if (!gc.in_place) {
        CHECK(cudaFree(d_out));
    }
    if (d_image != nullptr) {
        CHECK(cudaFree(d_image));
    }
    return ok;
}

bool run_refusals() {
    frt_gate_mul_q8_args good{};
    static float dummy[64];
    good.attn = good.gate = good.out = dummy;
    good.d = 256, good.heads = 16, good.attn_head = 256, good.gate_head = 512;
    struct refusal {
        const char *         what;
        frt_gate_mul_q8_args a;
    };
    std::vector<refusal> refusals;
    refusal r{ "d = 48 (not a multiple of 32)", good };
    r.a.d = 48, r.a.attn_head = 48;
    refusals.push_back(r);
    r = { "gate heads closer than d", good };
    r.a.gate_head = 128;
    refusals.push_back(r);
    r = { "no gate", good };
    r.a.gate = nullptr;
    refusals.push_back(r);
    r = { "x_q8 not 16-byte aligned", good };
    r.a.x_q8 = (uint8_t *) dummy + 4;
    refusals.push_back(r);
    r = { "d * heads over FRT_X_Q8_MAX_K with an image", good };
    r.a.heads = FRT_X_Q8_MAX_K / 256 + 1, r.a.x_q8 = dummy;
    refusals.push_back(r);
    bool ok = frt_gate_mul_q8_unsupported(good) == nullptr;
    if (!ok) {
        std::printf("FAIL a good launch refused: %s\n", frt_gate_mul_q8_unsupported(good));
    }
    for (const refusal & x : refusals) {
        if (frt_gate_mul_q8_unsupported(x.a) == nullptr || frt_gate_mul_q8(x.a, 0) != cudaErrorInvalidValue) {
            std::printf("FAIL not refused: %s\n", x.what);
            ok = false;
        }
    }
    std::printf("%s %zu refusals\n", ok ? "ok  " : "FAIL", refusals.size());
    return ok;
}

}  // namespace

int main(int argc, char ** argv) {
    const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
    std::printf("seed %" PRIu64 " (rerun with: test-gate-mul-q8 %" PRIu64 ")\n", seed, seed);
    std::mt19937_64 rng(seed);
    const gate_case cases[] = {
        { "qwen36: 16 heads of 256, the gate interleaved with q, the image", 256, 16, 512, false, true },
        { "qwen36, the product over attn, the image", 256, 16, 512, true, true },
        { "qwen36, no image", 256, 16, 512, false, false },
        { "6 heads of 128, contiguous gate, the image", 128, 6, 128, false, true },
        { "3 heads of 64 (6 blocks of 32: 2 of the launch's 8 warps idle)", 64, 3, 64, false, false },
    };
    int passed = 0, failed = 0;
    for (const gate_case & gc : cases) {
        (run_case(gc, rng) ? passed : failed)++;
    }
    (run_refusals() ? passed : failed)++;
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
