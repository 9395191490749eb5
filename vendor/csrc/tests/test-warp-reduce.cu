// Unit test of frt_warp_sum_rows (vendor/csrc/warp-reduce.cuh): for R = 1..32 rows a warp, every
// row's sum the same bits as the xor butterfly's (test-gemv's host emulation of its tree,
// gemv_ref::butterfly32, and frt_warp_sum on the device), on fresh random rows whose values span
// 40 binary orders of magnitude (so that another order of the additions gives other bits: the test
// counts the rows where a left-to-right sum differs, and a fixed row where it must), plus rows of
// -0, infinities and NaN; every output written (poisoned first). The seed is printed; `test-warp-reduce SEED` reruns it. Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/tests/test-warp-reduce.cu -o test-warp-reduce \
//        && ./test-warp-reduce

#include "warp-reduce.cuh"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/test-device.cuh"
#include "tests/test-gemv-reference.cuh"

namespace {

constexpr int kWarps = 64;  // a block of 2 warps, 32 blocks

// Warp w takes rows [w * R, w * R + R): scattered sums to `scatter`, the butterfly's to `butterfly`.
template <int R> __global__ void sum_rows_kernel(const float * in, float * scatter, float * butterfly) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
    float     v[R];
    for (int r = 0; r < R; ++r) {
        v[r] = in[(warp * R + r) * 32 + lane];
    }
    const float s = frt_warp_sum_rows<R>(v);
    if (lane % (32 / R) == 0) {
        scatter[warp * R + lane / (32 / R)] = s;
    }
    for (int r = 0; r < R; ++r) {
        const float b = frt_warp_sum(in[(warp * R + r) * 32 + lane]);
        if (lane == 0) {
            butterfly[warp * R + r] = b;
        }
    }
}

// The butterfly's tree on the host (gemv_ref::butterfly32 adds in place; every lane ends with it).
float butterfly_host(const float * row) {
    float lanes[32];
    std::memcpy(lanes, row, sizeof(lanes));
    gemv_ref::butterfly32(lanes);
    return lanes[0];
}

bool same_bits(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) {
        return std::isnan(a) && std::isnan(b);
    }
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
}

template <int R> bool run(std::mt19937_64 & rng) {
    const int                  rows = kWarps * R;
    std::vector<float>         in((size_t) rows * 32);
    std::normal_distribution<float> value(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20);
    for (float & v : in) {
        v = std::ldexp(value(rng), exponent(rng));
    }
    // Fixed rows: one whose left-to-right sum is 1 and whose tree sum is 0 (2^24 + 1 rounds to
    // 2^24 at offset 16), one of -0 (stays -0), one with +inf and -inf (NaN), one with +inf only.
    std::fill(in.begin(), in.begin() + 4 * 32, 0.0f);  // rows >= 64
    in[0]  = 16777216.0f;
    in[1]  = -16777216.0f;
    in[16] = 1.0f;
    for (int l = 0; l < 32; ++l) {
        in[32 + l] = -0.0f;
    }
    in[64 + 3]  = std::numeric_limits<float>::infinity();
    in[64 + 30] = -std::numeric_limits<float>::infinity();
    in[96 + 7]  = std::numeric_limits<float>::infinity();
    float * d_in        = upload(in);
    float * d_scatter   = upload_poisoned(rows);
    float * d_butterfly = upload_poisoned(rows);
    sum_rows_kernel<R><<<kWarps / 2, 64>>>(d_in, d_scatter, d_butterfly);
    CHECK(cudaGetLastError());
    const std::vector<float> scatter = download(d_scatter, rows), butterfly = download(d_butterfly, rows);
    int  wrong = 0, order_sensitive = 0;
    for (int r = 0; r < rows; ++r) {
        const float host = butterfly_host(&in[(size_t) r * 32]);
        float       left = 0.0f;
        for (int l = 0; l < 32; ++l) {
            left += in[(size_t) r * 32 + l];
        }
        order_sensitive += !same_bits(left, host);
        if (!same_bits(scatter[r], host) || !same_bits(butterfly[r], host)) {
            if (wrong++ < 4) {
                std::printf("  R=%d row %d: scatter %a, butterfly %a, host tree %a\n", R, r, scatter[r], butterfly[r],
                            host);
            }
        }
    }
    const bool ok = wrong == 0 && order_sensitive > 0;  // the first row alone makes it > 0
    std::printf("%s R=%2d: %d rows, %d not the butterfly's bits, %d whose left-to-right sum differs\n",
                ok ? "ok  " : "FAIL", R, rows, wrong, order_sensitive);
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_scatter));
    CHECK(cudaFree(d_butterfly));
    return ok;
}

}  // namespace

int main(int argc, char ** argv) {
    const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : std::random_device{}();
    std::printf("test-warp-reduce: seed %" PRIu64 "\n", seed);
    std::mt19937_64 rng(seed);
    int             failed = 0;
    failed += !run<1>(rng);
    failed += !run<2>(rng);
    failed += !run<4>(rng);
    failed += !run<8>(rng);
    failed += !run<16>(rng);
    failed += !run<32>(rng);
    std::printf("%s: %d of 6 failed\n", failed ? "FAIL" : "PASS", failed);
    return failed ? 1 : 0;
}
