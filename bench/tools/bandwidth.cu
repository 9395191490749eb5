// Device memory bandwidth for the decode floor: read-only (a sum over 2 GiB) and copy (2 GiB
// device to device, bytes read + written). Median of 20 timed runs after warm-up, CUDA events.
// Prints one JSON line. Built and run by `cargo xtask bench`.

#include "cuda-check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

static __global__ void fill(float4 * p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        p[i] = make_float4(v, v, v, v);
    }
}

static __global__ void sum(const float4 * p, size_t n, double * out) {
    float acc = 0.0f;
    for (size_t i = blockIdx.x * (size_t) blockDim.x + threadIdx.x; i < n; i += (size_t) gridDim.x * blockDim.x) {
        const float4 v = p[i];
        acc += (v.x + v.y) + (v.z + v.w);
    }
    for (int o = 16; o > 0; o >>= 1) {
        acc += __shfl_xor_sync(0xffffffff, acc, o);
    }
    if (threadIdx.x % 32 == 0) {
        atomicAdd(out, (double) acc);
    }
}

template <typename F> static float median_ms(F run) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; ++i) run();
    std::vector<float> ms;
    for (int i = 0; i < 20; ++i) {
        CHECK(cudaEventRecord(a));
        run();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main() {
    const size_t bytes = size_t(2) << 30, n4 = bytes / sizeof(float4);
    float4 *src, *dst;
    double * acc;
    CHECK(cudaMalloc(&src, bytes));
    CHECK(cudaMalloc(&dst, bytes));
    CHECK(cudaMalloc(&acc, sizeof(double)));
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    fill<<<sms * 8, 256>>>(src, n4, 1.0f);
    CHECK(cudaGetLastError());

    const float read_ms = median_ms([&] {
        CHECK(cudaMemsetAsync(acc, 0, sizeof(double)));
        sum<<<sms * 8, 512>>>(src, n4, acc);
    });
    double total = 0.0;
    CHECK(cudaMemcpy(&total, acc, sizeof(double), cudaMemcpyDeviceToHost));
    const double expected = double(n4) * 4.0;
    if (total < expected * 0.999 || total > expected * 1.001) {
        std::fprintf(stderr, "sum check failed: %f, expected %f\n", total, expected);
        return 1;
    }
    const float copy_ms = median_ms([&] { CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); });

    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("{\"gpu\": \"%s\", \"read_tbps\": %.4f, \"copy_tbps\": %.4f}\n", prop.name, bytes / (read_ms * 1e-3) / 1e12,
                2.0 * bytes / (copy_ms * 1e-3) / 1e12);
    return 0;
}
