#pragma once
// For the vendor tests of kernels that hand the next GEMV launch its input as an image
// (frt_gemv_args::x_q8, q8-x.cuh): whether an image holds the vector it was made from.

#include "gemv.cuh"
#include "q8-x.cuh"
#include "tests/test-device.cuh"
#include "tests/test-gemv-reference.cuh"

#include <cmath>
#include <cstring>
#include <random>

// The image at d_image of a vector x of k values (on the host as x, on the device at d_x): each
// 32-value block's values d * q within quantization of x (d/2 and half's rounding of d), its sums
// its values', and exact launches of 64 random Q4_K rows, plain and with the SwiGLU epilogue (a
// gate/up pair: the instance the experts' gate/up launch runs), giving the same bits from the
// image as from x.
static bool handoff_image_ok(const std::vector<float> & x, const float * d_x, const void * d_image, int k,
                             std::mt19937_64 & rng) {
    const std::vector<uint8_t> image = download((const uint8_t *) d_image, frt_x_q8_bytes(k));
    bool                       ok    = true;
    for (int b = 0; b < k / 32 && ok; ++b) {
        float    d;
        uint32_t sums;
        std::memcpy(&d, image.data() + k + 8 * b, 4);
        std::memcpy(&sums, image.data() + k + 8 * b + 4, 4);
        double amax     = 0.0;
        int    q_sum[2] = { 0, 0 };
        for (int j = 0; j < 32; ++j) {
            amax = std::fmax(amax, std::fabs(x[32 * b + j]));
            q_sum[j / 16] += (int8_t) image[32 * b + j];
        }
        for (int j = 0; j < 32; ++j) {
            ok &= std::fabs((double) d * (int8_t) image[32 * b + j] - x[32 * b + j]) <= 0.6 * amax / 127.0 + 1e-6 * amax;
        }
        ok &= (int16_t) (sums & 0xffff) == q_sum[0] && (int16_t) (sums >> 16) == q_sum[1];
    }
    const int            rows      = 64;
    const int64_t        row_bytes = gemv_ref::gguf_row_bytes(FRT_GEMV_Q4_K, k);
    std::vector<uint8_t> w(2 * rows * row_bytes);  // up rows, then gate rows
    for (int r = 0; r < 2 * rows; ++r) {
        gemv_ref::random_row(FRT_GEMV_Q4_K, k, w.data() + r * row_bytes, rng);
    }
    uint8_t * dw  = upload(w);
    float *   nan = upload(std::vector<float>(k, NAN));
    for (const bool swiglu : { false, true }) {
        float * y[2] = { upload_poisoned(rows), upload_poisoned(rows) };
        for (int handed = 0; handed < 2; ++handed) {
            frt_gemv_args a{};
            a.x = handed ? nan : d_x, a.x_stride = k, a.k = k, a.tokens = 1, a.x_per_token = 1;
            a.x_q8       = handed ? d_image : nullptr;
            a.n_segments = 1;
            frt_gemv_segment & s = a.seg[0];
            s.type = FRT_GEMV_Q4_K, s.w = dw, s.rows = rows, s.row_stride = row_bytes, s.out = y[handed];
            if (swiglu) {
                s.epilogue = FRT_GEMV_SWIGLU, s.w_gate = dw + rows * row_bytes;
            }
            if (const char * why = frt_gemv_unsupported(a, FRT_GEMV_KERNEL_EXACT)) {
                std::printf("FAIL the image's check launch (%s) refused: %s\n", swiglu ? "SwiGLU" : "plain", why);
                ok = false;
                continue;
            }
            CHECK(frt_gemv(a, 0, FRT_GEMV_KERNEL_EXACT));
        }
        CHECK(cudaDeviceSynchronize());
        const std::vector<float> plain = download(y[0], rows), handed = download(y[1], rows);
        ok &= std::isfinite(plain[0]) && std::memcmp(plain.data(), handed.data(), rows * sizeof(float)) == 0;
        CHECK(cudaFree(y[0]));
        CHECK(cudaFree(y[1]));
    }
    CHECK(cudaFree(dw));
    CHECK(cudaFree(nan));
    return ok;
}
