// Unit test of frt_gated_rms_norm_f32 against a float64 CPU reference, on fresh random inputs,
// with the output poisoned first. Needs a GPU:
//   nvcc -std=c++17 -arch=sm_90a -I vendor/csrc vendor/csrc/*.cu \
//        vendor/csrc/tests/test-gated-rms-norm.cu -o test-gated-rms-norm && ./test-gated-rms-norm

#include "gated-rms-norm.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "tests/test-device.cuh"

struct shape {
    int ncols, nrows, nchannels, nsamples;
    int pad;        // extra elements at the end of each input row (strided rows)
    bool in_place;  // out is x
};

static int run_case(const shape & s, std::mt19937 & rng) {
    const int64_t x_row = s.ncols + s.pad, x_channel = x_row * s.nrows, x_sample = x_channel * s.nchannels;
    const int64_t n_x = x_sample * s.nsamples;
    const int64_t o_row = s.in_place ? x_row : s.ncols;
    const int64_t o_channel = o_row * s.nrows, o_sample = o_channel * s.nchannels, n_o = s.in_place ? n_x : o_sample * s.nsamples;
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(n_x), z(n_x), w(s.ncols);
    for (float & v : x) v = dist(rng);
    for (float & v : z) v = dist(rng);
    for (float & v : w) v = dist(rng);
    const float eps = 1e-6f;

    float *dx, *dz, *dw, *dout;
    CHECK(cudaMalloc(&dx, n_x * sizeof(float)));
    CHECK(cudaMalloc(&dz, n_x * sizeof(float)));
    CHECK(cudaMalloc(&dw, s.ncols * sizeof(float)));
    CHECK(cudaMemcpy(dx, x.data(), n_x * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dz, z.data(), n_x * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dw, w.data(), s.ncols * sizeof(float), cudaMemcpyHostToDevice));
    if (s.in_place) {
        dout = dx;
    } else {
        CHECK(cudaMalloc(&dout, n_o * sizeof(float)));
        CHECK(cudaMemset(dout, 0xff, n_o * sizeof(float)));  // NaN poison: unwritten elements fail
    }

    frt_gated_rms_norm_args a;
    a.x = dx, a.w = dw, a.z = dz, a.out = dout;
    a.ncols = s.ncols, a.nrows = s.nrows, a.nchannels = s.nchannels, a.nsamples = s.nsamples;
    a.x_row = x_row, a.x_channel = x_channel, a.x_sample = x_sample;
    a.z_row = x_row, a.z_channel = x_channel, a.z_sample = x_sample;
    a.out_row = o_row, a.out_channel = o_channel, a.out_sample = o_sample;
    a.eps = eps;
    // The weight is copied before the launch: both ways of reading it are valid; exercise both.
    a.w_constant = !s.in_place;
    CHECK(frt_gated_rms_norm_f32(a, 0));
    CHECK(cudaDeviceSynchronize());
    std::vector<float> out(n_o);
    CHECK(cudaMemcpy(out.data(), dout, n_o * sizeof(float), cudaMemcpyDeviceToHost));

    double err2 = 0.0, ref2 = 0.0;
    bool finite = true;
    for (int smp = 0; smp < s.nsamples; ++smp) {
        for (int ch = 0; ch < s.nchannels; ++ch) {
            for (int r = 0; r < s.nrows; ++r) {
                const float * xr = x.data() + r * x_row + ch * x_channel + smp * x_sample;
                const float * zr = z.data() + r * x_row + ch * x_channel + smp * x_sample;
                const float * orow = out.data() + r * o_row + ch * o_channel + smp * o_sample;
                double sum = 0.0;
                for (int c = 0; c < s.ncols; ++c) sum += (double) xr[c] * xr[c];
                const double scale = 1.0 / std::sqrt(sum / s.ncols + eps);
                for (int c = 0; c < s.ncols; ++c) {
                    const double g = zr[c];
                    const double ref = xr[c] * scale * w[c] * (g / (1.0 + std::exp(-g)));
                    finite = finite && std::isfinite(orow[c]);
                    err2 += (orow[c] - ref) * (orow[c] - ref);
                    ref2 += ref * ref;
                }
            }
        }
    }
    const double rel = std::sqrt(err2 / ref2);
    const bool ok = finite && rel < 1e-5;
    std::printf("%-4s ncols=%5d rows=%3d channels=%3d samples=%d pad=%d in_place=%d  rel_err=%.2e\n", ok ? "ok" : "FAIL",
                s.ncols, s.nrows, s.nchannels, s.nsamples, s.pad, s.in_place, rel);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dz));
    CHECK(cudaFree(dw));
    if (!s.in_place) CHECK(cudaFree(dout));
    return ok ? 0 : 1;
}

int main() {
    std::mt19937 rng(std::random_device{}());
    const shape shapes[] = {
        { 128, 32, 1, 1, 0, false },  // qwen3.6 decode
        { 128, 32, 9, 1, 0, false },  // prefill
        { 128, 32, 1, 1, 0, true },
        { 96, 5, 3, 2, 7, false },
        { 33, 1, 1, 1, 0, false },
        { 2048, 3, 1, 1, 0, false },  // the 256-thread path
        { 4096, 2, 2, 1, 16, true },
        // The float4 path at each width it is built for, partial rows and blocks, aligned padding.
        { 256, 5, 2, 1, 4, false },
        { 384, 2, 1, 1, 0, false },
        { 1024, 3, 1, 1, 0, true },
        { 100, 7, 1, 1, 0, false },
    };
    int failed = 0;
    for (const shape & s : shapes) failed += run_case(s, rng);
    const int total = (int) (sizeof(shapes) / sizeof(shapes[0]));
    std::printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
