// Unit test of frt_router_f32 (vendor/csrc/router-f32.cu): an input norm and F32 rows, one row a
// block, must give the very bits of the exact GEMV kernel's launch of the same norm and rows
// (frt_gemv with FRT_GEMV_KERNEL_EXACT, which plays ggml-cuda's rms_norm and mmvf), outputs and
// normed x alike, and lie within float32 rounding of a float64 reference. Fresh random inputs every
// run (the seed is printed; `test-router-f32 SEED` reruns it), outputs poisoned with NaN first:
// qwen36's router with the shared expert's gate vector, k of 1024 to 4096 (1536 and 3072: the
// norm's last pass partial), padded rows, three segments; x written by a kernel still running
// when the launch starts (programmatic dependent launch: the wait must come before x is read);
// the normed x's image for the next launch (frt_router_f32_args::x_q8, poisoned first: every
// 32-value block within quantization of the normed x, and exact GEMV launches from it, plain and
// SwiGLU, bit for bit those reading the normed x; tests/test-handoff.cuh), also from fewer
// blocks than the normed x has groups of 128 values (blocks then write two); launches it must
// refuse. Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu vendor/csrc/tests/test-router-f32.cu \
//        -o test-router-f32 && ./test-router-f32

#include "gemv.cuh"
#include "pdl.cuh"
#include "router-f32.cuh"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/test-device.cuh"
#include "tests/test-handoff.cuh"

namespace {

uint32_t bits(float v) {
    uint32_t b;
    std::memcpy(&b, &v, sizeof b);
    return b;
}

// Spins about `ns` nanoseconds, lets its dependents start at once, then writes x from src: a
// kernel before the router that is still running when the router's blocks start.
__global__ void late_writer(const float * src, float * x, int n, unsigned ns) {
    frt_pdl_launch_dependents();
    frt_pdl_wait();
    const uint64_t start = clock64();
    while (clock64() - start < (uint64_t) ns * 2) {  // ~2 cycles a ns at the clocks of sm_90 parts
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        x[i] = src[i];
    }
}

struct router_case {
    std::string      name;
    int              k;
    std::vector<int> rows;        // a segment each
    int              pad    = 0;  // floats between rows beyond k (a multiple of 4)
    bool             normed = false;
    bool             late_x = false;  // x written by a kernel still running at the launch
    bool             image  = false;  // with normed: the normed x's image written too (x_q8)
};

bool run_case(const router_case & rc, std::mt19937_64 & rng) {
    const int k = rc.k, n_seg = (int) rc.rows.size();
    const int64_t stride = k + rc.pad;
    std::normal_distribution<float>       normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> gain(0.5f, 1.5f);
    const float x_scale = 0.1f + 3.0f * std::uniform_real_distribution<float>(0.0f, 1.0f)(rng);
    std::vector<float> x(k), norm(k);
    for (float & v : x) {
        v = x_scale * normal(rng);
    }
    for (float & v : norm) {
        v = gain(rng);
    }
    float * d_x_src = upload(x);
    float * d_x     = rc.late_x ? upload_poisoned(k) : upload(x);
    float * d_norm  = upload(norm);
    // The router reads the rows `stride` floats apart (poison in the padding); the exact kernel
    // takes contiguous rows only, so it reads a contiguous copy of the same values.
    std::vector<std::vector<float>> w(n_seg);
    std::vector<float *>            d_w(n_seg), d_w_exact(n_seg), out_exact(n_seg), out_router(n_seg);
    for (int i = 0; i < n_seg; ++i) {
        w[i].resize((size_t) rc.rows[i] * k);
        for (float & v : w[i]) {
            v = 0.05f * normal(rng);
        }
        std::vector<float> padded((size_t) rc.rows[i] * stride);
        std::vector<uint32_t> poison(padded.size(), kPoison);
        std::memcpy(padded.data(), poison.data(), padded.size() * sizeof(float));
        for (int r = 0; r < rc.rows[i]; ++r) {
            std::memcpy(padded.data() + (size_t) r * stride, w[i].data() + (size_t) r * k, k * sizeof(float));
        }
        d_w[i]        = upload(padded);
        d_w_exact[i]  = upload(w[i]);
        out_exact[i]  = upload_poisoned(rc.rows[i]);
        out_router[i] = upload_poisoned(rc.rows[i]);
    }
    float * normed_exact  = rc.normed ? upload_poisoned(k) : nullptr;
    float * normed_router = rc.normed ? upload_poisoned(k) : nullptr;
    void *  image         = rc.image ? upload(std::vector<uint8_t>(frt_x_q8_bytes(k), 0xff)) : nullptr;  // NaN scales

    frt_gemv_args g{};
    g.x               = d_x_src;  // the exact kernel reads x as written; the router reads d_x (late or not)
    g.x_stride        = k;
    g.k               = k;
    g.tokens          = 1;
    g.x_per_token     = 1;
    g.norm            = d_norm;
    g.eps             = 1e-6f;
    g.x_normed        = normed_exact;
    g.x_normed_stride = k;
    g.n_segments      = n_seg;
    frt_router_f32_args a{};
    a.x          = d_x;
    a.norm       = d_norm;
    a.eps        = g.eps;
    a.k          = k;
    a.x_normed   = normed_router;
    a.x_q8       = image;
    a.n_segments = n_seg;
    for (int i = 0; i < n_seg; ++i) {
        frt_gemv_segment & s = g.seg[i];
        s.type               = FRT_GEMV_F32;
        s.w                  = d_w_exact[i];
        s.rows               = rc.rows[i];
        s.row_stride         = k * (int64_t) sizeof(float);
        s.out                = out_exact[i];
        s.out_stride         = rc.rows[i];
        s.epilogue           = FRT_GEMV_STORE;
        a.seg[i]             = { d_w[i], rc.rows[i], stride, out_router[i] };
    }
    bool ok = true;
    if (const char * why = frt_gemv_unsupported(g, FRT_GEMV_KERNEL_EXACT)) {
        std::printf("FAIL %s: the exact kernel refuses the reference launch: %s\n", rc.name.c_str(), why);
        return false;
    }
    if (const char * why = frt_router_f32_unsupported(a)) {
        std::printf("FAIL %s: refused: %s\n", rc.name.c_str(), why);
        return false;
    }
    // cudaMemcpy from pageable memory may return before its DMA lands, and a non-blocking stream
    // does not wait for the legacy one.
    CHECK(cudaDeviceSynchronize());
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(frt_gemv(g, stream, FRT_GEMV_KERNEL_EXACT));
    if (rc.late_x) {
        CHECK(frt_launch(late_writer, dim3(1), dim3(256), 0, stream, (const float *) d_x_src, d_x, k, 20000u));
    }
    CHECK(frt_router_f32(a, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaStreamDestroy(stream));

    // The float64 reference: the normed x, then each row's sum; float32 rounding bounds (the
    // normed value: a few ulps; a sum of k products: k ulps of the sum of their magnitudes).
    double ss = 0.0;
    for (float v : x) {
        ss += (double) v * v;
    }
    const double       scale = 1.0 / std::sqrt(ss / k + 1e-6);
    std::vector<double> nx(k);
    for (int c = 0; c < k; ++c) {
        nx[c] = x[c] * scale * norm[c];
    }
    const double ulp = std::ldexp(1.0, -23);
    for (int i = 0; i < n_seg && ok; ++i) {
        const std::vector<float> e = download(out_exact[i], rc.rows[i]), r = download(out_router[i], rc.rows[i]);
        for (int row = 0; row < rc.rows[i]; ++row) {
            if (bits(e[row]) != bits(r[row])) {
                std::printf("FAIL %s: segment %d row %d: %.9g, the exact kernel %.9g (bits %08x, %08x)\n",
                            rc.name.c_str(), i, row, r[row], e[row], bits(r[row]), bits(e[row]));
                ok = false;
                break;
            }
            double ref = 0.0, mag = 0.0;
            for (int c = 0; c < k; ++c) {
                const double p = (double) w[i][(size_t) row * k + c] * nx[c];
                ref += p;
                mag += std::fabs(p);
            }
            const double bound = (k + 8) * ulp * mag;
            if (!(std::fabs(r[row] - ref) <= bound)) {
                std::printf("FAIL %s: segment %d row %d: %.9g, the float64 reference %.9g +- %.3g\n", rc.name.c_str(),
                            i, row, r[row], ref, bound);
                ok = false;
                break;
            }
        }
    }
    if (ok && rc.normed) {
        const std::vector<float> e = download(normed_exact, k), r = download(normed_router, k);
        for (int c = 0; c < k; ++c) {
            // The scale: ~12 roundings of positive sums, the division, rsqrtf (2 ulps); then two
            // products: under 16 ulps in all, 32 allowed.
            if (bits(e[c]) != bits(r[c]) || !(std::fabs(r[c] - nx[c]) <= 32 * ulp * std::fabs(nx[c]))) {
                std::printf("FAIL %s: normed x[%d] = %.9g, the exact kernel %.9g, the float64 reference %.9g\n",
                            rc.name.c_str(), c, r[c], e[c], nx[c]);
                ok = false;
                break;
            }
        }
        if (ok && rc.image && !handoff_image_ok(r, normed_router, image, k, rng)) {
            std::printf("FAIL %s: the normed x's image\n", rc.name.c_str());
            ok = false;
        }
    }
    CHECK(cudaFree(d_x_src));
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_norm));
    for (int i = 0; i < n_seg; ++i) {
        CHECK(cudaFree(d_w[i]));
        CHECK(cudaFree(d_w_exact[i]));
        CHECK(cudaFree(out_exact[i]));
        CHECK(cudaFree(out_router[i]));
    }
    CHECK(cudaFree(normed_exact));
    CHECK(cudaFree(normed_router));
    CHECK(cudaFree(image));
    std::printf("%s %s\n", ok ? "ok  " : "FAIL", rc.name.c_str());
    return ok;
}

// Launches frt_router_f32 must refuse (and return cudaErrorInvalidValue for).
bool run_refusals() {
    float * buf = nullptr;
    CHECK(cudaMalloc(&buf, 8192 * sizeof(float)));
    const auto base = [&](int k) {
        frt_router_f32_args a{};
        a.x          = buf;
        a.norm       = buf;
        a.eps        = 1e-6f;
        a.k          = k;
        a.n_segments = 1;
        a.seg[0]     = { buf, 4, k, buf + 4096 };
        return a;
    };
    struct refusal {
        const char *        what;
        frt_router_f32_args args;
    };
    std::vector<refusal> refusals;
    refusals.push_back({ "k = 768 (under 1024)", base(768) });
    refusals.push_back({ "k = 1100 (not a multiple of 512)", base(1100) });
    refusals.push_back({ "k = 4608 (over 4096)", base(4608) });
    {
        frt_router_f32_args a = base(2048);
        a.x                   = buf + 1;
        refusals.push_back({ "x not 16-byte aligned", a });
    }
    {
        frt_router_f32_args a = base(2048);
        a.norm                = nullptr;
        refusals.push_back({ "no norm", a });
    }
    {
        frt_router_f32_args a = base(2048);
        a.x_q8                = buf + 1;
        refusals.push_back({ "the image not 16-byte aligned", a });
    }
    {
        frt_router_f32_args a = base(2048);
        a.n_segments          = 0;
        refusals.push_back({ "no segment", a });
    }
    {
        frt_router_f32_args a = base(2048);
        a.seg[0].row_stride   = 2044;
        refusals.push_back({ "rows shorter than k", a });
    }
    {
        frt_router_f32_args a = base(2048);
        a.seg[0].row_stride   = 2050;
        refusals.push_back({ "a row stride not a multiple of 4 floats", a });
    }
    bool ok = true;
    for (const refusal & r : refusals) {
        const char *      why = frt_router_f32_unsupported(r.args);
        const cudaError_t err = frt_router_f32(r.args, 0);
        if (why == nullptr || err != cudaErrorInvalidValue) {
            std::printf("FAIL refusal %s: %s\n", r.what, why == nullptr ? "accepted" : "launched anyway");
            ok = false;
        }
    }
    CHECK(cudaFree(buf));
    std::printf("%s refusals (%zu)\n", ok ? "ok  " : "FAIL", refusals.size());
    return ok;
}

}  // namespace

int main(int argc, char ** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    // The exact kernel is the reference here: never let it take the router kernel's path itself.
    setenv("GGML_FLASHRT_ROUTER_F32", "0", 1);
    const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
    std::printf("seed %" PRIu64 " (rerun with: test-router-f32 %" PRIu64 ")\n", seed, seed);
    std::mt19937_64 rng(seed);

    std::vector<router_case> cases;
    {
        router_case c{ "qwen36 router + shared gate, normed kept", 2048, { 256, 1 } };
        c.normed = true;
        cases.push_back(c);
        c.name   = "qwen36 router + shared gate, x written late";
        c.late_x = true;
        cases.push_back(c);
        c.name  = "qwen36 router + shared gate, x written late, the normed x's image";
        c.image = true;
        cases.push_back(c);
    }
    cases.push_back({ "k 4096, 128 + 1 rows", 4096, { 128, 1 } });
    {
        router_case c{ "k 1536 (last norm pass partial), padded rows, normed, the image", 1536, { 64 } };
        c.pad    = 4;
        c.normed = true;
        c.image  = true;
        cases.push_back(c);
    }
    {
        // The normed x's 32 groups of 128 values over 23 blocks: blocks 0-8 take a second group.
        router_case c{ "k 4096, 20 + 3 rows (fewer blocks than groups of the normed x), normed, the image", 4096,
                       { 20, 3 } };
        c.normed = true;
        c.image  = true;
        cases.push_back(c);
    }
    cases.push_back({ "k 1024, three segments", 1024, { 32, 3, 5 } });
    {
        router_case c{ "k 3072, padded rows", 3072, { 40, 2 } };
        c.pad = 12;
        cases.push_back(c);
    }
    int passed = 0, failed = 0;
    for (const router_case & c : cases) {
        (run_case(c, rng) ? passed : failed)++;
    }
    (run_refusals() ? passed : failed)++;
    std::printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
